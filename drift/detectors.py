"""Drift detectors by name, chosen by ``DRIFT_DETECTOR``.

Each entry builds a detector of the serving model's heartbeat series from the monitor
settings (significance, minimum relative rise, minimum heartbeats). New detectors join
here; the service never branches on a detector's type.

Examples
--------
>>> detector = make_detector("adwin-heartbeat", delta=0.01, min_relative_drop=0.1,
...                          min_heartbeats=5)
>>> type(detector).__name__, detector.get_params()["delta"]
('DriftMonitor', 0.01)
"""

from __future__ import annotations

from typing import Protocol

from drift.base import DriftDetector
from drift.monitor import DriftMonitor

__all__ = ["DETECTORS", "DetectorFactory", "make_detector"]


class DetectorFactory(Protocol):
    """Builds a heartbeat detector from the monitor settings (a detector's class fits)."""

    def __call__(
        self, *, delta: float, min_relative_drop: float, min_heartbeats: int
    ) -> DriftDetector: ...


DETECTORS: dict[str, DetectorFactory] = {
    # river's ADWIN on the heartbeat RMSE series, confirmed by a minimum relative rise.
    "adwin-heartbeat": DriftMonitor,
}


def make_detector(
    name: str, *, delta: float, min_relative_drop: float, min_heartbeats: int
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
    return build(delta=delta, min_relative_drop=min_relative_drop, min_heartbeats=min_heartbeats)
