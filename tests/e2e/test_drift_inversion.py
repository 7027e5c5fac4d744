"""A taste inversion through a real ``driftline serve`` at about 4,000 events/s.

Default detector and heartbeats; the stream is the synthetic one of ``driftline bench
drift`` with 30 % of its users inverting their taste. The service must alert after the
onset and within 5,000 events of it (none before), start a drift job that succeeds,
serve its version, and beat the never-retrained model after the onset, with refresh
retrains on (the default) and off (``REFRESH_EVENTS=none``, retraining on drift only).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from benchmarks.scenarios import plant, synthetic_stream

pytestmark = pytest.mark.slow

EVENTS = 40_000
ONSET_AT = 0.6
BATCH = 500
RATE = 4_000  # events per second


def _paced_replay(client: httpx.Client, events: list[dict]) -> None:
    began = time.monotonic()
    for start in range(0, len(events), BATCH):
        response = client.post("/ingest", json={"events": events[start : start + BATCH]})
        assert response.status_code == 200, response.text
        due = began + (start + BATCH) / RATE
        time.sleep(max(0.0, due - time.monotonic()))


def _wait_for_drift_version(client: httpx.Client) -> dict:
    """The succeeded drift job, once serving has followed the registry to its version."""
    for _ in range(600):
        jobs = client.get("/jobs").json()["jobs"]
        done = [j for j in jobs if j["trigger"] == "drift" and j["status"] == "succeeded"]
        running = client.get("/healthz").json()["retrain_job_running"]
        if done and running is None:
            models = client.get("/models").json()
            live = [v["version"] for v in models["versions"] if v["deleted_at"] is None]
            if models["current"] == live[0]:
                return done[-1]
        time.sleep(0.1)
    raise AssertionError("no drift job succeeded and served within 60 s of the replay")


def _rmse_after(beats: list[dict], key: str, after: int) -> float:
    chosen = [b for b in beats if b["events_seen"] - b["events"] >= after]
    return math.sqrt(
        sum(b[key] ** 2 * b["events"] for b in chosen) / sum(b["events"] for b in chosen)
    )


@pytest.mark.parametrize("refresh", ["10000", "none"])
def test_an_inversion_is_alerted_retrained_and_served(tmp_path: Path, refresh: str) -> None:
    planted = plant("sudden", synthetic_stream(n_events=EVENTS, seed=11), at=ONSET_AT)
    onset = planted.onset
    assert onset is not None
    events = planted.stream.events()
    env = {"DRIFTLINE_REFRESH_EVENTS": refresh}
    with (
        ServerProcess(tmp_path / "data", env=env) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        _paced_replay(client, events)
        job = _wait_for_drift_version(client)
        alerts = sorted(
            client.get("/drift/alerts").json()["alerts"], key=lambda a: a["events_seen"]
        )
        beats = client.get("/drift/heartbeats").json()["heartbeats"]
        models = client.get("/models").json()

    assert alerts, "no drift alert"
    assert all(a["events_seen"] > onset for a in alerts), alerts
    assert alerts[0]["events_seen"] <= onset + 5_000, alerts[0]
    assert job["model_version"] is not None
    assert any(v["version"] == job["model_version"] for v in models["versions"])
    after = onset + 5_000  # once the drift job had time to land
    assert _rmse_after(beats, "rmse", after) < _rmse_after(beats, "static_rmse", after)
