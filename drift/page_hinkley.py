"""river's Page-Hinkley test, fed a whole heartbeat of values in one compiled loop.

The event monitor feeds its detector every labelled event's error. river's
``PageHinkley.update`` is a few lines of Python per value, which at one call per event
was the largest part of the monitor's cost on the ingest path. This class runs the
same recurrence, in the same order of floating-point operations, over an array at a
time (numba, no fast-math), so every sum and every drift signal is bit for bit the one
river's would give; ``update`` keeps river's one-value interface for the places that
feed a value at a time.

References
----------
E. S. Page. "Continuous inspection schemes." Biometrika 41 (1/2), 1954, pp. 100-115.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from river.base import DriftDetector as RiverDetector

__all__ = ["PageHinkley"]

_MODES = {"up": 0, "down": 1, "both": 2}
# Slots of the state vector: river's Mean (count, mean), the two cumulative sums, their
# extremes, and whether the last value signalled a drift (1.0) or not (0.0).
_N, _MEAN, _SUM_UP, _SUM_DOWN, _MIN_UP, _MAX_DOWN, _DRIFT = range(7)


def _fresh_state() -> np.ndarray:
    """The state river's ``_reset`` leaves behind."""
    return np.array([0.0, 0.0, 0.0, 0.0, np.inf, -1.0, 0.0])


@njit(cache=True, nogil=True)
def _page_hinkley(
    values: np.ndarray,
    state: np.ndarray,
    min_instances: float,
    delta: float,
    threshold: float,
    alpha: float,
    mode: int,
    hits: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Feed ``values`` in order, updating ``state`` in place; writes the indices of the
    values that signalled a drift into ``hits`` and returns how many there are.

    Each step is river's ``PageHinkley.update`` with its operations in the same order.
    """
    found = 0
    for k in range(values.size):
        x = values[k]
        if state[6] != 0.0:  # the previous value signalled: start afresh
            state[0] = 0.0
            state[1] = 0.0
            state[2] = 0.0
            state[3] = 0.0
            state[4] = np.inf
            state[5] = -1.0
            state[6] = 0.0
        state[0] += 1.0
        state[1] += (1.0 / state[0]) * (x - state[1])
        dev = x - state[1]
        state[2] = alpha * state[2] + dev - delta
        state[3] = alpha * state[3] + dev + delta
        if state[2] < state[4]:
            state[4] = state[2]
        if state[3] > state[5]:
            state[5] = state[3]
        if state[0] >= min_instances:
            up = state[2] - state[4] > threshold
            down = state[5] - state[3] > threshold
            if mode == 0:
                drift = up
            elif mode == 1:
                drift = down
            else:
                drift = up or down
            state[6] = 1.0 if drift else 0.0
            if drift:
                hits[found] = k
                found += 1
    return found


class PageHinkley(RiverDetector):
    """river's ``PageHinkley`` with an ``update_many`` that feeds an array at once.

    Parameters are river's, with its defaults: ``min_instances`` values before a drift
    may be signalled, the tolerance ``delta``, the ``threshold`` (lambda) on the
    cumulative deviation, the forgetting factor ``alpha`` and the ``mode`` ("up",
    "down" or "both") of the changes watched.

    Examples
    --------
    >>> import numpy as np
    >>> import river.drift
    >>> rng = np.random.default_rng(1)
    >>> values = np.r_[rng.random(1_000), rng.random(1_000) + 4.0]
    >>> detector = PageHinkley(threshold=20.0)
    >>> detector.update_many(values).tolist()
    [1002]
    >>> theirs = river.drift.PageHinkley(threshold=20.0)
    >>> [k for k, x in enumerate(values.tolist()) if theirs.update(x) or theirs.drift_detected]
    [1002]
    >>> detector.update(0.5)
    >>> detector.drift_detected
    False
    """

    def __init__(
        self,
        min_instances: int = 30,
        delta: float = 0.005,
        threshold: float = 50.0,
        alpha: float = 1 - 0.0001,
        mode: str = "both",
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"Invalid 'mode'. Valid values are: {sorted(_MODES)}")
        self.min_instances = min_instances
        self.delta = delta
        self.threshold = threshold
        self.alpha = alpha
        self.mode = mode
        super().__init__()
        self._reset()

    def _reset(self) -> None:
        super()._reset()
        self._state = _fresh_state()

    @property
    def drift_detected(self) -> bool:
        return bool(self._state[_DRIFT])

    def update(self, x: float) -> None:
        """Feed one value (river's interface); ``drift_detected`` says whether it
        signalled."""
        self.update_many(np.array([x], dtype=np.float64))

    def update_many(self, values: np.ndarray) -> np.ndarray:
        """Feed ``values`` (shape ``(n,)``) in order; the indices of those that signalled
        a drift, ascending. Afterwards ``drift_detected`` is the last value's."""
        values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        hits = np.empty(values.size, dtype=np.int64)
        found = _page_hinkley(
            values,
            self._state,
            float(self.min_instances),
            float(self.delta),
            float(self.threshold),
            float(self.alpha),
            _MODES[self.mode],
            hits,
        )
        return hits[:found]
