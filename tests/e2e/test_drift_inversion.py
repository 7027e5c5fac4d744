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
from benchmarks.scenarios import PlantedDrift, plant, synthetic_stream
from tests.support.serving import serves_newest_promoted

pytestmark = pytest.mark.slow

EVENTS = 40_000
ONSET_AT = 0.6
BATCH = 500
RATE = 4_000  # events per second


def _paced_replay(client: httpx.Client, events: list[dict], warm_up: int = 2_000) -> None:
    """Post ``events`` at ``RATE``; after the first ``warm_up`` of them, wait until the
    bootstrap model serves (a drift is only a drift of a model that exists)."""
    began = time.monotonic()
    for start in range(0, len(events), BATCH):
        response = client.post("/ingest", json={"events": events[start : start + BATCH]})
        assert response.status_code == 200, response.text
        if start + BATCH == warm_up:
            _wait_for_a_model(client)
            began = time.monotonic() - (start + BATCH) / RATE
        due = began + (start + BATCH) / RATE
        time.sleep(max(0.0, due - time.monotonic()))


def _wait_for_a_model(client: httpx.Client) -> None:
    for _ in range(1_200):
        if client.get("/models").json()["current"] is not None:
            return
        time.sleep(0.1)
    raise AssertionError("the bootstrap model did not serve within 120 s")


def _wait_for_alert_version(client: httpx.Client) -> dict:
    """The job that answered the first alert, once it succeeded and serving followed the
    registry (to its version, unless the rollout guard runs that in shadow or held it).
    An alert raised while a refresh runs starts its drift job when the refresh ends."""
    for _ in range(1_200):
        alerts = client.get("/drift/alerts").json()["alerts"]
        job_id = min(alerts, key=lambda a: a["events_seen"])["retrain_job_id"] if alerts else None
        job = client.get(f"/jobs/{job_id}").json() if job_id is not None else None
        running = client.get("/healthz").json()["retrain_job_running"]
        done = job is not None and job["status"] == "succeeded" and running is None
        if done and serves_newest_promoted(client.get("/models").json()):
            return job
        time.sleep(0.1)
    raise AssertionError("the first alert's job did not succeed and serve within 120 s")


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
        job = _wait_for_alert_version(client)
        alerts = sorted(
            client.get("/drift/alerts").json()["alerts"], key=lambda a: a["events_seen"]
        )
        beats = client.get("/drift/heartbeats").json()["heartbeats"]
        models = client.get("/models").json()
        first = client.get(f"/drift/alerts/{alerts[0]['id']}").json() if alerts else None

    assert alerts, "no drift alert"
    assert all(a["events_seen"] > onset for a in alerts), alerts
    # A refresh that swaps in just after the onset keeps the monitor's reference (it
    # continues the regime), so the bound holds with refresh retrains on as well.
    assert alerts[0]["events_seen"] <= onset + 5_000, alerts[0]
    assert job["model_version"] is not None
    assert any(v["version"] == job["model_version"] for v in models["versions"])
    after = onset + 5_000  # once the drift job had time to land
    assert _rmse_after(beats, "rmse", after) < _rmse_after(beats, "static_rmse", after)
    _assert_says_where(first, planted)
    # The drift job trained on the change: every event since its alert's change point
    # and a sample of what came before, at most DRIFT_WINDOW_HISTORY_RATIO (3) older
    # events per newer one, however late the job started (on a busy machine the
    # stream may have ended by then), and never the whole history.
    change_after = job["params"]["change_after_id"]
    assert change_after is not None, job["params"]
    since_change = job["last_event_id"] - change_after
    assert since_change < job["window_events"] <= 4 * since_change, job
    assert job["window_events"] < job["last_event_id"], job


def _assert_says_where(alert: dict | None, planted: PlantedDrift) -> None:
    """The alert's segments put the rise on the users who inverted their taste."""
    assert alert is not None and alert["segments"] is not None, alert
    segments = alert["segments"]
    assert abs(segments["change_events"] - (planted.onset or 0)) <= 2_500, segments
    assert segments["users"]["returning"]["share_of_rise"] > 0.5, segments["users"]
    inverted = {
        user
        for user, drifted in zip(planted.stream.user_ids, planted.drifted, strict=True)
        if drifted
    }
    # At the alert each user has a handful of events since the change; those with
    # enough to be listed whose error rose most are mostly the inverted (30 % of all).
    top = [entry["id"] for entry in segments["top_users"]]
    assert len(top) >= 5 and sum(user in inverted for user in top) > len(top) / 2, top
