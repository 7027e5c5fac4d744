"""The river detector of :class:`drift.event_monitor.EventDriftMonitor` and its feeding.

The monitor hands over each normalised error; the feed passes it on as it is, as the
mean of a block of errors, or divided by the regime's level, and reports whether river
signalled a change. Only ADWIN's window can be saved exactly, so the feed also reads
and writes that window for the monitor's state.

Page-Hinkley, the default detector, is ``drift.page_hinkley.PageHinkley``
(``drift.detector_classes`` picks it): river's test with the same arithmetic, run over
a heartbeat's values in one compiled loop (``feed_all``) instead of one Python call per
event.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from river.base import DriftDetector as RiverDetector

from drift.detector_classes import detector_class

__all__ = ["RiverFeed"]


class RiverFeed:
    """A river detector fed normalised errors, in blocks and levelled as configured.

    Parameters
    ----------
    detector, detector_params
        Class name in ``river.drift`` and its keyword arguments.
    block
        Errors averaged into each value the detector sees (1: every error).
    level_events
        0 feeds the values as they are; otherwise the mean of the first
        ``level_events`` errors is the level every value is divided by.

    Attributes
    ----------
    changes : int
        Changes the detector signalled, confirmed or not.
    partial : list[float]
        Errors of the block not yet complete.
    level : float | None
        The regime's level; None until learnt, or when values are fed as they are.
    """

    def __init__(
        self, detector: str, detector_params: dict[str, Any], block: int, level_events: int
    ) -> None:
        self.river: RiverDetector = detector_class(detector)(**detector_params)
        self.block = block
        self.level_events = level_events
        self.changes = 0
        self.partial: list[float] = []
        self.level: float | None = None
        #: Values awaiting the level.
        self._unleveled: list[float] = []

    def feed(self, value: float) -> bool:
        """Pass ``value`` (or, with ``block`` > 1, a completed block's mean) to the river
        detector; whether it signalled a change."""
        changed = self._feed(value)
        if changed:
            self.changes += 1
        return changed

    def feed_all(self, values: np.ndarray) -> list[int]:
        """``feed`` each of ``values`` (shape ``(n,)``) in order; the indices of those
        after which the detector signalled a change, ascending.

        A detector with ``update_many`` fed every value as it is (``block`` 1) takes
        the values in one call once the level is known; the others, and the values
        that learn the level, go through ``feed`` one at a time. Either way the
        detector sees the same values in the same order.
        """
        update_many = getattr(self.river, "update_many", None)
        if update_many is None or self.block > 1:
            return [k for k, value in enumerate(values.tolist()) if self.feed(value)]
        signalled: list[int] = []
        start = 0
        while self.level_events and self.level is None and start < values.size:
            if self.feed(float(values[start])):
                signalled.append(start)
            start += 1
        rest = values[start:]
        if self.level_events:
            rest = rest / self.level
        hits = update_many(rest)
        self.changes += int(hits.size)
        signalled.extend((hits + start).tolist())
        return signalled

    def _feed(self, value: float) -> bool:
        if self.block > 1:
            self.partial.append(value)
            if len(self.partial) < self.block:
                return False
            value = sum(self.partial) / self.block
            self.partial = []
        if not self.level_events:
            self.river.update(value)
            return bool(self.river.drift_detected)
        if self.level is None:
            self._unleveled.append(value)
            if len(self._unleveled) < max(1, self.level_events // self.block):
                return False
            self.level = max(float(np.mean(self._unleveled)), 1e-9)
            pending, self._unleveled = self._unleveled, []
            return any(self._update(v / self.level) for v in pending)
        return self._update(value / self.level)

    def _update(self, value: float) -> bool:
        self.river.update(value)
        return bool(self.river.drift_detected)

    def adwin_window(self) -> bytes | None:
        """ADWIN's bucket structure as its own serialisation writes it, or None for other
        detectors (river keeps ADWIN's window in a compiled helper with that format)."""
        helper = getattr(self.river, "_helper", None)
        if helper is None or not hasattr(helper, "__reduce_ex__"):
            return None
        reduced = helper.__reduce_ex__(4)
        window = reduced[2] if len(reduced) > 2 else None
        return window if isinstance(window, bytes) else None

    def load_adwin_window(self, window: bytes) -> bool:
        """Put ``window`` back into the detector's helper; False when it has none."""
        helper = getattr(self.river, "_helper", None)
        if helper is None or not hasattr(helper, "__setstate__"):
            return False
        helper.__setstate__(window)
        return True
