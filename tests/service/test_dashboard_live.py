"""The pipeline feeds the dashboard's live stream, and the stream resumes where asked.

Heartbeats, drift alerts, jobs (queued, running, succeeded or failed) and swaps (a job's
and a rollback's) reach ``Driftline.events``; ``GET /dashboard/events`` turns them into
server-sent events after the id a browser last saw (tests/e2e has the real server).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
import orjson
import pytest
from sse_starlette import ServerSentEvent

from drift.base import DriftDetector
from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert
from service.api.routes import dashboard_live
from service.api.routes.dashboard_live import _resume_point, _stream
from service.livefeed import EventBuffer
from service.store.events import NewEvent
from service.wiring import Driftline
from tests.support.synthetic import as_new_events, stationary_stream


class FiresOnce(DriftDetector):
    """Raises one alert at the first heartbeat it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def update(self, x: Heartbeat) -> DriftAlert | None:
        if self.fired:
            return None
        self.fired = True
        return DriftAlert("rmse", 0.8, 1.2, x.events_seen, x.index, None, "scripted")

    def on_swap(self, continues_regime: bool = False) -> None:
        """Keeps its script through swaps."""

    def reset(self) -> None:
        self.fired = False


@pytest.fixture(scope="module")
def events() -> list[NewEvent]:
    return as_new_events(stationary_stream(n_users=40, n_items=30, n_events=400, seed=5))


@pytest.fixture
def pipeline(small_pipelines: Callable[..., Driftline]) -> Driftline:
    return small_pipelines()


def _of(pipeline: Driftline, kind: str, after: int = 0) -> list[dict[str, Any]]:
    return [e.data for e in pipeline.feed.since(after) if e.kind == kind]


def test_heartbeats_the_bootstrap_job_and_its_swap_are_published_in_order(
    pipeline: Driftline, events: list[NewEvent]
) -> None:
    pipeline.ingest(events[:200])
    published = pipeline.feed.since(0)
    ids = [e.id for e in published]
    assert ids == list(range(1, len(ids) + 1))

    beats = _of(pipeline, "heartbeat")
    assert [b["events_seen"] for b in beats] == [50, 100, 150, 200]
    stored = pipeline.reads.heartbeats()
    assert beats == [{**row, "id": None} for row in stored]  # as GET /drift/heartbeats has them
    assert {"rmse", "static_rmse", "hit_rate", "static_hit_rate", "model_version", "at"} <= set(
        beats[0]
    )

    [job_id] = {j["id"] for j in _of(pipeline, "job")}
    assert _of(pipeline, "job") == [
        {"id": job_id, "status": status, "trigger": "bootstrap"}
        for status in ("queued", "running", "succeeded")
    ]
    assert _of(pipeline, "swap") == [
        {"version": pipeline.learner.serving.version, "events_seen": 200, "trigger": "bootstrap"}
    ]
    kinds = [e.kind for e in published]
    assert kinds.index("heartbeat") < kinds.index("job") < kinds.index("swap")


def test_a_drift_alert_its_job_and_a_rollback_are_published(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    # The drift job's version serves at once: the rollout guard's events have a test of
    # their own (tests/service/test_rollout_guard.py).
    pipeline = small_pipelines(guard_enabled=False)
    pipeline.ingest(events[:200])
    first = pipeline.learner.serving.version
    mark = pipeline.feed.newest_id
    pipeline.monitor.detector = FiresOnce()
    pipeline.ingest(events[200:250])

    [alert] = _of(pipeline, "alert", mark)
    assert alert == {
        "id": alert["id"],
        "events_seen": 250,
        "before": 0.8,
        "after": 1.2,
        "detector": "scripted",
        "metric": "rmse",
    }
    assert alert["id"] >= 1
    statuses = [(j["status"], j["trigger"]) for j in _of(pipeline, "job", mark)]
    assert statuses == [("queued", "drift"), ("running", "drift"), ("succeeded", "drift")]
    [swap] = _of(pipeline, "swap", mark)
    assert swap["trigger"] == "drift" and swap["version"] != first

    mark = pipeline.feed.newest_id
    pipeline.swapper.rollback(first, actor="operator")
    assert _of(pipeline, "swap", mark) == [
        {"version": first, "events_seen": 250, "trigger": "rollback"}
    ]


def test_a_failed_job_is_published(
    pipeline: Driftline, events: list[NewEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline.ingest(events[:200])
    mark = pipeline.feed.newest_id

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the runtime is gone")

    monkeypatch.setattr(pipeline.retrainer, "_train", broken)
    job_id = pipeline.retrain_now()
    assert _of(pipeline, "job", mark) == [
        {"id": job_id, "status": "queued", "trigger": "manual"},
        {"id": job_id, "status": "failed", "trigger": "manual"},
    ]
    assert _of(pipeline, "swap", mark) == []


@pytest.mark.parametrize(
    ("header", "query", "expected"),
    [
        (None, None, 7),  # a first connection starts at the newest event
        (None, 3, 3),
        ("5", 3, 5),  # a reconnect's header is newer than the page's query string
        (" 0 ", None, 0),
        ("8", None, None),  # an id this process never gave: it restarted
        ("-1", None, None),
        ("soon", None, None),
    ],
)
def test_the_resume_point(header: str | None, query: int | None, expected: int | None) -> None:
    assert _resume_point(header, query, newest=7) == expected


def _take(buffer: EventBuffer, last_id: int | None, count: int) -> list[ServerSentEvent]:
    async def take() -> list[ServerSentEvent]:
        stream = _stream(buffer, last_id)
        try:
            return [await anext(stream) for _ in range(count)]
        finally:
            await stream.aclose()

    return asyncio.run(asyncio.wait_for(take(), timeout=10))


def test_the_stream_resumes_after_the_id_and_asks_for_a_reload_past_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dashboard_live, "POLL_SECONDS", 0.01)
    buffer = EventBuffer(capacity=3)
    for n in range(5):
        buffer.publish("heartbeat", {"rmse": 1.0 + n})

    resumed = _take(buffer, 3, 2)
    assert [(m.id, m.event) for m in resumed] == [("4", "heartbeat"), ("5", "heartbeat")]
    assert orjson.loads(str(resumed[0].data)) == {"rmse": 4.0}

    behind = _take(buffer, 1, 4)  # events 2 left the buffer
    assert [(m.id, m.event) for m in behind] == [
        (None, "reload"),
        ("3", "heartbeat"),
        ("4", "heartbeat"),
        ("5", "heartbeat"),
    ]
    assert _take(buffer, None, 1)[0].event == "reload"


def test_the_stream_sends_what_is_published_while_it_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dashboard_live, "POLL_SECONDS", 0.01)
    buffer = EventBuffer()

    async def run() -> list[ServerSentEvent]:
        stream = _stream(buffer, 0)
        later = asyncio.get_running_loop().call_later(
            0.05, buffer.publish, "swap", {"version": "v0002"}
        )
        try:
            return [await asyncio.wait_for(anext(stream), timeout=10)]
        finally:
            later.cancel()
            await stream.aclose()

    [message] = asyncio.run(run())
    assert (message.id, message.event) == ("1", "swap")
    assert orjson.loads(str(message.data)) == {"version": "v0002"}


def test_the_stream_ends_by_itself_at_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard_live, "POLL_SECONDS", 30.0)  # shutdown must not wait on it
    buffer = EventBuffer()
    buffer.publish("job", {"id": 1, "status": "queued", "trigger": "manual"})

    async def run() -> list[ServerSentEvent]:
        shutdown = anyio.Event()
        asyncio.get_running_loop().call_later(0.05, shutdown.set)
        return [message async for message in _stream(buffer, 0, shutdown)]

    began = time.monotonic()
    [message] = asyncio.run(asyncio.wait_for(run(), timeout=10))
    assert message.event == "job" and time.monotonic() - began < 5
