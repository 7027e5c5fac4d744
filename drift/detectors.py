"""Drift detectors by name, chosen by ``DRIFT_DETECTOR``.

Each entry builds a detector of the serving model's errors from the monitor settings
(significance, minimum relative rise, minimum heartbeats, rating range). New detectors
join here; the service never branches on a detector's type. ``driftline bench drift``
runs every entry on the same streams. Why the default is what it is:
``docs/decisions/0001-drift-detector-and-heartbeats.md``.

Examples
--------
>>> detector = make_detector("adwin-heartbeat", delta=0.01, min_relative_drop=0.1,
...                          min_heartbeats=5, rating_range=(0.5, 5.0))
>>> type(detector).__name__, detector.get_params()["delta"]
('DriftMonitor', 0.01)
>>> sorted(DETECTORS)
['adwin-event', 'adwin-heartbeat', 'kswin', 'page-hinkley']
"""

from __future__ import annotations

from typing import Protocol

from drift.base import DriftDetector
from drift.event_monitor import EventDriftMonitor
from drift.monitor import DriftMonitor

__all__ = ["DEFAULT_DETECTOR", "DETECTORS", "DetectorFactory", "make_detector"]


class DetectorFactory(Protocol):
    """Builds a detector from the monitor settings."""

    def __call__(
        self,
        *,
        delta: float,
        min_relative_drop: float,
        min_heartbeats: int,
        rating_range: tuple[float, float],
    ) -> DriftDetector: ...


def adwin_heartbeat(
    *,
    delta: float,
    min_relative_drop: float,
    min_heartbeats: int,
    rating_range: tuple[float, float],
) -> DriftDetector:
    """river's ADWIN on the heartbeat RMSE series, restarted at every swap (the baseline)."""
    return DriftMonitor(
        delta=delta, min_relative_drop=min_relative_drop, min_heartbeats=min_heartbeats
    )


def adwin_event(
    *,
    delta: float,
    min_relative_drop: float,
    min_heartbeats: int,
    rating_range: tuple[float, float],
) -> DriftDetector:
    """river's ADWIN on every event's squared error over the squared rating range.

    ``min_heartbeats`` becomes ADWIN's grace period in events (one heartbeat is 500
    of them at the defaults, and a window shorter than that is noise on ratings).
    """
    adwin = {"delta": delta, "clock": 32, "grace_period": 1_000, "min_window_length": 200}
    return EventDriftMonitor(
        "ADWIN",
        adwin,
        min_relative_drop=min_relative_drop,
        rating_range=rating_range,
        name="adwin-event",
    )


def page_hinkley(
    *,
    delta: float,
    min_relative_drop: float,
    min_heartbeats: int,
    rating_range: tuple[float, float],
) -> DriftDetector:
    """river's Page-Hinkley test (rises only) on every event's error relative to the
    stream's level (the mean of the first 1,000 after a reset): the default detector.

    Relative errors average 1 whatever the model's RMSE, so the tolerated drift per
    event is half the smallest rise that matters (``min_relative_drop / 2``) and the
    threshold the cumulative excess of 5,000 events at that tolerance (sizing:
    ``docs/decisions/0001-drift-detector-and-heartbeats.md``).
    """
    tolerance = max(min_relative_drop / 2, 1e-3)
    test = {
        "min_instances": 1_000,
        "delta": tolerance,
        "threshold": 5_000 * tolerance,
        "mode": "up",
    }
    return EventDriftMonitor(
        "PageHinkley",
        test,
        min_relative_drop=min_relative_drop,
        rating_range=rating_range,
        name="page-hinkley",
        level_events=1_000,
    )


def kswin(
    *,
    delta: float,
    min_relative_drop: float,
    min_heartbeats: int,
    rating_range: tuple[float, float],
) -> DriftDetector:
    """river's KSWIN (a Kolmogorov-Smirnov test between a recent and an older sample)
    on means of 50 events' normalised errors, so the test runs once per 50 events."""
    test = {"alpha": delta, "window_size": 100, "stat_size": 30, "seed": 0}
    return EventDriftMonitor(
        "KSWIN",
        test,
        min_relative_drop=min_relative_drop,
        rating_range=rating_range,
        name="kswin",
        block=50,
    )


DETECTORS: dict[str, DetectorFactory] = {
    "adwin-heartbeat": adwin_heartbeat,
    "adwin-event": adwin_event,
    "page-hinkley": page_hinkley,
    "kswin": kswin,
}

#: What ``DRIFT_DETECTOR`` defaults to (``service.settings`` names it too, without
#: importing river); see ``docs/decisions/0001-drift-detector-and-heartbeats.md``.
DEFAULT_DETECTOR = "page-hinkley"


def make_detector(
    name: str,
    *,
    delta: float,
    min_relative_drop: float,
    min_heartbeats: int,
    rating_range: tuple[float, float] = (0.5, 5.0),
) -> DriftDetector:
    """The detector registered as ``name``, built from the monitor settings.

    Raises
    ------
    ValueError
        When ``name`` is not in ``DETECTORS``; the message lists the names that are.
    """
    try:
        build = DETECTORS[name]
    except KeyError:
        choices = sorted(DETECTORS)
        raise ValueError(f"unknown drift detector {name!r}; choose from {choices}") from None
    return build(
        delta=delta,
        min_relative_drop=min_relative_drop,
        min_heartbeats=min_heartbeats,
        rating_range=rating_range,
    )
