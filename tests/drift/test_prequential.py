import math

import numpy as np
import pytest

from drift.prequential import PrequentialTracker, squared_errors


def test_squared_errors_drops_unlabelled_events() -> None:
    errors = squared_errors(np.array([4.0, np.nan, 2.0]), np.array([3.0, 1.0, 2.5]))
    np.testing.assert_array_equal(errors, [1.0, 0.25])


def test_squared_errors_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="length"):
        squared_errors(np.ones(3), np.ones(2))


def test_squared_errors_rejects_missing_prediction_for_a_labelled_event() -> None:
    with pytest.raises(ValueError, match="y_pred"):
        squared_errors(np.array([4.0, 3.0]), np.array([np.nan, 3.0]))
    assert squared_errors(np.array([np.nan]), np.array([np.nan])).size == 0


def test_tracker_keeps_a_running_rmse_per_track() -> None:
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.5, 5.0, 5_000)
    live = truth + rng.normal(0.0, 0.8, truth.size)
    static = truth + rng.normal(0.0, 1.1, truth.size)
    tracker = PrequentialTracker()
    for start in range(0, truth.size, 1_000):
        batch = slice(start, start + 1_000)
        tracker.record("driftline", truth[batch], live[batch])
        tracker.record("static", truth[batch], static[batch])
    assert tracker.tracks() == ["driftline", "static"]
    assert tracker.count("static") == 5_000
    assert tracker.rmse("driftline") == pytest.approx(np.sqrt(np.mean((truth - live) ** 2)))
    assert tracker.rmse("driftline") < tracker.rmse("static")


def test_tracker_ignores_unlabelled_events() -> None:
    tracker = PrequentialTracker()
    tracker.record("river", np.array([np.nan, 3.0, np.nan]), np.array([1.0, 2.0, 3.0]))
    assert tracker.count("river") == 1
    assert tracker.rmse("river") == 1.0


def test_tracker_without_labelled_events_reports_none() -> None:
    tracker = PrequentialTracker()
    assert tracker.rmse("driftline") is None
    assert tracker.count("driftline") == 0
    tracker.record("static", np.array([np.nan]), np.array([2.0]))
    assert tracker.summary() == {"static": {"rmse": None, "count": 0}}


def test_summary_lists_rmse_and_count_of_every_track() -> None:
    tracker = PrequentialTracker()
    tracker.record("driftline", [4.0, 2.0], [3.0, 3.0])
    tracker.record("static", [4.0], [2.0])
    assert tracker.summary() == {
        "driftline": {"rmse": 1.0, "count": 2},
        "static": {"rmse": 2.0, "count": 1},
    }
    assert math.isclose(tracker.rmse("static"), 2.0)
