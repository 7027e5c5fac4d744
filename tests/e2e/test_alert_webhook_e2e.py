"""Alert delivery from a real ``driftline serve``: a job stopped by a tiny
``RETRAIN_BUDGET_USD`` is posted to ``ALERT_WEBHOOK_URL``, a receiver on loopback."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.support.synthetic import planted_drift_stream
from tests.support.webhook import Receiver

pytestmark = pytest.mark.slow


def test_serve_posts_a_budget_notice_with_the_runbook_link(tmp_path: Path) -> None:
    receiver = Receiver()
    env = {
        "DRIFTLINE_ALERT_WEBHOOK_URL": receiver.url,
        "DRIFTLINE_ALERT_RUNBOOK_URL": "https://wiki.example/driftline",
        "DRIFTLINE_RETRAIN_RUNTIME": "thread",  # billed like Lambda
        "DRIFTLINE_RETRAIN_BUDGET_USD": "0.000000001",  # spent by the first epoch
        "DRIFTLINE_BOOTSTRAP_EVENTS": "300",
        "DRIFTLINE_FACTORS": "4",
    }
    events = planted_drift_stream(n_events=400, drift_at=400, seed=2)
    try:
        with (
            ServerProcess(tmp_path / "data", env=env) as server,
            httpx.Client(base_url=server.url, timeout=60) as client,
        ):
            client.post("/ingest", json={"events": events}).raise_for_status()
            bodies = receiver.wait_for(1, timeout=90)
            assert bodies, "no notice within 90 s"
            jobs = client.get("/jobs").json()["jobs"]
            # The receiver holds the body before the sender has counted the delivery.
            sent = 'driftline_alert_webhook_sent_total{kind="budget"} 1.0'
            deadline = time.monotonic() + 10
            metrics = client.get("/metrics").text
            while sent not in metrics and time.monotonic() < deadline:
                time.sleep(0.1)
                metrics = client.get("/metrics").text
    finally:
        receiver.close()
    assert jobs[0]["stop_reason"] == "budget"
    assert bodies[0]["text"].startswith("Driftline: Retraining budget exhausted: Retraining job")
    link = bodies[0]["blocks"][-1]["elements"][0]["text"]
    assert link == "<https://wiki.example/driftline#budget|Runbook: what to do>"
    assert 'driftline_alert_webhook_sent_total{kind="budget"} 1.0' in metrics
