"""The dashboard signs in with a key: an HttpOnly, SameSite=Strict session, CSRF tokens."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth.keys import create_key, revoke
from service.auth.sessions import COOKIE
from service.settings import Settings
from service.store import Database


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], Database]]:
    settings = Settings(data_dir=tmp_path / "data", key_refresh_seconds=0.1)
    db = Database(settings.resolved_database_url)
    tokens = {scope: create_key(db, scope, [scope]).token for scope in ("read", "ingest", "admin")}
    with TestClient(create_app(settings), follow_redirects=False) as client:
        yield client, tokens, db
    db.dispose()


def _sign_in(client: TestClient, key: str) -> str:
    answer = client.post("/dashboard/sign-in", data={"key": key})
    assert answer.status_code == 303, answer.text
    return answer.headers["set-cookie"]


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert match, page
    return match.group(1)


def test_without_a_session_the_dashboard_is_its_sign_in_page(keyed: tuple) -> None:
    client, _, _ = keyed
    page = client.get("/dashboard")
    assert page.status_code == 401
    assert page.headers["content-type"].startswith("text/html")
    assert 'action="/dashboard/sign-in"' in page.text
    assert "content-security-policy" in page.headers


def test_signing_in_sets_an_httponly_samesite_strict_cookie_not_the_key(keyed: tuple) -> None:
    client, tokens, _ = keyed
    cookie = _sign_in(client, tokens["read"])
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    secret = tokens["read"].split("_", 2)[2]  # dlk_<id>_<secret>; the secret may hold "_"
    assert tokens["read"] not in cookie and secret not in cookie
    page = client.get("/dashboard")
    assert page.status_code == 200
    assert "Signed in as <b>read</b>" in page.text
    # The session reads the dashboard's data too, as the key would.
    assert client.get("/drift/heartbeats").status_code == 200


@pytest.mark.parametrize("key", ["ingest", "wrong"])
def test_a_key_without_read_or_a_wrong_one_does_not_sign_in(keyed: tuple, key: str) -> None:
    client, tokens, _ = keyed
    answer = client.post("/dashboard/sign-in", data={"key": tokens.get(key, "dlk_0_x")})
    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers
    assert "wrong, revoked, or lacks the read scope" in answer.text


def test_state_changing_actions_need_the_sessions_csrf_token(keyed: tuple) -> None:
    client, tokens, _ = keyed
    _sign_in(client, tokens["read"])
    token = _csrf(client.get("/dashboard").text)
    forged = client.post("/dashboard/sign-out", data={})
    assert forged.status_code == 403
    assert "CSRF" in forged.json()["detail"]
    wrong = client.post("/dashboard/sign-out", data={"csrf_token": "0" * 64})
    assert wrong.status_code == 403
    assert client.get("/dashboard").status_code == 200  # still signed in
    done = client.post("/dashboard/sign-out", data={"csrf_token": token})
    assert done.status_code == 303
    assert f'{COOKIE}=""' in done.headers["set-cookie"]
    assert client.get("/dashboard").status_code == 401


def test_an_admin_session_changes_state_only_with_the_token_in_a_header(keyed: tuple) -> None:
    client, tokens, _ = keyed
    _sign_in(client, tokens["admin"])
    token = _csrf(client.get("/dashboard").text)
    assert client.post("/retrain").status_code == 403  # a forged request, no token
    body = {"events": [{"user_id": "u", "item_id": "i"}]}
    assert client.post("/ingest", json=body).status_code == 403
    assert client.post("/retrain", headers={"X-CSRF-Token": token}).status_code == 409
    # A key in the Authorization header needs no token: browsers never send one unasked.
    bearer = {"Authorization": f"Bearer {tokens['admin']}"}
    assert client.post("/retrain", headers=bearer).status_code == 409
    assert client.post("/ingest", json=body, headers={"X-CSRF-Token": token}).status_code == 200


def test_revoking_the_key_ends_its_sessions(keyed: tuple) -> None:
    client, tokens, db = keyed
    _sign_in(client, tokens["read"])
    assert client.get("/dashboard").status_code == 200
    revoke(db, "read")
    client.app.state.access.ring.refresh()  # type: ignore[attr-defined]
    assert client.get("/dashboard").status_code == 401


def test_a_tampered_or_expired_session_is_refused(keyed: tuple) -> None:
    client, tokens, _ = keyed
    cookie = _sign_in(client, tokens["read"]).split(";")[0].split("=", 1)[1].strip('"')
    key_id, expires, mac = cookie.split(".")
    for forged in (f"{key_id}.{int(expires) + 3600}.{mac}", f"{key_id}.1.{mac}", "x.y.z", "a.b"):
        client.cookies.clear()
        client.cookies.set(COOKIE, forged)
        assert client.get("/dashboard").status_code == 401, forged
