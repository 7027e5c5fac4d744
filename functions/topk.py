"""The `k` best-scoring rows of a score vector: the reference top-K of a recommendation.

Kept apart from the model because it ranks any scores, a trained user's or one folded
in on the fly; the server's faster selection is checked against it.
"""

from __future__ import annotations

import numpy as np

from functions.mf_checks import check_int

__all__ = ["top_k"]


def top_k(
    scores: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best-scoring rows, best first, leaving out the rows in `exclude`.

    Uses ``np.argpartition`` (O(n)) and sorts only the `k` selected, which matters when
    scoring every item per request. Ties are broken by the lower row index, so the
    answer is deterministic. Fewer than `k` rows come back when fewer are eligible.
    Scores must not be NaN.

    Parameters
    ----------
    scores
        Score of every row, shape (n,).
    k
        How many rows to return (>= 0).
    exclude
        Row indices to leave out (e.g. items the user has rated); may repeat.

    Returns
    -------
    indices, scores
        Row indices (int64) and their scores, each shape (min(k, eligible),).

    Examples
    --------
    >>> idx, best = top_k(np.array([0.1, 0.9, 0.5, 0.7]), 2, exclude=np.array([1]))
    >>> idx.tolist(), best.tolist()
    ([3, 2], [0.7, 0.5])
    """
    scores = np.asarray(scores)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {scores.shape}")
    check_int("k", k, minimum=0)
    if exclude is not None and len(exclude):
        keep = np.ones(len(scores), dtype=bool)
        keep[np.asarray(exclude, dtype=np.int64)] = False
        candidates = np.flatnonzero(keep)
    else:
        candidates = np.arange(len(scores))
    pool = scores[candidates]
    k = min(k, len(pool))
    if k == 0:
        return np.zeros(0, dtype=np.int64), pool[:0]
    if k < len(pool):
        # argpartition picks arbitrarily among rows tied with the k-th score; take the
        # strictly better rows and then the lowest-indexed of the tied ones.
        threshold = pool[np.argpartition(-pool, k - 1)[k - 1]]
        better = np.flatnonzero(pool > threshold)
        tied = np.flatnonzero(pool == threshold)[: k - len(better)]
        chosen = np.concatenate([better, tied])
    else:
        chosen = np.arange(len(pool))
    chosen = chosen[np.lexsort((chosen, -pool[chosen]))]
    return candidates[chosen].astype(np.int64, copy=False), pool[chosen]
