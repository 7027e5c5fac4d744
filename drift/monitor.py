"""ADWIN drift monitor on the heartbeat RMSE series, with a minimum-drop confirmation.

ADWIN alone answers "did the mean of this series change?". A recommender needs a
narrower question answered: "did the serving model get clearly worse?". An ADWIN change
therefore becomes a ``DriftAlert`` only when the error level after the change is at
least ``min_relative_drop`` above the level before it, since every alert is a retrain
to pay for (``docs/decisions/0001-drift-detector-and-heartbeats.md``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from drift.base import DriftDetector
from drift.detector_classes import detector_class
from drift.heartbeat import Heartbeat

__all__ = ["DriftAlert", "DriftMonitor", "split_means"]

# Heartbeats remembered for locating a change inside ADWIN's window. ADWIN's own window
# is unbounded while the stream is stationary; at 500 events per heartbeat this is 25M
# events, far beyond any window in which a change-point estimate still matters.
_RECORD_LIMIT = 50_000


@dataclass(frozen=True)
class DriftAlert:
    """A confirmed drop in the serving model's accuracy.

    Attributes
    ----------
    metric
        The monitored series; ``"rmse"``.
    before
        Mean heartbeat RMSE of the older part of ADWIN's window, before the change.
    after
        Mean heartbeat RMSE of the recent part of ADWIN's window, after the change.
    events_seen
        ``events_seen`` of the heartbeat that raised the alert.
    heartbeat_index
        ``index`` of the heartbeat that raised the alert.
    change_events
        Estimated start of the change: the ``events_seen`` count at which the level
        ``after`` began (segment attribution and the retraining window start there).
        None when the detector cannot place it.
    detector
        Registry name of the detector that raised the alert.
    """

    metric: str
    before: float
    after: float
    events_seen: int
    heartbeat_index: int
    change_events: int | None = None
    detector: str = ""

    @property
    def relative_drop(self) -> float:
        """Relative loss of accuracy: ``after / before - 1`` (0.25 means 25% more error)."""
        if self.before == 0.0:
            return math.inf if self.after > 0.0 else 0.0
        return self.after / self.before - 1.0


class DriftMonitor(DriftDetector):
    """Watches heartbeat RMSE with ADWIN and confirms changes by their size.

    ADWIN (Bifet & Gavaldà, 2007) keeps the longest recent window whose mean is
    statistically the same throughout, and signals a change when two sub-windows'
    means differ by more than a bound set by ``delta``. river's implementation checks
    every heartbeat here (``clock=1``); heartbeats are few, so the cost is negligible.

    When ADWIN signals, the monitor locates the change inside the window ADWIN held
    (the split that best separates two mean levels, a least-squares change point) and
    compares ``before`` (mean of the older part) with ``after`` (mean of the recent
    part). It raises an alert only if ``after >= before * (1 + min_relative_drop)``:
    a change towards lower error, or a statistically real but small rise, is not worth
    a retrain.

    Detection delay is counted in heartbeats, not events: ADWIN's cut threshold holds a
    term ``2 / (3 m) * ln(2 ln(W) / delta)`` that does not shrink with the noise of the
    series, so a clear rise still takes tens of heartbeats. This is the baseline the
    per-event detectors (``drift.event_monitor``) are compared with.

    Parameters
    ----------
    delta
        ADWIN's significance level, in (0, 1); smaller means fewer false changes and a
        later detection.
    min_relative_drop
        Smallest relative rise of the RMSE that counts as drift, >= 0.
    min_heartbeats
        ADWIN's grace period and minimum sub-window length, in heartbeats (>= 1):
        no change is declared on fewer heartbeats on either side of the cut.
    seed
        Unused (ADWIN is deterministic); accepted so every detector is built alike.

    Examples
    --------
    >>> import numpy as np
    >>> from drift.heartbeat import Heartbeat
    >>> rng = np.random.default_rng(0)
    >>> levels = np.r_[rng.normal(0.9, 0.02, 100), rng.normal(1.2, 0.02, 60)]
    >>> monitor = DriftMonitor()
    >>> for i, rmse in enumerate(levels):
    ...     alert = monitor.update(Heartbeat(i, 500, 500 * (i + 1), float(rmse)))
    ...     if alert is not None:
    ...         break
    >>> alert.heartbeat_index > 100, round(alert.before, 1), round(alert.after, 1)
    (True, 0.9, 1.2)

    References
    ----------
    Albert Bifet and Ricard Gavaldà. "Learning from time-changing data with adaptive
    windowing." Proceedings of the 2007 SIAM International Conference on Data Mining,
    pp. 443-448.
    """

    def __init__(
        self,
        delta: float = 0.002,
        min_relative_drop: float = 0.1,
        min_heartbeats: int = 5,
        seed: Any = None,
    ) -> None:
        super().__init__()
        if not (_is_real(delta) and 0.0 < delta < 1.0):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if not (_is_real(min_relative_drop) and 0.0 <= min_relative_drop < math.inf):
            raise ValueError(
                f"min_relative_drop must be a finite number >= 0, got {min_relative_drop!r}"
            )
        if isinstance(min_heartbeats, bool) or not isinstance(min_heartbeats, int | np.integer):
            raise ValueError(f"min_heartbeats must be an integer >= 1, got {min_heartbeats!r}")
        if min_heartbeats < 1:
            raise ValueError(f"min_heartbeats must be an integer >= 1, got {min_heartbeats!r}")
        self.delta = delta
        self.min_relative_drop = min_relative_drop
        self.min_heartbeats = min_heartbeats
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        """Restart the window; call it when the serving model is swapped.

        A new model has a new error level by design, so comparing it with the old
        model's heartbeats would only produce spurious changes.
        """
        adwin: Any = detector_class("ADWIN")  # river.drift.ADWIN, imported on first use
        self._adwin = adwin(
            delta=self.delta,
            clock=1,
            grace_period=self.min_heartbeats,
            min_window_length=self.min_heartbeats,
        )
        self._window: deque[float] = deque(maxlen=_RECORD_LIMIT)
        self._changes = 0
        self._drift_detected = False

    @property
    def window_size(self) -> int:
        """Heartbeats currently in ADWIN's window."""
        return int(self._adwin.width)

    @property
    def n_changes(self) -> int:
        """ADWIN changes since the last reset, confirmed as alerts or not.

        Changes minus alerts is how many retrains the confirmation rule saved.
        """
        return self._changes

    def state(self) -> dict[str, Any]:
        """The heartbeats since ADWIN last restarted, as plain JSON.

        Replayed, they rebuild ADWIN's window exactly (ADWIN is deterministic), so a
        restarted service detects as if it had never stopped. The state is data, not
        a pickle of river's object: loading it from the database cannot run code. Past
        ``_RECORD_LIMIT`` heartbeats without a change only the newest are kept, so the
        rebuilt window is that much shorter (a stationary stream of 25M events at 500
        events per heartbeat).
        """
        values = [] if self._adwin.drift_detected else list(self._window)
        return {"heartbeats": values, "changes": self._changes}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` returned, on a monitor with any parameters.

        Raises
        ------
        ValueError
            When a saved heartbeat is not a finite number; the monitor is left reset.
        """
        self.reset()
        values = np.asarray(state.get("heartbeats", []), dtype=np.float64).reshape(-1)
        if not np.isfinite(values).all():
            raise ValueError("saved heartbeats must be finite numbers")
        for value in values.tolist():
            self._window.append(value)
            self._adwin.update(value)
        self._changes = int(state.get("changes", 0))

    def update(self, heartbeat: Heartbeat) -> DriftAlert | None:
        """Feed one heartbeat; return an alert if it completes a confirmed drift.

        Parameters
        ----------
        heartbeat
            The next heartbeat of the serving model, in order.

        Returns
        -------
        DriftAlert or None
            The alert, also reflected by ``drift_detected`` until the next update.
        """
        value = float(heartbeat.rmse)
        if not math.isfinite(value):
            raise ValueError(f"heartbeat rmse must be finite, got {heartbeat.rmse!r}")
        if self._adwin.drift_detected:
            # river restarts ADWIN from empty on the update after any change (not only
            # the old sub-window, as in the paper); the record follows it.
            self._window.clear()
        self._window.append(value)
        self._adwin.update(value)
        self._drift_detected = False
        if not self._adwin.drift_detected:
            return None
        self._changes += 1
        values = np.fromiter(self._window, float)
        before, after, split = split_means(values, self.min_heartbeats)
        if after <= before or after < before * (1.0 + self.min_relative_drop):
            return None
        self._drift_detected = True
        return DriftAlert(
            metric="rmse",
            before=before,
            after=after,
            events_seen=heartbeat.events_seen,
            heartbeat_index=heartbeat.index,
            # Heartbeats are equal-sized but for time-closed ones: a close estimate.
            change_events=max(0, heartbeat.events_seen - (values.size - split) * heartbeat.events),
            detector="adwin-heartbeat",
        )


def split_means(
    values: np.ndarray, min_length: int, rises_only: bool = False
) -> tuple[float, float, int]:
    """Means of the two segments of ``values`` that best explain a change in level.

    river's ADWIN reports *that* its window changed, not where, and it drops only the
    oldest buckets until the cut is no longer significant; at the first detection that
    is a few old heartbeats, so the kept window is still mostly the old level. The
    split maximising ``k (n - k) / n * (mean_old - mean_new) ** 2`` (the least-squares
    single change point) recovers both levels instead.

    Parameters
    ----------
    values
        Heartbeat RMSEs of ADWIN's window, oldest first, shape ``(n,)``.
    min_length
        Fewest values either segment may hold.
    rises_only
        Find the change to a higher level. A record that opens higher (the first
        errors after a restart) can hold a fall larger than a recent rise of 20 %, and
        the least-squares split then finds the fall: a detector of rises must look for
        the rise (``bench policies``: a sudden drift confirmed 7,000 events late on Wiki).
        While the best split is a fall, the values before it are dropped and the split
        is searched again after it; where no rise is left the split is ``n``.

    Returns
    -------
    tuple
        ``(before, after, split)``: mean of the older and of the recent segment, and
        the number of values in the older one (with ``rises_only``, the older segment's
        mean counts only the values after any fall dropped).

    Examples
    --------
    >>> values = np.r_[np.full(3, 2.0), np.full(20, 1.0), np.full(5, 1.4)]
    >>> split_means(values, 3)[2], split_means(values, 3, rises_only=True)[2]
    (3, 23)
    >>> values = np.r_[np.full(5, 3.0), np.full(20, 1.0), np.full(5, 1.4)]
    >>> [round(v, 2) for v in split_means(values, 3, rises_only=True)]
    [1.0, 1.4, 25]
    >>> split_means(np.arange(6.0)[::-1], 2, rises_only=True)[2]
    6
    """
    offset = 0
    while True:
        before, after, split = _least_squares_split(values[offset:], min_length)
        if not rises_only or after > before:
            return before, after, offset + split
        offset += split
        if values.size - offset < 2 * min_length:
            level = float(values[offset - split :].mean())
            return level, level, values.size


def _least_squares_split(values: np.ndarray, min_length: int) -> tuple[float, float, int]:
    """The least-squares single change point of ``values`` (see ``split_means``)."""
    n = values.size
    low = max(1, min(min_length, n // 2))
    sizes = np.arange(low, n - low + 1)
    if sizes.size == 0:
        return float(values.mean()), float(values.mean()), n
    cumulative = np.cumsum(values)
    old_means = cumulative[sizes - 1] / sizes
    new_means = (cumulative[-1] - cumulative[sizes - 1]) / (n - sizes)
    score = sizes * (n - sizes) / n * (old_means - new_means) ** 2
    best = int(np.argmax(score))
    return float(old_means[best]), float(new_means[best]), int(sizes[best])


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
