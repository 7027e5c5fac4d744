"""The monitor's batched paths give what feeding one event at a time gives.

The per-event detector takes a heartbeat's errors in one compiled pass and the segment
buffer keeps ids as integer codes; these tests run seeded streams with a planted rise
through them and through straightforward references (river's own Page-Hinkley fed one
value per call; a buffer of Python lists and a dictionary of item counts, reported by
``attribute_rise`` on its columns) and ask for the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import river.drift

import drift.detector_classes
from drift import DriftAlert, EventDriftMonitor, HeartbeatAggregator, UserKeys, make_detector
from drift.page_hinkley import PageHinkley
from drift.segments import SegmentBuffer, SegmentRules, attribute_rise

ONSET = 6_000


def _stream(seed: int, n: int = 9_000) -> tuple[list[str], list[str], np.ndarray]:
    """Users and items drawn from skewed (Zipf) distributions; errors rise by half for
    most users from ``ONSET`` on."""
    rng = np.random.default_rng(seed)
    users = [f"u{k}" for k in rng.zipf(1.4, n) % 400]
    items = [f"i{k}" for k in rng.zipf(1.2, n) % 900]
    scale = np.where(np.arange(n) >= ONSET, 1.5 + rng.random(n) * 0.3, 1.0)
    errors = rng.gamma(0.5, 1.4, n) * scale
    return users, items, np.minimum(errors, 20.25)


def _batches(n: int, seed: int) -> Iterator[slice]:
    """Slices of random sizes (1 to 700) covering ``range(n)``."""
    rng = np.random.default_rng(seed)
    start = 0
    while start < n:
        stop = min(n, start + int(rng.integers(1, 700)))
        yield slice(start, stop)
        start = stop


@pytest.mark.parametrize("mode", ["up", "down", "both"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_page_hinkley_over_arrays_is_rivers_value_by_value(mode: str, seed: int) -> None:
    _, _, errors = _stream(seed)
    params = {"min_instances": 200, "delta": 0.02, "threshold": 15.0, "mode": mode}
    theirs = river.drift.PageHinkley(**params)
    expected = []
    for k, value in enumerate(errors.tolist()):
        theirs.update(value)
        if theirs.drift_detected:
            expected.append(k)
    ours = PageHinkley(**params)
    found: list[int] = []
    for part in _batches(errors.size, seed):
        found += (ours.update_many(errors[part]) + part.start).tolist()
    assert expected and found == expected
    assert ours.drift_detected == theirs.drift_detected
    state = ours._state
    assert state[1] == theirs._x_mean.get()
    assert (state[2], state[3]) == (theirs._sum_increase, theirs._sum_decrease)
    assert (state[4], state[5]) == (theirs._min_increase, theirs._max_decrease)


def _alerts(name: str, errors: np.ndarray, keys: np.ndarray) -> tuple[list[DriftAlert], Any]:
    """The alerts of detector ``name`` over heartbeats of 250 events, and its feed."""
    detector = make_detector(name, delta=0.002, min_relative_drop=0.1, min_heartbeats=5)
    assert isinstance(detector, EventDriftMonitor)
    aggregator = HeartbeatAggregator(250)
    alerts = []
    for part in _batches(errors.size, 7):
        for beat in aggregator.add(errors[part], keys[part]):
            alert = detector.update(beat)
            if alert is not None:
                alerts.append(alert)
    return alerts, detector._feed


@pytest.mark.parametrize("name", ["page-hinkley", "adwin-event", "kswin"])
@pytest.mark.parametrize("seed", [3, 4])
def test_the_event_detector_alerts_where_rivers_detector_fed_per_event_does(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    users, _, errors = _stream(seed, n=40_000 if name == "kswin" else 12_000)
    # The onset repeats, so a detector that restarts after an alert sees a second rise.
    errors = np.r_[errors, errors]
    keys = UserKeys()(users + users)
    fast, feed = _alerts(name, errors, keys)
    monkeypatch.setattr(drift.detector_classes, "_COMPILED", {})  # river's own, per event
    reference, reference_feed = _alerts(name, errors, keys)
    assert len(fast) >= 2 and all(alert.change_events is not None for alert in fast)
    assert fast == reference
    assert (feed.changes, feed.level) == (reference_feed.changes, reference_feed.level)
    if name == "page-hinkley":
        theirs = reference_feed.river
        assert isinstance(theirs, river.drift.PageHinkley)
        assert feed.river._state[1:4].tolist() == [
            theirs._x_mean.get(),
            theirs._sum_increase,
            theirs._sum_decrease,
        ]


class _ListBuffer:
    """The reference buffer: Python lists, one event at a time, popularity counted in a
    dictionary of the items kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: list[tuple[int, str, str, float, int]] = []
        self.counts: dict[str, int] = {}

    def add(self, position: int, user: str, item: str, error: float) -> None:
        if len(self.rows) == self.capacity:
            gone = self.rows.pop(0)[2]
            self.counts[gone] -= 1
        popularity = self.counts.get(item, 0)
        self.counts[item] = popularity + 1
        self.rows.append((position, user, item, error, popularity))

    def columns(self) -> tuple[np.ndarray, ...]:
        positions, users, items, errors, popularity = zip(*self.rows, strict=True)
        ids = [np.empty(len(self.rows), dtype=object) for _ in range(2)]
        ids[0][:], ids[1][:] = list(users), list(items)
        return (
            np.asarray(positions, dtype=np.int64),
            ids[0],
            ids[1],
            np.asarray(errors, dtype=np.float64),
            np.asarray(popularity, dtype=np.int64),
        )


@pytest.mark.parametrize(("seed", "capacity"), [(5, 20_000), (6, 4_000), (7, 700)])
def test_segment_reports_are_those_of_a_buffer_fed_one_event_at_a_time(
    seed: int, capacity: int
) -> None:
    users, items, errors = _stream(seed)
    rules = SegmentRules(reference_events=2_500, min_events=2, top=8)
    buffer, reference = SegmentBuffer(capacity, rules), _ListBuffer(capacity)
    reports = 0
    for part in _batches(errors.size, seed):
        buffer.record(users[part], items[part], errors[part], after=part.start)
        for k in range(part.start, part.stop):
            reference.add(k + 1, users[k], items[k], float(errors[k]))
        ordered = buffer._ordered()
        for ours, theirs in zip(ordered, reference.columns(), strict=True):
            assert ours.tolist() == theirs.tolist()
        if part.stop > ONSET:
            for change in (ONSET, part.stop - 300, part.stop - 5_000):
                expected = attribute_rise(*reference.columns(), change, rules)
                assert buffer.report(change) == expected
                reports += expected is not None
    assert reports > 0


def test_the_codes_of_ids_long_gone_are_dropped_and_reports_stay_the_same() -> None:
    users, items, errors = _stream(8)
    users = [f"{user}-{k // 500}" for k, user in enumerate(users)]  # new users all along
    rules = SegmentRules(reference_events=400)
    buffer, reference = SegmentBuffer(600, rules), _ListBuffer(600)
    for part in _batches(errors.size, 8):
        buffer.record(users[part], items[part], errors[part], after=part.start)
        for k in range(part.start, part.stop):
            reference.add(k + 1, users[k], items[k], float(errors[k]))
    assert len(buffer._user_codes) <= 2 * buffer.capacity + 700
    change = errors.size - 200
    assert buffer.report(change) == attribute_rise(*reference.columns(), change, rules)
    assert buffer._item_counts == {item: n for item, n in reference.counts.items() if n}


def test_a_buffer_whose_positions_step_back_still_reports_like_the_reference() -> None:
    users, items, errors = _stream(9, n=3_000)
    rules = SegmentRules(reference_events=1_000)
    buffer, reference = SegmentBuffer(5_000, rules), _ListBuffer(5_000)
    for after in (0, 1_000, 500):  # a restart counting from an older offset
        part = slice(after, after + 1_000)
        buffer.record(users[part], items[part], errors[part], after=after)
        for k in range(part.start, part.stop):
            reference.add(k + 1, users[k], items[k], float(errors[k]))
    assert buffer.report(800) == attribute_rise(*reference.columns(), 800, rules)
