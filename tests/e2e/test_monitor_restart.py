"""A server killed in the middle of a drift still raises the alert after its restart.

The drift monitor's window (the heartbeats since ADWIN last restarted) and the partial
heartbeat are saved with every heartbeat write and restored on start; without them the
restarted monitor would see only the drifted level and never find a change.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.e2e.test_loop import BATCH, DRIFT_AT, SERVER_ENV, _wait_idle
from tests.support.synthetic import planted_drift_stream

pytestmark = pytest.mark.slow

KILL_AT = DRIFT_AT + 250  # ten heartbeats into the drift, before ADWIN can confirm it


def _post(client: httpx.Client, events: list[dict]) -> None:
    for start in range(0, len(events), BATCH):
        response = client.post("/ingest", json={"events": events[start : start + BATCH]})
        assert response.status_code == 200, response.text
        if start == 1_000:
            _wait_idle(client)  # the bootstrap model serves before the drift arrives


def test_a_restart_mid_drift_still_raises_the_alert(tmp_path: Path) -> None:
    events = planted_drift_stream(n_events=14_000, drift_at=DRIFT_AT, seed=3)
    # The same replica restarted (a restart elsewhere waits for the lease to expire).
    env = {**SERVER_ENV, "DRIFTLINE_RETRAIN_RUNTIME": "inprocess", "DRIFTLINE_REPLICA_ID": "one"}
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            _post(client, events[:KILL_AT])
            _wait_idle(client)
            assert client.get("/drift/alerts").json()["alerts"] == []
    finally:
        server.stop(kill=True)

    restarted = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=restarted.url, timeout=60) as client:
            _post(client, events[KILL_AT:])
            alerts = client.get("/drift/alerts").json()["alerts"]
    finally:
        restarted.stop()
    assert alerts, "no alert after the restart"
    assert min(a["events_seen"] for a in alerts) > DRIFT_AT
