"""The whole loop against a real ``driftline serve`` process on loopback.

A synthetic stream with a drift planted at a known event goes through ``POST /ingest``;
the service must alert after the drift (and not long before), retrain, serve the new
version once the rollout guard has compared it on the events after it, beat a
never-retrained model on the drifted segment, ignore a replayed batch, and still have
everything after a restart. It runs on SQLite and, when
``DRIFTLINE_TEST_DATABASE_URL`` is set, on PostgreSQL.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.support.serving import serves_newest_promoted
from tests.support.synthetic import planted_drift_stream

pytestmark = pytest.mark.slow

DRIFT_AT = 10_000
BATCH = 250
SERVER_ENV = {
    "DRIFTLINE_HEARTBEAT_EVENTS": "25",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "1000",
    "DRIFTLINE_REFRESH_EVENTS": "none",
    "DRIFTLINE_FACTORS": "8",
    "DRIFTLINE_MAX_EPOCHS": "15",
    # GP-OPT (the default) takes the cheapest config that meets the deadline, so a
    # job stretches towards it: a short one keeps jobs within the waits here.
    "DRIFTLINE_LATENCY_CAP_SECONDS": "20",
}


def _segment_rmse(beats: list[dict], key: str, after: int) -> float:
    chosen = [b for b in beats if b["events_seen"] - b["events"] >= after]
    squared = sum(b[key] ** 2 * b["events"] for b in chosen)
    return math.sqrt(squared / sum(b["events"] for b in chosen))


def _wait_idle(client: httpx.Client) -> None:
    """No job running, and the newest version that may serve serving: a job is recorded
    succeeded first, and serving then follows the registry to its version (a version
    the rollout guard holds, or still runs in shadow, may not serve)."""
    for _ in range(600):
        idle = client.get("/healthz").json()["retrain_job_running"] is None
        if idle and serves_newest_promoted(client.get("/models").json()):
            return
        time.sleep(0.1)
    raise AssertionError("retraining job still running, or its version not served, after 60 s")


def _wait_for_drift_version(client: httpx.Client) -> None:
    """A drift job has published its version (which the rollout guard then runs in
    shadow on the events that follow)."""
    for _ in range(600):
        jobs = client.get("/jobs").json()["jobs"]
        if any(j["trigger"] == "drift" and j["status"] == "succeeded" for j in jobs):
            return
        time.sleep(0.1)
    raise AssertionError("no drift job published within 60 s of the drift")


def _replay(client: httpx.Client, events: list[dict]) -> None:
    for start in range(0, len(events), BATCH):
        response = client.post("/ingest", json={"events": events[start : start + BATCH]})
        assert response.status_code == 200, response.text
        if start == 1_000:
            _wait_idle(client)  # the bootstrap model must serve before the drift arrives
        if start == DRIFT_AT + 2_000:
            # The drift job's version serves once the guard has compared it with the
            # serving one on live events: the rest of the stream is those events.
            _wait_for_drift_version(client)


def _snapshot(client: httpx.Client) -> dict:
    return {
        "events": client.get("/healthz").json()["events_stored"],
        "alerts": client.get("/drift/alerts").json()["alerts"],
        "models": client.get("/models").json(),
    }


def test_drift_is_detected_retrained_served_and_survives_restart(
    tmp_path: Path, database_url: str
) -> None:
    events = planted_drift_stream(n_events=20_000, drift_at=DRIFT_AT, seed=3)
    env = {**SERVER_ENV, "DRIFTLINE_DATABASE_URL": database_url}
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            _replay(client, events)
            _wait_idle(client)

            alerts = client.get("/drift/alerts").json()["alerts"]
            assert any(a["events_seen"] > DRIFT_AT for a in alerts), alerts
            assert not [a for a in alerts if a["events_seen"] < 0.8 * DRIFT_AT], alerts
            drift_jobs = [j for j in client.get("/jobs").json()["jobs"] if j["trigger"] == "drift"]
            assert any(j["status"] == "succeeded" for j in drift_jobs), drift_jobs
            assert all(a["retrain_job_id"] for a in alerts if a["events_seen"] > DRIFT_AT)

            models = client.get("/models").json()
            assert len(models["versions"]) >= 2
            served = client.get("/recommend", params={"user_id": "u1", "k": 5}).json()
            assert served["model_version"] == models["current"] != "v0001"
            assert len(served["items"]) == 5

            beats = client.get("/drift/heartbeats").json()["heartbeats"]
            after = _segment_rmse(beats, "rmse", DRIFT_AT)
            static_after = _segment_rmse(beats, "static_rmse", DRIFT_AT)
            assert after < static_after, (after, static_after)

            before = _snapshot(client)
            repeat = client.post("/ingest", json={"events": events[:BATCH]}).json()
            assert (repeat["accepted"], repeat["duplicates"]) == (0, BATCH)
            assert client.get("/healthz").json()["events_stored"] == len(events)
    finally:
        server.stop()
    if not database_url.startswith("sqlite"):
        assert not (tmp_path / "data" / "driftline.db").exists()  # it really ran elsewhere

    restarted = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=restarted.url, timeout=60) as client:
            assert _snapshot(client) == before
            again = client.get("/recommend", params={"user_id": "u1", "k": 5}).json()
            assert again["model_version"] == before["models"]["current"]
    finally:
        restarted.stop()
