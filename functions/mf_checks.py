"""Argument checks shared by the matrix-factorisation modules.

Each raises ValueError naming the argument, so a bad call fails at the boundary
instead of deep inside a numpy expression.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from functions.mf_rows import DTYPE

__all__ = [
    "as_ratings",
    "as_rows",
    "check_int",
    "check_real",
    "check_same_length",
    "clip_predictions",
]


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_real(name: str, value: object, positive: bool) -> None:
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        number = float(value)
        if np.isfinite(number) and (number > 0 if positive else number >= 0):
            return
    bound = "> 0" if positive else ">= 0"
    raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def check_same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays must have the same length, got {lengths}")


def as_rows(name: str, rows: np.ndarray, n_rows: int, allow_unknown: bool) -> np.ndarray:
    """Validate encoded rows: 1-D integers in [0, n_rows), or -1 where allowed."""
    a = np.asarray(rows)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
        raise ValueError(f"{name} must be a 1-D integer array, got {a.dtype} {a.shape}")
    a = a.astype(np.int64, copy=False)
    if a.size:
        low = -1 if allow_unknown else 0
        if a.min() < low or a.max() >= n_rows:
            raise ValueError(f"{name} holds rows outside [{low}, {n_rows}); grow() first?")
    return a


def as_ratings(ratings: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(ratings, dtype=DTYPE)
    if r.ndim != 1:
        raise ValueError(f"ratings must be 1-D, got shape {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ratings must be finite (no NaN or inf)")
    return r


def clip_predictions(pred: np.ndarray, clip: tuple[float, float] | None) -> np.ndarray:
    """``pred`` bounded to ``clip`` = (low, high) in place, or unchanged when None."""
    if clip is None:
        return pred
    low, high = clip
    if not low <= high:
        raise ValueError(f"clip must be (low, high) with low <= high, got {clip!r}")
    return np.clip(pred, low, high, out=pred)
