"""``driftline serve`` runs a policy other than the default: its jobs carry its name and
trigger, and ``/healthz`` says what it waits for."""

from __future__ import annotations

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
}


def _jobs_settled(client: httpx.Client, at_least: int) -> list[dict]:
    for _ in range(600):
        jobs = client.get("/jobs").json()["jobs"]
        done = [j for j in jobs if j["status"] == "succeeded"]
        if len(done) >= at_least and client.get("/healthz").json()["retrain_job_running"] is None:
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"fewer than {at_least} jobs succeeded within 60 s")


def test_serve_runs_the_periodic_policy_and_reports_it(tmp_path: Path) -> None:
    events = planted_drift_stream(n_events=3_000, drift_at=3_000, seed=1)
    with (
        ServerProcess(tmp_path / "data", env=ENV) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        assert client.get("/healthz").json()["retrain_policy"] == {
            "name": "periodic",
            "waiting_for": "first model after 500 more labelled events",
        }
        client.post("/ingest", json={"events": events[:600]}).raise_for_status()
        _jobs_settled(client, 1)
        client.post("/ingest", json={"events": events[600:1_700]}).raise_for_status()
        jobs = _jobs_settled(client, 2)
        assert {(j["policy"], j["trigger"]) for j in jobs} == {
            ("periodic", "bootstrap"),
            ("periodic", "periodic"),
        }
        detail = client.get(f"/jobs/{jobs[0]['id']}").json()
        assert detail["policy"] == "periodic"
        waiting = client.get("/healthz").json()["retrain_policy"]["waiting_for"]
        assert waiting.startswith("next retrain in "), waiting
        metrics = client.get("/metrics").text
        started = 'driftline_retrain_jobs_started_total{policy="periodic",trigger="periodic"}'
        assert started in metrics
