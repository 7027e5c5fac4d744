"""The stream monitor writes what it would write fed one event at a time.

A seeded stream (users and items from skewed distributions, errors rising by half at a
planted onset) goes through a ``StreamMonitor`` in batches and, as the reference,
through another one event per ``observe``: the stored heartbeats, the alerts, where
they were raised and their segment reports must be the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from drift import HeartbeatAggregator, make_detector
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.store import Database
from service.store.alerts import list_alerts, list_heartbeats
from service.stream.learner import Evaluation
from service.stream.monitor import StreamMonitor

HEARTBEAT = 250
EVENTS = 12_000
ONSET = 7_000


class _Ranking:
    """No ranking sample: every heartbeat's ranking figures are empty."""

    def take(self, events: int) -> dict[str, Any]:
        return dict.fromkeys(("hit_rate", "ndcg", "static_hit_rate", "static_ndcg"), None) | {
            "ranked_events": 0
        }

    def pending_state(self) -> list[list[int]]:
        return []


class _Notifier:
    def __init__(self) -> None:
        self.notices: list[Any] = []

    def notify(self, notice: Any) -> bool:
        self.notices.append(notice)
        return True


def _stream(seed: int) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    users = [f"u{k}" for k in rng.zipf(1.4, EVENTS) % 500]
    items = [f"i{k}" for k in rng.zipf(1.2, EVENTS) % 1_000]
    rise = np.where(np.arange(EVENTS) >= ONSET, 1.6, 1.0)
    errors = np.minimum(rng.gamma(0.5, 1.4, EVENTS) * rise, 20.25)
    static = np.minimum(rng.gamma(0.5, 2.0, EVENTS), 20.25)
    return users, items, errors, static


def _monitor(path: Path) -> StreamMonitor:
    monitor = StreamMonitor(
        Database(f"sqlite:///{path / 'driftline.db'}"),
        Metrics(),
        make_detector("page-hinkley", delta=0.002, min_relative_drop=0.1, min_heartbeats=5),
        HeartbeatAggregator(HEARTBEAT),
        _Ranking(),  # type: ignore[arg-type]
        _Notifier(),
        EventBuffer(),
        detector_name="page-hinkley",
        state_key=0,
    )
    monitor.version = "v1"
    return monitor


def _feed(monitor: StreamMonitor, seed: int, sizes: Iterator[int]) -> None:
    users, items, errors, static = _stream(seed)
    start = 0
    while start < EVENTS:
        stop = min(EVENTS, start + next(sizes))
        monitor.observe(
            Evaluation(
                users=users[start:stop],
                items=items[start:stop],
                squared_errors=errors[start:stop],
                static_squared_errors=static[start:stop],
                labelled_before=start,
                labelled_seen=stop,
                version="v1",
                serving=True,
            )
        )
        start = stop


def _written(monitor: StreamMonitor) -> tuple[list[dict], list[dict]]:
    with monitor.db.connect() as conn:
        beats = [
            {k: v for k, v in row.items() if k not in ("id", "at")} for row in list_heartbeats(conn)
        ]
        alerts = [
            {k: v for k, v in row.items() if k not in ("id", "detected_at")}
            for row in list_alerts(conn)
        ]
    monitor.db.dispose()
    return beats, alerts


def _sizes(*choices: int, seed: int = 0) -> Iterator[int]:
    rng = np.random.default_rng(seed)
    while True:
        yield int(rng.choice(choices))


@pytest.fixture(scope="module", params=[11, 12])
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What the monitor writes fed one event per ``observe``."""
    monitor = _monitor(tmp_path_factory.mktemp("one-at-a-time"))
    _feed(monitor, request.param, _sizes(1))
    return request.param, _written(monitor)


def _same_heartbeats(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs) == EVENTS // HEARTBEAT
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=0, abs=1e-9), key
            else:
                assert mine[key] == value, key


def test_batches_of_a_heartbeat_write_the_same_heartbeats_alerts_and_segments(
    reference: Any, tmp_path: Path
) -> None:
    seed, (beats, alerts) = reference
    monitor = _monitor(tmp_path)
    _feed(monitor, seed, _sizes(HEARTBEAT))
    ours_beats, ours_alerts = _written(monitor)
    _same_heartbeats(ours_beats, beats)
    # A report is computed when its heartbeat is written, so each compares the same
    # events as the reference's: segments and all, exactly.
    assert alerts and any(alert["events_seen"] > ONSET for alert in alerts)
    assert all(alert["segments"] is not None for alert in alerts)
    assert ours_alerts == alerts


def test_batches_of_any_size_write_the_same_heartbeats_and_raise_the_same_alerts(
    reference: Any, tmp_path: Path
) -> None:
    seed, (beats, alerts) = reference
    monitor = _monitor(tmp_path)
    _feed(monitor, seed, _sizes(1, 7, 90, 333, 500, 1_200, seed=seed))
    ours_beats, ours_alerts = _written(monitor)
    _same_heartbeats(ours_beats, beats)
    fields = ("metric", "before", "after", "events_seen", "change_events", "detector")
    assert [{k: a[k] for k in fields} for a in ours_alerts] == [
        {k: a[k] for k in fields} for a in alerts
    ]


def test_a_commit_that_does_not_wait_for_the_disk_is_committed(database_url: str) -> None:
    db = Database(database_url)
    try:
        with db.begin_unsynced() as conn:
            conn.execute(text("DELETE FROM monitor_state WHERE replica = 77"))
            conn.execute(
                text("INSERT INTO monitor_state (replica, saved_at, state) VALUES (77, 1.0, '{}')")
            )
        with db.connect() as conn:
            assert conn.scalar(text("SELECT saved_at FROM monitor_state WHERE replica = 77")) == 1
            if db.engine.dialect.name == "sqlite":  # the pooled connection syncs again
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
        with pytest.raises(RuntimeError), db.begin_unsynced() as conn:
            conn.execute(text("DELETE FROM monitor_state WHERE replica = 77"))
            raise RuntimeError("rolled back")
        with db.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM monitor_state WHERE replica = 77")) == 1
    finally:
        with db.begin() as conn:
            conn.execute(text("DELETE FROM monitor_state WHERE replica = 77"))
        db.dispose()
