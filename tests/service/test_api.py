"""The HTTP contract of docs/api.md, driven through the real ASGI app.

Every test runs on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` is set, on PostgreSQL
(the ``client`` fixture's ``database_url``).
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from service.app import create_app
from service.settings import Settings
from service.stream.writer import StoreFailed


def _event(i: int, **overrides: object) -> dict:
    event = {"event_id": f"e{i}", "user_id": f"u{i % 7}", "item_id": f"i{i % 11}", "rating": 4.0}
    event.update(overrides)
    return event


def _stored(client: TestClient) -> int:
    return client.get("/healthz").json()["labelled_events_seen"]


def test_ingest_stores_events_and_counts_duplicates(client: TestClient) -> None:
    batch = {"events": [_event(i) for i in range(20)]}
    assert client.post("/ingest", json=batch).json() == {
        "accepted": 20,
        "duplicates": 0,
        "position": 20,
    }
    # A repeat stores nothing: the log stands where it stood.
    assert client.post("/ingest", json=batch).json() == {
        "accepted": 0,
        "duplicates": 20,
        "position": 20,
    }
    assert _stored(client) == 20


def test_duplicate_ids_inside_one_batch_are_stored_once(client: TestClient) -> None:
    batch = {"events": [_event(1), _event(1), _event(2)]}
    assert _counts(client.post("/ingest", json=batch).json()) == (2, 1)


def test_events_without_ids_and_ratings_are_accepted(client: TestClient) -> None:
    batch = {"events": [{"user_id": "a", "item_id": "b"}, {"user_id": "a", "item_id": "c"}]}
    assert _counts(client.post("/ingest", json=batch).json()) == (2, 0)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"user_id": None}, "user_id"),
        ({"item_id": 17}, "item_id"),
        ({"user_id": "x" * 257}, "user_id"),
        ({"rating": 7.5}, "rating"),
        ({"rating": 0.0}, "rating"),
        ({"rating": "4"}, "rating"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_event_rejects_the_whole_batch_naming_index_and_field(
    client: TestClient, bad: dict, field: str
) -> None:
    batch = {"events": [_event(0), _event(1, **bad), _event(2)]}
    response = client.post("/ingest", json=batch)
    assert response.status_code == 422
    problems = response.json()["detail"]
    assert any(p["index"] == 1 and p["field"] == field for p in problems), problems
    assert _stored(client) == 0


def test_missing_user_id_is_named(client: TestClient) -> None:
    event = _event(0)
    del event["user_id"]
    response = client.post("/ingest", json={"events": [event]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "user_id"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_ratings_are_rejected(client: TestClient, literal: str) -> None:
    body = '{"events": [{"user_id": "u", "item_id": "i", "rating": ' + literal + "}]}"
    response = client.post("/ingest", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "rating"
    assert _stored(client) == 0


def test_body_that_is_not_json_is_a_400(client: TestClient) -> None:
    response = client.post(
        "/ingest", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["detail"]


def test_body_without_events_list_is_a_422(client: TestClient) -> None:
    assert client.post("/ingest", json={"events": {}}).status_code == 422
    assert client.post("/ingest", json=[1, 2]).status_code == 422


def test_oversized_batch_and_body_are_a_413(tmp_path: Path, database_url: str) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        max_batch_events=5,
        max_body_bytes=2048,
    )
    with TestClient(create_app(settings)) as small:
        too_many = small.post("/ingest", json={"events": [_event(i) for i in range(6)]})
        assert too_many.status_code == 413
        assert "limit of 5" in too_many.json()["detail"]
        padding = {"events": [_event(0, item_id="p" * 200) for _ in range(5)]}
        too_big = small.post(
            "/ingest",
            content=json.dumps(padding) + " " * 2048,
            headers={"content-type": "application/json"},
        )
        assert too_big.status_code == 413
        assert small.get("/healthz").json()["labelled_events_seen"] == 0


@pytest.mark.parametrize("k", [0, 1001, -3])
def test_recommend_rejects_k_out_of_range(client: TestClient, k: int) -> None:
    assert client.get("/recommend", params={"user_id": "u", "k": k}).status_code == 422


def test_unknown_user_gets_popular_items(client: TestClient) -> None:
    events = [_event(i, item_id="hit" if i % 2 else f"i{i}") for i in range(30)]
    client.post("/ingest", json={"events": events})
    answer = client.get("/recommend", params={"user_id": "stranger", "k": 3}).json()
    assert answer["source"] == "popular"
    assert answer["items"][0]["item_id"] == "hit"
    assert len(answer["items"]) == 3


def test_recommendations_exclude_items_the_user_rated(client: TestClient) -> None:
    events = [_event(i, item_id="hit" if i % 2 else f"i{i}") for i in range(30)]
    client.post("/ingest", json={"events": events})
    answer = client.get("/recommend", params={"user_id": "u1", "k": 50}).json()
    rated = {e["item_id"] for e in events if e["user_id"] == "u1"}
    assert rated and not rated & {item["item_id"] for item in answer["items"]}


@pytest.fixture
def static_client(settings: Settings) -> Iterator[TestClient]:
    """A service whose jobs run RETRAIN_WORKERS every epoch: for tests that count
    workers rather than test the configurator."""
    pinned = settings.model_copy(update={"retrain_configurator": "static"})
    with TestClient(create_app(pinned)) as test_client:
        yield test_client


def test_manual_retrain_publishes_a_version_that_serves(static_client: TestClient) -> None:
    client = static_client
    assert client.post("/retrain").status_code == 409  # nothing to train on yet
    events = [_event(i, rating=float(1 + (i * 7) % 5)) for i in range(150)]
    client.post("/ingest", json={"events": events})
    started = client.post("/retrain")
    assert started.status_code == 202
    job_id = started.json()["job_id"]
    client.app.state.driftline.retrainer.wait(timeout=60)
    job = client.get(f"/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job
    assert job["last_event_id"] == 150 and job["window_events"] == 150  # all it had
    assert (
        job["trigger"] == "manual"
        and job["epochs"]
        and len(job["loss_curve"]) == len(job["epochs"])
    )
    assert job["epochs"][0]["config"]["batch_size"] > 0
    # Epochs ran on workers (threads here), and the job shows them and their cost.
    assert job["runtime"] == "thread" and job["epochs"][0]["config"]["workers"] == 4
    assert job["invocations"] and all(i["billed_ms"] >= 1 for i in job["invocations"])
    assert {i["worker"] for i in job["invocations"]} == {0, 1, 2, 3}
    # Which updates went into which epoch, and with what share of their step.
    applied = [i for i in job["invocations"] if i["applied_in"] is not None]
    assert applied and all(i["applied_in"] >= i["epoch"] for i in applied)
    assert all(0 < i["weight"] <= 1 for i in applied)
    assert {i["applied_in"] for i in applied} == set(range(len(job["epochs"])))
    assert job["cost_usd"] == pytest.approx(
        sum(i["cost_usd"] for i in job["invocations"]), rel=0.05
    )
    models = _models_once_serving(client, job["model_version"])
    assert models["current"] == job["model_version"]
    assert len(models["versions"][0]["checksum"]) == 64
    answer = client.get("/recommend", params={"user_id": "u1", "k": 3}).json()
    assert answer["source"] == "model" and answer["model_version"] == job["model_version"]


@pytest.fixture
def gp_client(settings: Settings) -> Iterator[TestClient]:
    """A service whose jobs GP-OPT configures."""
    pinned = settings.model_copy(update={"retrain_configurator": "gp"})
    with TestClient(create_app(pinned)) as test_client:
        yield test_client


def test_a_job_shows_each_gp_opt_decision_with_its_predictions_and_outcome(
    gp_client: TestClient,
) -> None:
    """With GP-OPT each epoch of ``/jobs/{id}`` says what it weighed, what it predicted
    (with 90 % intervals) and what came of it."""
    client = gp_client
    events = [_event(i, rating=float(1 + (i * 7) % 5)) for i in range(150)]
    client.post("/ingest", json={"events": events})
    job_id = client.post("/retrain").json()["job_id"]
    client.app.state.driftline.retrainer.wait(timeout=60)
    job = client.get(f"/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["params"]["configurator"] == "gp", job
    for epoch in job["epochs"]:
        decision = epoch["config"]["decision"]
        assert decision["candidates"] >= decision["considered"] >= 1
        low, high = decision["latency_interval_s"]
        assert 0 < low <= decision["latency_s"] <= high
        low, high = decision["cost_interval_usd"]
        assert 0 <= low <= decision["cost_usd"] <= high
        assert decision["deadline_s"] > 0 and 0 <= decision["p_feasible"] <= 1
        assert decision["observed_latency_s"] == pytest.approx(epoch["duration_s"])
        assert decision["observed_cost_usd"] >= 0
        assert decision["reason"]
    assert 1 <= epoch["config"]["workers"] <= client.app.state.driftline.settings.retrain_workers


def test_unknown_job_is_a_404(client: TestClient) -> None:
    assert client.get("/jobs/999").status_code == 404


def test_ops_endpoints_answer(client: TestClient) -> None:
    client.post("/ingest", json={"events": [_event(i) for i in range(5)]})
    assert client.get("/healthz").json()["database"] == "ok"
    metrics = client.get("/metrics").text
    assert "driftline_events_ingested_total 5.0" in metrics
    assert client.get("/drift/alerts").json() == {"alerts": []}
    assert "<h1>Overview</h1>" in client.get("/dashboard").text


def _failing_store(error: Exception):  # type: ignore[no-untyped-def]
    """The writer's ``store_all`` when its transaction fails with ``error``."""

    def store_all(*_args: object, **_kwargs: object) -> None:
        raise StoreFailed("not stored") from error

    return store_all


def test_an_unreachable_database_is_a_503_that_names_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = OperationalError("INSERT INTO events", None, ConnectionRefusedError("refused"))
    monkeypatch.setattr(client.app.state.driftline.writer, "store_all", _failing_store(lost))
    response = client.post("/ingest", json={"events": [_event(0)]})
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert "database is unreachable" in detail and "not acknowledged" in detail
    assert response.headers["retry-after"] == "1"


def test_a_closed_connection_is_a_503_too(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = InterfaceError("SELECT 1", None, Exception("the connection is closed"))
    monkeypatch.setattr(client.app.state.driftline.writer, "store_all", _failing_store(closed))
    assert client.post("/ingest", json={"events": [_event(0)]}).status_code == 503


def test_a_database_error_that_is_not_an_outage_is_not_a_503(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    bug = IntegrityError("INSERT INTO events", None, Exception("NOT NULL constraint failed"))
    monkeypatch.setattr(client.app.state.driftline.writer, "store_all", _failing_store(bug))
    with pytest.raises(IntegrityError):  # the test client re-raises what became a 500
        client.post("/ingest", json={"events": [_event(0)]})


def _models_once_serving(client: TestClient, version: str, timeout: float = 15.0) -> dict:
    """``/models`` once the registry follower swapped ``version`` in (it does so on its
    own thread, right after the job announces the version)."""
    deadline = time.monotonic() + timeout
    models = client.get("/models").json()
    while models["current"] != version and time.monotonic() < deadline:
        time.sleep(0.05)
        models = client.get("/models").json()
    return models


def test_the_served_app_takes_its_start_up_objects_out_of_garbage_collection(
    settings: Settings,
) -> None:
    gc.unfreeze()
    try:
        with TestClient(create_app(settings)):
            assert gc.get_freeze_count() == 0  # tests build many apps: only serve freezes
        with TestClient(create_app(settings, freeze_startup=True)) as client:
            assert gc.get_freeze_count() > 0
            assert client.get("/healthz").status_code == 200
    finally:
        gc.unfreeze()


def _counts(result: dict) -> tuple[int, int]:
    return result["accepted"], result["duplicates"]
