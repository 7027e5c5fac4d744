"""Alert delivery (``service.alerting``) against a real HTTP receiver on loopback.

The receiver (``tests.support.webhook``) is an ``http.server`` on a free port that
answers from a script (a status per request, or hanging until released), so retries,
de-duplication and a hung receiver are seen over a real socket, as Slack would see them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from drift.base import DriftDetector
from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert
from functions.mf import BiasedMF
from service.alerting import (
    AlertWebhook,
    Delivery,
    Notice,
    NoWebhook,
    budget_notice,
    drift_notice,
    job_failed_notice,
    make_notifier,
)
from service.app import create_app
from service.metrics import Metrics
from service.retraining import StoreJobRecorder
from service.settings import Settings
from service.store import Database
from service.store.jobs import create_job
from tests.support.synthetic import stationary_stream
from tests.support.webhook import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    yield served
    served.close()


QUICK = Delivery(attempts=3, backoff_s=0.01, backoff_max_s=0.05, timeout_s=5)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def _value(metrics: Metrics, name: str, kind: str) -> float:
    sample = metrics.registry.get_sample_value(
        f"driftline_alert_webhook_{name}_total", {"kind": kind}
    )
    return sample or 0.0


def _webhook(receiver: Receiver, metrics: Metrics, **options: Any) -> AlertWebhook:
    options.setdefault("delivery", QUICK)
    return AlertWebhook(
        receiver.url, metrics, runbook_url="https://wiki.example/runbook", **options
    )


def _drift(model: str = "v0001") -> Notice:
    return drift_notice(7, metric="rmse", before=0.8, after=1.0, events_seen=900, model=model)


def test_each_kind_arrives_as_slack_json_with_the_runbook_link(
    receiver: Receiver, metrics: Metrics
) -> None:
    webhook = _webhook(receiver, metrics)
    webhook.start()
    try:
        webhook.notify(_drift())
        webhook.notify(job_failed_notice(3, "RuntimeError: workers unreachable\ntraceback"))
        webhook.notify(budget_notice(4, 0.31, 0.30))
        bodies = receiver.wait_for(3)
    finally:
        webhook.stop()
    texts = [body["text"] for body in bodies]
    assert texts[0].startswith("Driftline: Drift alert: Drift alert 7: rmse rose from 0.8000")
    assert "+25.0%" in texts[0]
    assert texts[1] == (
        "Driftline: Retraining job failed: Retraining job 3 failed: "
        "RuntimeError: workers unreachable"
    )
    assert "spent $0.3100 of $0.3000" in texts[2]
    for body, kind in zip(bodies, ("drift", "job_failed", "budget"), strict=True):
        assert body["blocks"][0]["type"] == "header"
        link = body["blocks"][-1]["elements"][0]["text"]
        assert link == f"<https://wiki.example/runbook#{kind}|Runbook: what to do>"
        assert _value(metrics, "sent", kind) == 1


def test_the_same_notice_within_the_cooldown_is_sent_once(
    receiver: Receiver, metrics: Metrics
) -> None:
    now = [1_000.0]
    webhook = _webhook(receiver, metrics, cooldown_s=600, clock=lambda: now[0])
    webhook.start()
    try:
        assert webhook.notify(_drift())
        assert not webhook.notify(_drift())  # the detector fired again, same metric and model
        assert webhook.notify(_drift(model="v0002"))  # another model: another notice
        now[0] += 601
        assert webhook.notify(_drift())  # the cooldown is over
        receiver.wait_for(3)
        time.sleep(0.2)
    finally:
        webhook.stop()
    assert len(receiver.bodies) == 3
    assert _value(metrics, "suppressed", "drift") == 1
    assert _value(metrics, "sent", "drift") == 3


def test_a_receiver_answering_500_twice_gets_the_notice_on_the_third_try(
    receiver: Receiver, metrics: Metrics
) -> None:
    receiver.statuses = [500, 503]
    webhook = _webhook(receiver, metrics)
    webhook.start()
    try:
        webhook.notify(_drift())
        bodies = receiver.wait_for(1)
    finally:
        webhook.stop()
    assert len(bodies) == 1 and receiver.attempts == 3
    assert _value(metrics, "sent", "drift") == 1 and _value(metrics, "failed", "drift") == 0


def test_a_notice_is_given_up_after_its_attempts_and_counted(
    receiver: Receiver, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [500, 500, 500, 500]
    webhook = _webhook(receiver, metrics)
    webhook.start()
    try:
        webhook.notify(_drift())
        deadline = time.monotonic() + 10
        while _value(metrics, "failed", "drift") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        webhook.stop()
    assert receiver.attempts == 3 and not receiver.bodies
    assert _value(metrics, "failed", "drift") == 1
    assert "gave up after 3 attempts: the webhook answered 500" in caplog.text
    assert receiver.url not in caplog.text  # the URL is the webhook's credential


def test_a_client_error_is_not_retried(receiver: Receiver, metrics: Metrics) -> None:
    receiver.statuses = [404]
    webhook = _webhook(receiver, metrics)
    webhook.start()
    try:
        webhook.notify(_drift())
        deadline = time.monotonic() + 10
        while _value(metrics, "failed", "drift") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        webhook.stop()
    assert receiver.attempts == 1


def test_a_full_queue_drops_its_oldest_notice(receiver: Receiver, metrics: Metrics) -> None:
    webhook = _webhook(receiver, metrics, delivery=Delivery(queue_size=2, backoff_s=0.01))
    for job in (1, 2, 3):  # not started yet: nothing drains the queue
        webhook.notify(job_failed_notice(job, f"error {job}"))
    assert webhook.pending == 2 and _value(metrics, "dropped", "job_failed") == 1
    webhook.start()
    try:
        bodies = receiver.wait_for(2)
    finally:
        webhook.stop()
    assert [b["text"].rsplit(": ", 1)[-1] for b in bodies] == ["error 2", "error 3"]


def test_without_a_url_nothing_is_sent(tmp_path: Path, metrics: Metrics) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    notifier = make_notifier(settings, metrics)
    assert isinstance(notifier, NoWebhook) and not notifier.notify(_drift())
    text = metrics.registry.get_sample_value
    assert text("driftline_alert_webhook_sent_total", {"kind": "drift"}) is None


def test_the_webhook_url_must_be_http_and_is_never_shown(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http"):
        Settings(data_dir=tmp_path, alert_webhook_url="hooks.slack.com/services/T0/B0/x")
    settings = Settings(data_dir=tmp_path, alert_webhook_url="https://hooks.example/T0/B0/x")
    assert "B0" not in repr(settings) and settings.alert_webhook_cooldown_s == 600


def test_failed_and_budget_stopped_jobs_are_announced_by_the_job_recorder(
    receiver: Receiver, metrics: Metrics, database_url: str
) -> None:
    db = Database(database_url)
    webhook = _webhook(receiver, metrics)
    recorder = StoreJobRecorder(db, metrics, webhook, budget_usd=0.5)
    webhook.start()
    try:
        with db.begin() as conn:
            ids = [
                create_job(conn, policy="adwin", trigger="drift", runtime="thread", params={})
                for _ in range(3)
            ]
        recorder.failed(ids[0], "OSError: object store unreachable")
        recorder.succeeded(ids[1], version="v0001", stop_reason="converged", cost_usd=0.1)
        recorder.succeeded(ids[2], version="v0002", stop_reason="budget", cost_usd=0.52)
        bodies = receiver.wait_for(2)
        time.sleep(0.2)
    finally:
        webhook.stop()
        db.dispose()
    assert [b["text"].split(": ")[1] for b in bodies] == [
        "Retraining job failed",
        "Retraining budget exhausted",
    ]
    assert f"job {ids[2]} stopped at its budget: spent $0.5200 of $0.5000" in bodies[1]["text"]


class FiringDetector(DriftDetector):
    """Raises an alert at every heartbeat: the detector of a stream that keeps drifting."""

    def update(self, x: Heartbeat) -> DriftAlert | None:
        return DriftAlert("rmse", 0.8, 1.2, x.events_seen, x.index, None, "firing")

    def on_swap(self, continues_regime: bool = False) -> None:
        """Keeps firing through swaps."""

    def reset(self) -> None:
        pass


EVENTS = stationary_stream(n_users=20, n_items=15, n_events=600, factors=2, seed=9)


def _app_firing(client: TestClient) -> None:
    """Serve a model (alerts need one) and make every heartbeat raise an alert."""
    model = BiasedMF(factors=2, seed=0)
    model.fit(
        [e["user_id"] for e in EVENTS],
        [e["item_id"] for e in EVENTS],
        [e["rating"] for e in EVENTS],
        epochs=1,
    )
    pipeline = client.app.state.driftline
    pipeline.registry.publish(model, last_event_id=0, job_id=None, rmse=None)
    assert pipeline.swapper.follow_registry()
    pipeline.monitor.detector = FiringDetector()


def _batch(start: int, size: int = 100) -> dict[str, Any]:
    return {
        "events": [
            dict(e, event_id=f"e{start + i}") for i, e in enumerate(EVENTS[start : start + size])
        ]
    }


@pytest.fixture
def webhook_settings(settings: Settings, receiver: Receiver) -> Settings:
    return settings.model_copy(
        update={
            "alert_webhook_url": Settings(
                data_dir=settings.data_dir, alert_webhook_url=receiver.url
            ).alert_webhook_url,
            "alert_runbook_url": "https://wiki.example/runbook",
            "retrain_enabled": False,
        }
    )


def test_a_drift_alert_raised_by_ingestion_reaches_the_webhook_once(
    webhook_settings: Settings, receiver: Receiver
) -> None:
    with TestClient(create_app(webhook_settings)) as client:
        _app_firing(client)
        for start in (0, 100, 200):  # three heartbeats, three alerts on one model
            assert client.post("/ingest", json=_batch(start)).status_code == 200
        bodies = receiver.wait_for(1)
        time.sleep(0.3)
        assert len(client.get("/drift/alerts").json()["alerts"]) == 3
        metrics = client.get("/metrics").text
    assert len(bodies) == 1 and bodies[0]["text"].startswith("Driftline: Drift alert: Drift alert")
    assert 'driftline_alert_webhook_sent_total{kind="drift"} 1.0' in metrics
    assert 'driftline_alert_webhook_suppressed_total{kind="drift"} 2.0' in metrics


def test_a_hanging_receiver_does_not_slow_ingestion(
    webhook_settings: Settings, receiver: Receiver
) -> None:
    receiver.hang.set()
    with TestClient(create_app(webhook_settings)) as client:
        _app_firing(client)
        client.post("/ingest", json=_batch(0))  # the alert whose delivery hangs
        deadline = time.monotonic() + 10
        while receiver.attempts == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.attempts == 1  # the webhook is now waiting on the receiver
        took = []
        for start in range(100, 600, 100):
            began = time.perf_counter()
            assert client.post("/ingest", json=_batch(start)).status_code == 200
            took.append(time.perf_counter() - began)
        assert receiver.attempts == 1 and not receiver.bodies  # still waiting meanwhile
        receiver.released.set()
    assert max(took) < 2.0, took  # the receiver holds its request for up to 30 s
