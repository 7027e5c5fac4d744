"""API keys and scopes: every route × every kind of caller, revocation, the key store.

Runs on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` is set, on PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.app import create_app
from service.auth.keys import create_key, revoke
from service.settings import Settings
from service.store import Database
from service.store.tables import api_keys

#: (method, path, request arguments, right needed); None: open.
ROUTES: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("POST", "/ingest", {"json": {"events": [{"user_id": "u", "item_id": "i"}]}}, "ingest"),
    ("GET", "/recommend", {"params": {"user_id": "u"}}, "read"),
    ("GET", "/models", {}, "read"),
    ("GET", "/jobs", {}, "read"),
    ("GET", "/jobs/1", {}, "read"),
    ("GET", "/drift/alerts", {}, "read"),
    ("GET", "/drift/alerts/1", {}, "read"),
    ("GET", "/drift/heartbeats", {}, "read"),
    ("GET", "/dashboard", {}, "read"),
    ("POST", "/retrain", {}, "admin"),
    ("POST", "/models/v0001/rollback", {}, "admin"),
    ("GET", "/keys", {}, "admin"),
    ("POST", "/keys", {"json": {"name": "made", "scopes": ["read"]}}, "admin"),
    ("DELETE", "/keys/nobody", {}, "admin"),
    ("GET", "/healthz", {}, None),
    ("GET", "/metrics", {}, None),
]

#: What each scope is granted.
GRANTS = {"ingest": {"ingest"}, "read": {"read"}, "admin": {"admin", "read", "ingest"}}


@pytest.fixture
def keyed(settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """An app with one key per scope (created before it starts, as an operator would)."""
    db = Database(settings.resolved_database_url)
    tokens = {scope: create_key(db, f"{scope}-key", [scope]).token for scope in GRANTS}
    db.dispose()
    with TestClient(create_app(settings)) as client:
        yield client, tokens


def _call(client: TestClient, method: str, path: str, headers: dict[str, str], **kw: Any) -> Any:
    return client.request(method, path, headers=headers, **kw)


@pytest.mark.parametrize("caller", ["none", "wrong", "malformed", *GRANTS])
def test_every_route_answers_each_caller_as_its_scope_says(
    keyed: tuple[TestClient, dict[str, str]], caller: str
) -> None:
    client, tokens = keyed
    anonymous = {
        "none": {},
        "wrong": {"Authorization": "Bearer dlk_000000000000_not-the-secret"},
        "malformed": {"Authorization": "Basic dXNlcjpwYXNz"},
    }
    headers = anonymous.get(caller, {"Authorization": f"Bearer {tokens.get(caller)}"})
    for method, path, kwargs, right in ROUTES:
        answer = _call(client, method, path, headers, **kwargs)
        where = f"{caller}: {method} {path} -> {answer.status_code} {answer.text[:200]}"
        if right is None:
            assert answer.status_code == 200, where
        elif caller in ("none", "wrong", "malformed"):
            assert answer.status_code == 401, where
            assert answer.headers["www-authenticate"].startswith('Bearer realm="driftline"'), where
        elif right in GRANTS[caller]:
            assert answer.status_code not in (401, 403), where
            assert answer.status_code < 500, where
        else:
            assert answer.status_code == 403, where
            assert f'scope="{right}"' in answer.headers["www-authenticate"], where


def test_a_wrong_key_is_told_apart_from_a_missing_one(
    keyed: tuple[TestClient, dict[str, str]],
) -> None:
    client, tokens = keyed
    missing = client.get("/models")
    assert "error" not in missing.headers["www-authenticate"]
    assert "Bearer" in missing.json()["detail"]
    tampered = tokens["read"][:-2] + ("AA" if not tokens["read"].endswith("AA") else "BB")
    wrong = client.get("/models", headers={"Authorization": f"Bearer {tampered}"})
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


def test_without_any_key_the_service_is_open(client: TestClient) -> None:
    assert client.post("/retrain").status_code == 409  # nothing to train, but allowed
    assert client.get("/keys").json() == {"keys": []}


def test_revoking_a_key_elsewhere_takes_effect_without_a_restart(
    tmp_path: Path, database_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", database_url=database_url, key_refresh_seconds=0.1
    )
    db = Database(settings.resolved_database_url)
    token = create_key(db, "ops", ["read"]).token
    with TestClient(create_app(settings)) as client:
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/models", headers=auth).status_code == 200
        assert revoke(db, "ops")  # as `driftline keys revoke ops` does, in another process
        deadline = time.monotonic() + 5
        while client.get("/models", headers=auth).status_code == 200:
            assert time.monotonic() < deadline, "the revoked key still works"
            time.sleep(0.05)
        assert client.get("/models", headers=auth).status_code == 401
        # Every key revoked: the service stays closed rather than falling open.
        assert client.get("/models").status_code == 401
    db.dispose()


def test_keys_are_managed_over_http_by_admins(keyed: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = keyed
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    made = client.post("/keys", json={"name": "feeder", "scopes": ["ingest"]}, headers=admin)
    assert made.status_code == 201, made.text
    feeder = {"Authorization": f"Bearer {made.json()['key']}"}
    assert client.post("/ingest", json={"events": []}, headers=feeder).status_code == 200
    assert client.get("/models", headers=feeder).status_code == 403
    again = client.post("/keys", json={"name": "feeder", "scopes": ["read"]}, headers=admin)
    assert again.status_code == 409
    listed = client.get("/keys", headers=admin).json()["keys"]
    assert {k["name"] for k in listed} == {"ingest-key", "read-key", "admin-key", "feeder"}
    assert all("hash" not in str(k) and "key" not in k for k in listed)
    assert client.delete("/keys/feeder", headers=admin).json() == {
        "name": "feeder",
        "revoked": True,
    }
    assert client.post("/ingest", json={"events": []}, headers=feeder).status_code == 401
    bad = client.post("/keys", json={"name": "x", "scopes": ["root"]}, headers=admin)
    assert bad.status_code == 422


def test_only_a_hash_of_each_key_is_stored_and_last_use_is_recorded(
    keyed: tuple[TestClient, dict[str, str]],
) -> None:
    client, tokens = keyed
    token = tokens["read"]
    assert client.get("/models", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    client.app.state.access.ring.refresh()  # type: ignore[attr-defined]
    db = client.app.state.driftline.db  # type: ignore[attr-defined]
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(api_keys))]
    secret = token.split("_", 2)[2]
    assert all(secret not in str(row.values()) for row in rows)
    used = {row["name"]: row["last_used_at"] for row in rows}
    assert used["read-key"] is not None
    assert used["ingest-key"] is None


def test_public_paths_are_a_setting(tmp_path: Path, database_url: str) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, public_paths="none")
    db = Database(settings.resolved_database_url)
    token = create_key(db, "watcher", ["read"]).token
    db.dispose()
    with TestClient(create_app(settings)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/healthz").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/metrics", headers=auth).status_code == 200


def test_the_schema_documents_the_bearer_scheme_and_refusals(
    keyed: tuple[TestClient, dict[str, str]],
) -> None:
    client, _ = keyed
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    retrain = schema["paths"]["/retrain"]["post"]
    assert retrain["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(retrain["responses"])
    assert "'admin'" in retrain["responses"]["403"]["description"]
    assert "security" not in schema["paths"]["/healthz"]["get"]
    dashboard = schema["paths"]["/dashboard"]["get"]["responses"]["401"]
    assert "text/html" in dashboard["content"]
