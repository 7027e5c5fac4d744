"""Request hardening: trusted Host names, security headers, CORS only when configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def _client(tmp_path: Path, **values: object) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path / "data", **values)))


@pytest.fixture
def loopback_only(tmp_path: Path) -> Iterator[TestClient]:
    """The default TRUSTED_HOSTS (the loopback names), as ``driftline serve`` has it."""
    with _client(tmp_path, trusted_hosts=Settings.model_fields["trusted_hosts"].default) as c:
        yield c


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost", "[::1]:8000", "LOCALHOST:1"])
def test_loopback_names_are_trusted_by_default(loopback_only: TestClient, host: str) -> None:
    assert loopback_only.get("/healthz", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", ""])
def test_other_host_names_are_refused_before_any_route(
    loopback_only: TestClient, host: str
) -> None:
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends its own name."""
    for method, path in (("GET", "/models"), ("POST", "/ingest"), ("GET", "/healthz")):
        answer = loopback_only.request(method, path, headers={"Host": host})
        assert answer.status_code == 400, (host, path)
        assert "Host header" in answer.json()["detail"]
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_trusted_hosts_is_a_setting(tmp_path: Path) -> None:
    with _client(tmp_path, trusted_hosts="driftline.internal, 10.0.0.5") as client:
        assert client.get("/healthz", headers={"Host": "driftline.internal"}).status_code == 200
        assert client.get("/healthz", headers={"Host": "10.0.0.5:8000"}).status_code == 200
        assert client.get("/healthz", headers={"Host": "127.0.0.1"}).status_code == 400
    with _client(tmp_path, trusted_hosts="*") as anything:
        assert anything.get("/healthz", headers={"Host": "whatever"}).status_code == 200


def test_every_answer_carries_the_security_headers(client: TestClient) -> None:
    for answer in (client.get("/healthz"), client.get("/jobs/0"), client.get("/dashboard")):
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" not in client.get("/healthz").headers
    policy = client.get("/dashboard").headers["content-security-policy"]
    assert "default-src 'none'" in policy
    # Scripts and styles only from the service's own files: nothing inline, no CDN.
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert "frame-ancestors 'none'" in policy


def test_cors_is_off_unless_origins_are_configured(client: TestClient, tmp_path: Path) -> None:
    origin = {"Origin": "https://evil.example"}
    assert "access-control-allow-origin" not in client.get("/models", headers=origin).headers
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in client.options("/ingest", headers=preflight).headers
    with _client(tmp_path, cors_origins="https://ops.example") as configured:
        allowed = {"Origin": "https://ops.example", "Access-Control-Request-Method": "POST"}
        answer = configured.options("/ingest", headers=allowed)
        assert answer.headers["access-control-allow-origin"] == "https://ops.example"
        refused = configured.get("/models", headers=origin)
        assert "access-control-allow-origin" not in refused.headers


def test_ingest_refuses_what_a_web_page_can_post_without_a_preflight(client: TestClient) -> None:
    """A form or text/plain post needs no CORS preflight; /ingest answers it 415."""
    body = b'{"events": [{"user_id": "u", "item_id": "i", "rating": 5}]}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        answer = client.post("/ingest", content=body, headers={"content-type": kind})
        assert answer.status_code == 415, kind
    assert client.get("/healthz").json()["events_stored"] == 0
