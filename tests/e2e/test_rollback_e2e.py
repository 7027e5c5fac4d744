"""Rollback on a real ``driftline serve`` on loopback: the earlier version serves again
in the running process, and only an admin key may ask for it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.support.synthetic import planted_drift_stream

pytestmark = pytest.mark.slow

ENV = {
    "DRIFTLINE_RETRAIN_POLICY": "periodic",
    "DRIFTLINE_PERIODIC_EVENTS": "1000",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "500",
    "DRIFTLINE_HEARTBEAT_EVENTS": "25",
    "DRIFTLINE_FACTORS": "8",
    "DRIFTLINE_MAX_EPOCHS": "5",
    # GP-OPT (the default) takes the cheapest config that meets the deadline, so a
    # job stretches towards it: a short one keeps jobs within the waits here.
    "DRIFTLINE_LATENCY_CAP_SECONDS": "20",
    "DRIFTLINE_KEY_REFRESH_SECONDS": "0.2",
    # Each version serves once published: the test rolls back to the one before.
    "DRIFTLINE_GUARD_ENABLED": "false",
}


def _key(data_dir: Path, name: str, scope: str) -> str:
    command = [sys.executable, "-m", "service", "keys", "create", name, "--scope", scope]
    done = subprocess.run(
        [*command, "--data-dir", str(data_dir)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _serving(client: httpx.Client, versions: int) -> dict:
    """``/models`` once ``versions`` versions exist and the newest one serves."""
    for _ in range(900):
        models = client.get("/models").json()
        rows = models["versions"]
        if len(rows) >= versions and models["current"] == rows[0]["version"]:
            return models
        time.sleep(0.1)
    raise AssertionError(f"fewer than {versions} versions serving within 90 s: {models}")


def test_rollback_hot_swaps_a_running_server_for_admin_keys_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    admin = {"Authorization": f"Bearer {_key(data_dir, 'operator', 'admin')}"}
    reader = {"Authorization": f"Bearer {_key(data_dir, 'viewer', 'read')}"}
    events = planted_drift_stream(n_events=2_000, drift_at=2_000, seed=4)
    with (
        ServerProcess(data_dir, env=ENV) as server,
        httpx.Client(base_url=server.url, timeout=60, headers=admin) as client,
    ):
        client.post("/ingest", json={"events": events[:600]}).raise_for_status()
        _serving(client, 1)
        client.post("/ingest", json={"events": events[600:1_700]}).raise_for_status()
        models = _serving(client, 2)
        newest, earlier = models["versions"][0]["version"], models["versions"][1]["version"]

        refused = client.post(f"/models/{earlier}/rollback", headers=reader)
        assert refused.status_code == 403, refused.text
        assert client.post("/models/v9999/rollback").status_code == 404
        done = client.post(f"/models/{earlier}/rollback")
        assert done.status_code == 200, done.text
        assert done.json()["actor"] == "operator" and done.json()["from_version"] == newest

        user = events[0]["user_id"]
        served = client.get("/recommend", params={"user_id": user}).json()
        assert served["model_version"] == earlier
        time.sleep(1.0)  # the registry follower polls meanwhile and must not undo it
        assert client.get("/models").json()["current"] == earlier
        assert "driftline_model_rollbacks_total 1.0" in client.get("/metrics").text

        back = client.post(f"/models/{newest}/rollback")
        assert back.status_code == 200
        assert client.get("/recommend", params={"user_id": user}).json()["model_version"] == newest
