"""Prequential ("test-then-train") accuracy of several predictors over one stream.

Each labelled event is first predicted by the model serving at that moment and only
then learned from, so the running error is an honest out-of-sample measure (see
``docs/architecture.md``, "Drift detection"). Tracks let Driftline, a never-retrained
model and river's BiasedMF be compared side by side on exactly the same events.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["PrequentialTracker", "squared_errors"]


def squared_errors(y_true: ArrayLike, y_pred: ArrayLike) -> np.ndarray:
    """Squared errors of the labelled events; NaN targets (unlabelled events) are dropped.

    Parameters
    ----------
    y_true
        Observed ratings, shape ``(n,)``; NaN where the event carries no rating.
    y_pred
        Predictions for the same events, shape ``(n,)``.

    Returns
    -------
    numpy.ndarray
        Squared errors of the labelled events, in order, shape ``(m,)`` with ``m <= n``.

    Examples
    --------
    >>> squared_errors([4.0, float("nan"), 2.0], [3.5, 3.0, 3.0])
    array([0.25, 1.  ])
    """
    truth = np.asarray(y_true, dtype=np.float64).reshape(-1)
    pred = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    if truth.shape != pred.shape:
        raise ValueError(f"y_true and y_pred differ in length: {truth.size} != {pred.size}")
    labelled = ~np.isnan(truth)
    if not np.isfinite(pred[labelled]).all():
        raise ValueError("y_pred must be finite wherever y_true is labelled")
    return (truth[labelled] - pred[labelled]) ** 2


class PrequentialTracker:
    """Running RMSE of several named predictors (tracks) over one stream.

    Examples
    --------
    >>> tracker = PrequentialTracker()
    >>> tracker.record("driftline", [4.0, 3.0], [3.0, 3.0])
    >>> tracker.record("static", [4.0, 3.0], [2.0, 3.0])
    >>> for track, stats in tracker.summary().items():
    ...     print(track, round(stats["rmse"], 3), stats["count"])
    driftline 0.707 2
    static 1.414 2
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def record(self, track: str, y_true: ArrayLike, y_pred: ArrayLike) -> None:
        """Add the errors of one batch of predictions to ``track``.

        Parameters
        ----------
        track
            Name of the predictor, e.g. ``"driftline"``, ``"static"``, ``"river"``.
        y_true
            Observed ratings, shape ``(n,)``; NaN targets are ignored.
        y_pred
            The track's predictions, made before the events were learned from.
        """
        errors = squared_errors(y_true, y_pred)
        self._sums[track] = self._sums.get(track, 0.0) + float(errors.sum())
        self._counts[track] = self._counts.get(track, 0) + int(errors.size)

    def rmse(self, track: str) -> float | None:
        """Prequential RMSE of ``track``, or None when it has no labelled event yet."""
        count = self._counts.get(track, 0)
        return math.sqrt(self._sums[track] / count) if count else None

    def count(self, track: str) -> int:
        """Labelled events recorded for ``track``."""
        return self._counts.get(track, 0)

    def tracks(self) -> list[str]:
        """Track names, in the order they were first recorded."""
        return list(self._counts)

    def summary(self) -> dict[str, dict]:
        """``{track: {"rmse": float | None, "count": int}}`` for every track."""
        return {
            track: {"rmse": self.rmse(track), "count": self.count(track)} for track in self._counts
        }
