"""Rolling back to an earlier model version: recorded, reversible, hot-swapped, admin-only.

Through the real app on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` is set, on
PostgreSQL. Versions are published straight into the registry (as a job does) so the
tests need no training run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from functions.mf import BiasedMF
from service.app import create_app
from service.auth.keys import create_key
from service.settings import Settings
from service.store import Database
from service.store.jobs import create_job
from service.store.versions import mark_deleted
from tests.support.synthetic import stationary_stream

EVENTS = stationary_stream(n_users=20, n_items=15, n_events=120, factors=2, seed=3)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Each version serves once published: these tests are about rollbacks by hand, not
    about the rollout guard (``tests/service/test_rollout_guard.py``)."""
    return settings.model_copy(update={"guard_enabled": False})


def _publish(client: TestClient, seed: int, job_id: int | None = None) -> str:
    """Publish a model fitted on the test stream and let the registry follower serve it."""
    model = BiasedMF(factors=2, seed=seed)
    model.fit(
        [e["user_id"] for e in EVENTS],
        [e["item_id"] for e in EVENTS],
        [e["rating"] for e in EVENTS],
        epochs=2,
        batch_size=32,
    )
    pipeline = client.app.state.driftline
    published = pipeline.registry.publish(model, last_event_id=1, job_id=job_id, rmse=0.9)
    assert pipeline.swapper.follow_registry()
    return str(published.version)


@pytest.fixture
def two(client: TestClient) -> tuple[TestClient, str, str]:
    """An app serving its second version, the first one published before it."""
    events = [dict(e, event_id=f"e{i}") for i, e in enumerate(EVENTS)]
    assert client.post("/ingest", json={"events": events}).status_code == 200
    first, second = _publish(client, 1), _publish(client, 2)
    assert client.get("/models").json()["current"] == second
    return client, first, second


def _serving(models: dict, version: str) -> list[dict]:
    (row,) = [row for row in models["versions"] if row["version"] == version]
    return list(row["serving"])


def test_rollback_serves_the_earlier_version_and_records_it(
    two: tuple[TestClient, str, str],
) -> None:
    client, first, second = two
    answer = client.post(f"/models/{first}/rollback")
    assert answer.status_code == 200, answer.text
    record = answer.json()
    assert (record["from_version"], record["to_version"]) == (second, first)
    assert record["actor"].startswith("address:") and record["rolled_back_at"] > 0
    models = client.get("/models").json()
    assert models["current"] == first
    assert models["rollbacks"] == [record]
    recommended = client.get("/recommend", params={"user_id": EVENTS[0]["user_id"]}).json()
    assert recommended["model_version"] == first
    # first served, then second from its publish until the rollback, then first again.
    first_served, second_served = _serving(models, first), _serving(models, second)
    assert [s["trigger"] for s in first_served] == ["publish", "rollback"]
    assert first_served[0]["ended_at"] == second_served[0]["started_at"]
    assert second_served[0]["ended_at"] == record["rolled_back_at"] == first_served[1]["started_at"]
    assert first_served[1]["ended_at"] is None
    assert "driftline_model_rollbacks_total 1.0" in client.get("/metrics").text


def test_rolling_back_to_the_version_served_before_undoes_a_rollback(
    two: tuple[TestClient, str, str],
) -> None:
    client, first, second = two
    assert client.post(f"/models/{first}/rollback").status_code == 200
    undone = client.post(f"/models/{second}/rollback")
    assert undone.status_code == 200
    assert (undone.json()["from_version"], undone.json()["to_version"]) == (first, second)
    models = client.get("/models").json()
    assert models["current"] == second and len(models["rollbacks"]) == 2
    assert [s["trigger"] for s in _serving(models, second)] == ["publish", "rollback"]


def test_the_registry_follower_keeps_a_rollback_until_a_newer_version_is_published(
    two: tuple[TestClient, str, str],
) -> None:
    client, first, _second = two
    client.post(f"/models/{first}/rollback")
    pipeline = client.app.state.driftline
    assert not pipeline.swapper.follow_registry()  # the newer version does not come back by itself
    assert client.get("/models").json()["current"] == first
    third = _publish(client, 3)
    assert client.get("/models").json()["current"] == third


class _CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *_: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


def test_a_look_at_the_registry_that_finds_nothing_new_leaves_the_lock_free(
    two: tuple[TestClient, str, str],
) -> None:
    """The trigger reads a held registry lock as a version on its way; a look every
    REGISTRY_POLL_SECONDS that held it would put off scheduled jobs for nothing."""
    client, first, _second = two
    pipeline = client.app.state.driftline
    lock = _CountingLock()
    pipeline.swapper.registry_lock = lock
    assert not pipeline.swapper.follow_registry()
    assert lock.taken == 0
    client.post(f"/models/{first}/rollback")
    assert lock.taken == 1  # the rollback's own swap
    assert not pipeline.swapper.follow_registry()  # serving the target already
    assert lock.taken == 1
    third = _publish(client, 3)  # a new target: the look takes the lock to swap
    assert lock.taken == 2 and client.get("/models").json()["current"] == third


def test_a_rollback_restarts_the_drift_monitor_as_a_new_regime(
    two: tuple[TestClient, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, first, _second = two
    pipeline = client.app.state.driftline
    with pipeline.db.begin() as conn:  # a scheduled job's version keeps the regime...
        job = create_job(conn, policy="periodic", trigger="refresh", runtime="thread", params={})
    scheduled = _publish(client, 4, job_id=job)
    calls: list[bool] = []
    monkeypatch.setattr(pipeline.monitor.detector, "on_swap", calls.append)
    client.post(f"/models/{first}/rollback")
    client.post(f"/models/{scheduled}/rollback")  # ...but not when rolled back to
    assert calls == [False, False]


def test_a_restarted_service_serves_the_version_rolled_back_to(
    two: tuple[TestClient, str, str], settings: Settings
) -> None:
    client, first, _second = two
    client.post(f"/models/{first}/rollback")
    with TestClient(create_app(settings)) as restarted:
        assert restarted.get("/models").json()["current"] == first


def test_unknown_versions_and_the_serving_one_are_refused_by_name(
    two: tuple[TestClient, str, str],
) -> None:
    client, _first, second = two
    missing = client.post("/models/v9999/rollback")
    assert missing.status_code == 404 and "v9999" in missing.json()["detail"]
    serving = client.post(f"/models/{second}/rollback")
    assert serving.status_code == 409 and "already serving" in serving.json()["detail"]
    assert client.post(f"/models/{'x' * 65}/rollback").status_code == 422
    assert client.get("/models").json()["rollbacks"] == []


def test_a_version_retention_deleted_cannot_serve_again(
    two: tuple[TestClient, str, str],
) -> None:
    client, first, second = two
    with client.app.state.driftline.db.begin() as conn:
        mark_deleted(conn, first)
    refused = client.post(f"/models/{first}/rollback")
    assert refused.status_code == 409 and "deleted" in refused.json()["detail"]
    assert client.get("/models").json()["current"] == second


@pytest.fixture
def keyed(settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """An app with a read key and an admin key."""
    db = Database(settings.resolved_database_url)
    tokens = {scope: create_key(db, f"{scope}-key", [scope]).token for scope in ("read", "admin")}
    db.dispose()
    with TestClient(create_app(settings)) as client:
        yield client, tokens


def test_only_an_admin_key_may_roll_back_once_keys_exist(
    keyed: tuple[TestClient, dict[str, str]],
) -> None:
    client, tokens = keyed
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    events = [dict(e, event_id=f"e{i}") for i, e in enumerate(EVENTS)]
    client.post("/ingest", json={"events": events}, headers=admin)
    first, _second = _publish(client, 1), _publish(client, 2)
    assert client.post(f"/models/{first}/rollback").status_code == 401
    read = {"Authorization": f"Bearer {tokens['read']}"}
    refused = client.post(f"/models/{first}/rollback", headers=read)
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    done = client.post(f"/models/{first}/rollback", headers=admin)
    assert done.status_code == 200 and done.json()["actor"] == "admin-key"
