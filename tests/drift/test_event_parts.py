"""The event monitor's collaborators on their own: feed, record, confirmation, state."""

from __future__ import annotations

import numpy as np
import pytest

from drift import EventDriftMonitor
from drift.event_confirm import (
    USER_WEIGHT_CAP,
    RiseConfirmation,
    user_balanced_mean,
)
from drift.event_feed import RiverFeed
from drift.event_record import MAX_RECENT, ErrorRecord
from drift.event_state import StateError, restore_state


def test_the_feed_passes_block_means_divided_by_the_level() -> None:
    feed = RiverFeed("PageHinkley", {}, block=2, level_events=4)
    for value in (0.1, 0.3, 0.2, 0.2):
        feed.feed(value)
    assert feed.level == pytest.approx(0.2) and feed.partial == []
    feed.feed(0.5)
    assert feed.partial == [0.5]


def test_the_record_keeps_the_newest_errors_as_float16() -> None:
    record = ErrorRecord(reference_events=200)
    values = np.linspace(0.0, 1.0, MAX_RECENT + 300)
    record.append(values, np.arange(values.size).astype(np.uint16))
    assert record.size == MAX_RECENT + 200 and record.values.dtype == np.float16
    assert record.values[-1] == 1.0 and record.keys[0] == 100
    assert record.recent_length(min_events=500) > 0
    record.clear()
    assert record.size == 0 and record.recent_length(min_events=500) == 0


def test_one_heavy_user_counts_for_at_most_fifty_events() -> None:
    keys = np.r_[np.zeros(1000), np.arange(1, 51)].astype(np.uint16)
    values = np.r_[np.ones(1000), np.zeros(50)]
    level, _, users = user_balanced_mean(values, keys)
    assert users == 51 and level == pytest.approx(0.5)


def test_a_state_with_mismatched_keys_is_refused() -> None:
    record, feed = ErrorRecord(200), RiverFeed("ADWIN", {}, 1, 0)
    confirmation = RiseConfirmation(record, EventDriftMonitor())
    with pytest.raises(StateError, match="user keys"):
        restore_state({"errors": "", "users": "AAAAAA=="}, record, feed, confirmation)


def test_a_record_is_counted_per_user_as_sorting_it_counts() -> None:
    rng = np.random.default_rng(5)
    users = rng.integers(0, 2**16, 700)
    keys = users[rng.integers(0, 700, 9_000)].astype(np.uint16)
    values = rng.random(9_000).astype(np.float16)
    binned = user_balanced_mean(values, keys)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values.astype(np.float64))
    weights = np.minimum(counts, USER_WEIGHT_CAP)
    means = sums / counts
    assert binned[0] == float((weights * means).sum() / weights.sum())  # bit for bit
    assert binned[2] == counts.size
    too_wide = keys.astype(np.int64)
    too_wide[0] = 2**16
    with pytest.raises(ValueError, match="65535"):
        user_balanced_mean(values, too_wide)
