import json
import math

import numpy as np
import pytest

from drift.heartbeat import Heartbeat, HeartbeatAggregator


class FakeClock:
    """A clock the test moves by hand, so time-based heartbeats need no sleeping."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_heartbeat_closes_after_every_events_across_calls() -> None:
    agg = HeartbeatAggregator(every_events=3)
    assert agg.add(np.array([1.0, 4.0])) == []
    assert agg.pending_events == 2
    beats = agg.add(np.array([9.0]))
    assert beats == [Heartbeat(index=0, events=3, events_seen=3, rmse=math.sqrt(14.0 / 3.0))]
    assert agg.pending_events == 0


def test_one_big_call_closes_several_heartbeats_in_order() -> None:
    errors = np.random.default_rng(0).exponential(1.0, 2_345)
    agg = HeartbeatAggregator(every_events=500)
    agg.add(errors[:45])
    beats = agg.add(errors[45:])
    assert [b.index for b in beats] == [0, 1, 2, 3]
    assert [b.events for b in beats] == [500] * 4
    assert [b.events_seen for b in beats] == [500, 1000, 1500, 2000]
    expected = np.sqrt(errors[:2000].reshape(4, 500).mean(axis=1))
    np.testing.assert_allclose([b.rmse for b in beats], expected, rtol=1e-12)
    assert agg.pending_events == 345


def test_exact_multiple_leaves_nothing_pending() -> None:
    agg = HeartbeatAggregator(every_events=10)
    assert len(agg.add(np.ones(30))) == 3
    assert agg.pending_events == 0
    assert agg.events_seen == 30


def test_empty_and_list_inputs_are_accepted() -> None:
    agg = HeartbeatAggregator(every_events=2)
    assert agg.add(np.array([])) == []
    assert [b.rmse for b in agg.add([1.0, 1.0])] == [1.0]


def test_time_based_heartbeat_closes_pending_errors_when_due() -> None:
    clock = FakeClock()
    agg = HeartbeatAggregator(every_events=100, every_seconds=10.0, clock=clock)
    assert agg.add(np.full(3, 4.0)) == []
    clock.now = 9.9
    assert agg.flush_if_due() is None
    clock.now = 10.0
    beat = agg.flush_if_due()
    assert beat == Heartbeat(index=0, events=3, events_seen=3, rmse=2.0)
    assert agg.flush_if_due() is None
    assert agg.pending_events == 0


def test_time_based_heartbeat_is_checked_on_add_and_includes_the_new_errors() -> None:
    clock = FakeClock()
    agg = HeartbeatAggregator(every_events=100, every_seconds=5.0, clock=clock)
    agg.add(np.ones(2))
    clock.now = 6.0
    beats = agg.add(np.ones(3))
    assert [(b.events, b.events_seen) for b in beats] == [(5, 5)]


def test_time_based_heartbeat_needs_a_pending_error() -> None:
    clock = FakeClock()
    agg = HeartbeatAggregator(every_events=100, every_seconds=1.0, clock=clock)
    clock.now = 50.0
    assert agg.flush_if_due() is None
    assert agg.add(np.array([])) == []


def test_count_based_heartbeat_restarts_the_timer() -> None:
    clock = FakeClock()
    agg = HeartbeatAggregator(every_events=2, every_seconds=10.0, clock=clock)
    clock.now = 8.0
    assert len(agg.add(np.ones(3))) == 1
    clock.now = 12.0
    assert agg.flush_if_due() is None
    clock.now = 18.0
    assert agg.flush_if_due() == Heartbeat(index=1, events=1, events_seen=3, rmse=1.0)


def test_without_every_seconds_time_never_closes_a_heartbeat() -> None:
    clock = FakeClock()
    agg = HeartbeatAggregator(every_events=100, clock=clock)
    agg.add(np.ones(5))
    clock.now = 1e9
    assert agg.flush_if_due() is None
    assert agg.pending_events == 5


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"every_events": 0}, "every_events"),
        ({"every_events": -3}, "every_events"),
        ({"every_events": 2.5}, "every_events"),
        ({"every_events": True}, "every_events"),
        ({"every_seconds": 0.0}, "every_seconds"),
        ({"every_seconds": -1.0}, "every_seconds"),
        ({"every_seconds": math.nan}, "every_seconds"),
        ({"every_seconds": math.inf}, "every_seconds"),
    ],
)
def test_invalid_arguments_are_rejected_by_name(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        HeartbeatAggregator(**kwargs)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.5])
def test_non_finite_or_negative_errors_are_rejected(bad: float) -> None:
    agg = HeartbeatAggregator(every_events=10)
    with pytest.raises(ValueError, match="squared_errors"):
        agg.add(np.array([1.0, bad]))
    assert agg.pending_events == 0


def test_a_restored_aggregator_closes_the_same_heartbeats_as_an_uninterrupted_one() -> None:
    errors = np.random.default_rng(5).exponential(1.0, 1_234)
    uninterrupted = HeartbeatAggregator(every_events=100).add(errors)
    before = HeartbeatAggregator(every_events=100)
    first = before.add(errors[:567])
    after = HeartbeatAggregator(every_events=100)
    after.restore(json.loads(json.dumps(before.state())))
    assert after.pending_events == 67
    resumed = first + after.add(errors[567:])
    # Equal up to summation order: a cut anywhere regroups the float sums.
    assert [(b.index, b.events, b.events_seen) for b in resumed] == [
        (b.index, b.events, b.events_seen) for b in uninterrupted
    ]
    assert [b.rmse for b in resumed] == pytest.approx([b.rmse for b in uninterrupted], rel=1e-12)


@pytest.mark.parametrize(
    "state",
    [
        {"pending_sum": 1.0, "pending_count": 100, "index": 0, "events_seen": 0},
        {"pending_sum": 1.0, "pending_count": -1, "index": 0, "events_seen": 0},
        {"pending_sum": math.inf, "pending_count": 3, "index": 0, "events_seen": 0},
        {"pending_sum": 1.0, "pending_count": 3, "index": -2, "events_seen": 0},
    ],
)
def test_a_state_this_aggregator_cannot_have_is_refused_and_changes_nothing(state: dict) -> None:
    agg = HeartbeatAggregator(every_events=100)
    agg.add(np.ones(7))
    with pytest.raises(ValueError):
        agg.restore(state)
    assert agg.state() == {"pending_sum": 7.0, "pending_count": 7, "index": 0, "events_seen": 0}
