"""The demo's replay: a steady stated rate, and nothing waits for the service's jobs."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from benchmarks import demo
from benchmarks.datasets import RatingStream
from tests.support.synthetic import stationary_stream


def _stream(n_events: int) -> RatingStream:
    rows = stationary_stream(n_events=n_events, seed=3)
    return RatingStream(
        user_ids=[r["user_id"] for r in rows],
        item_ids=[r["item_id"] for r in rows],
        ratings=np.array([r["rating"] for r in rows], dtype=np.float64),
        timestamps=np.array([r["timestamp"] for r in rows], dtype=np.float64),
    )


class _BusyService:
    """A service that always has a job running; records when each batch arrived."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, int]] = []
        self.health_checks = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ingest":
            events = len(json.loads(request.content)["events"])
            self.batches.append((time.monotonic(), events))
            return httpx.Response(200, json={"accepted": events, "duplicates": 0})
        self.health_checks += 1
        return httpx.Response(200, json={"retrain_job_running": 7, "events_stored": 0})


def test_replay_keeps_the_stated_rate_while_a_job_runs() -> None:
    service = _BusyService()
    stream = _stream(600)
    with httpx.Client(base_url="http://demo", transport=httpx.MockTransport(service)) as client:
        began = time.monotonic()
        replayed = demo.replay(client, stream, rate=2_000.0, batch_size=100)
        took = time.monotonic() - began
    assert sum(events for _, events in service.batches) == 600
    assert service.health_checks == 0  # never asks whether a job runs, never waits for one
    assert 0.25 <= took < 1.0, took  # 600 events at 2,000/s: 0.3 s, not a job's length
    assert replayed.events == 600 and replayed.kept_up
    assert replayed.achieved == pytest.approx(2_000.0, rel=0.2)
    gaps = np.diff([at for at, _ in service.batches])
    assert gaps.max() < 0.2, gaps  # steady: one batch of 100 every 0.05 s


def test_replayed_states_its_rate_and_says_when_it_fell_behind() -> None:
    steady = demo.Replayed(100_836, 2_500.0, 40.4, 0.2, 0, 0.0)
    assert "at 2,496 events/s (asked 2,500)" in " ".join(steady.lines("through POST /ingest"))
    slow = demo.Replayed(100_836, 2_500.0, 60.0, 9.0, 12_000, 3.5)
    lines = " ".join(slow.lines("through Kafka"))
    assert not slow.kept_up
    assert "at most 12,000 events behind the topic" in lines
    assert "fell behind the stated rate" in lines


def test_demo_rejects_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="rate must be a positive number"):
        demo.run_demo(rate=0.0)


def _rollout(*rows: tuple[str, str, int | None]) -> dict[str, object]:
    return {
        "versions": [
            {"version": version, "state": state, "shadow_events": events}
            for version, state, events in rows
        ]
    }


def test_the_serving_line_names_a_version_still_in_shadow_when_the_stream_ends() -> None:
    rollout = _rollout(("v0001", "served at publication", None), ("v0002", "shadow", 340))
    assert demo.serving_line("v0001", rollout) == "v0001 (v0002 in shadow, 340 events compared)"


def test_the_serving_line_is_the_version_alone_once_the_guard_decided() -> None:
    promoted = _rollout(("v0001", "served at publication", None), ("v0002", "watch", 2_000))
    held = _rollout(("v0001", "served at publication", None), ("v0002", "held", 4_000))
    assert demo.serving_line("v0002", promoted) == "v0002"
    assert demo.serving_line("v0001", held) == "v0001"
    assert demo.serving_line(None, _rollout()) == "None"
