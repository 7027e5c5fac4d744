import json
import math

import numpy as np
import pytest

from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert, DriftMonitor, split_means

EVENTS = 500


def feed(monitor: DriftMonitor, values: np.ndarray, start: int = 0) -> list[DriftAlert]:
    """Feed heartbeat RMSEs, numbered from ``start``; return the alerts raised."""
    alerts = []
    for index, rmse in enumerate(values, start=start):
        beat = Heartbeat(index, EVENTS, EVENTS * (index + 1), float(rmse))
        alert = monitor.update(beat)
        assert monitor.drift_detected is (alert is not None)
        if alert is not None:
            alerts.append(alert)
    return alerts


def levels(*parts: tuple[float, int], sd: float, seed: int) -> np.ndarray:
    """A noisy RMSE series made of ``(mean, length)`` parts."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(mean, sd, length) for mean, length in parts])


@pytest.mark.parametrize("seed", range(5))
def test_stationary_noisy_series_raises_no_alert(seed: int) -> None:
    assert feed(DriftMonitor(), levels((0.9, 400), sd=0.05, seed=seed)) == []


def test_abrupt_increase_alerts_soon_with_the_true_levels() -> None:
    monitor = DriftMonitor()
    alerts = feed(monitor, levels((0.9, 200), (1.2, 100), sd=0.03, seed=1))
    assert len(alerts) == 1
    alert = alerts[0]
    assert 200 <= alert.heartbeat_index <= 250
    assert alert.events_seen == EVENTS * (alert.heartbeat_index + 1)
    assert alert.metric == "rmse"
    assert alert.before == pytest.approx(0.9, abs=0.02)
    assert alert.after == pytest.approx(1.2, abs=0.02)
    assert alert.relative_drop == pytest.approx(1.2 / 0.9 - 1.0, abs=0.04)


def test_abrupt_decrease_is_a_change_but_never_an_alert() -> None:
    monitor = DriftMonitor()
    assert feed(monitor, levels((1.2, 200), (0.9, 100), sd=0.03, seed=2)) == []
    assert monitor.n_changes >= 1


def test_increase_below_min_relative_drop_is_not_an_alert() -> None:
    monitor = DriftMonitor(min_relative_drop=0.1)
    assert feed(monitor, levels((0.9, 300), (0.97, 300), sd=0.005, seed=3)) == []
    assert monitor.n_changes >= 1


def test_alert_lasts_one_update_and_the_window_restarts() -> None:
    monitor = DriftMonitor()
    values = levels((0.9, 200), (1.2, 100), sd=0.03, seed=1)
    alert = feed(monitor, values)[0]
    assert monitor.drift_detected is False
    assert monitor.window_size == len(values) - alert.heartbeat_index - 1


def test_reset_clears_the_window() -> None:
    monitor = DriftMonitor()
    feed(monitor, levels((0.9, 200), sd=0.03, seed=4))
    assert monitor.window_size == 200
    monitor.reset()
    assert monitor.window_size == 0
    assert monitor.n_changes == 0
    assert not monitor.drift_detected
    # The higher level is the new model's baseline, not a drift from the old one.
    assert feed(monitor, levels((1.2, 100), sd=0.03, seed=5), start=200) == []


def test_clone_is_an_equal_fresh_monitor() -> None:
    monitor = DriftMonitor(delta=0.01, min_relative_drop=0.2, min_heartbeats=3, seed=7)
    feed(monitor, levels((0.9, 50), sd=0.03, seed=6))
    clone = monitor.clone()
    assert type(clone) is DriftMonitor and clone is not monitor
    assert clone.get_params() == {
        "delta": 0.01,
        "min_relative_drop": 0.2,
        "min_heartbeats": 3,
        "seed": 7,
    }
    assert clone.window_size == 0 and monitor.window_size == 50


def test_relative_drop_of_an_alert() -> None:
    alert = DriftAlert("rmse", before=0.8, after=1.0, events_seen=10, heartbeat_index=0)
    assert alert.relative_drop == pytest.approx(0.25)
    assert DriftAlert("rmse", 0.0, 1.0, 1, 0).relative_drop == math.inf


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": math.nan}, "delta"),
        ({"min_relative_drop": -0.1}, "min_relative_drop"),
        ({"min_relative_drop": math.inf}, "min_relative_drop"),
        ({"min_heartbeats": 0}, "min_heartbeats"),
        ({"min_heartbeats": 2.0}, "min_heartbeats"),
    ],
)
def test_invalid_arguments_are_rejected_by_name(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DriftMonitor(**kwargs)


def test_non_finite_heartbeat_is_rejected() -> None:
    with pytest.raises(ValueError, match="rmse"):
        DriftMonitor().update(Heartbeat(0, 1, 1, math.nan))


def test_a_monitor_restored_mid_drift_alerts_at_the_same_heartbeat() -> None:
    rng = np.random.default_rng(4)
    levels = np.r_[rng.normal(0.9, 0.03, 120), rng.normal(1.15, 0.03, 80)]
    beats = [Heartbeat(i, 500, 500 * (i + 1), float(v)) for i, v in enumerate(levels)]

    def first_alert(monitor: DriftMonitor, start: int) -> DriftAlert | None:
        for beat in beats[start:]:
            alert = monitor.update(beat)
            if alert is not None:
                return alert
        return None

    uninterrupted = first_alert(DriftMonitor(), 0)
    assert uninterrupted is not None and uninterrupted.heartbeat_index > 120
    before_crash = DriftMonitor()
    for beat in beats[:125]:
        assert before_crash.update(beat) is None
    restored = DriftMonitor()
    restored.restore(json.loads(json.dumps(before_crash.state())))
    assert first_alert(restored, 125) == uninterrupted
    assert first_alert(DriftMonitor(), 125) is None  # what a restart without state sees


def test_a_saved_state_with_a_non_finite_heartbeat_is_refused() -> None:
    monitor = DriftMonitor()
    with pytest.raises(ValueError, match="finite"):
        monitor.restore({"heartbeats": [0.9, "nan"], "changes": 0})
    assert monitor.window_size == 0


def test_split_means_finds_the_rise_after_a_larger_fall_when_asked_for_rises() -> None:
    values = np.r_[np.full(10, 2.0), np.full(40, 1.0), np.full(10, 1.3)]
    assert split_means(values, 5)[2] == 10  # the fall scores higher
    before, after, split = split_means(values, 5, rises_only=True)
    assert (split, before, after) == (50, pytest.approx(1.0), pytest.approx(1.3))
    assert split_means(np.linspace(2.0, 1.0, 20), 5, rises_only=True)[2] == 20  # no rise
