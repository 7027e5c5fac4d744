"""The top-K selection of ``/recommend``: ``functions.mf.top_k``'s answer in fewer passes.

``top_k`` builds a mask of the rows kept, gathers their scores and scans them twice more
for the rows tied with the k-th score: six passes over the catalogue per request, each
allocating, around an ``argpartition`` that alone cost about 90 µs for MovieLens' 5,800
items here. Serving owns the score array it selects from, so it marks excluded rows in
place with −∞, and it narrows the partition down first: the k-th largest of the maxima
of ``_BLOCKS`` blocks is a score that at least k rows reach, so only the rows at or
above it (a few dozen) need partitioning; that cut the selection to a third. A last
pass counts the rows tied with the k-th score, and only when ties cross the
partition's edge (practically never with real-valued factors) are the lowest-indexed
tied rows looked up. The answer is ``top_k``'s exactly (``tests/service/test_topk.py``
checks it on ties and exclusions).
"""

from __future__ import annotations

import numpy as np

#: Blocks whose maxima bound the k-th score from below, and the fewest rows per block.
_BLOCKS = 64
_BLOCK_ROWS = 16


def best_rows(
    scores: np.ndarray, k: int, excluded: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best rows of ``scores`` (n,), best first, ties to the lower row.

    ``scores`` is overwritten (excluded rows become −∞); rows in ``excluded`` never come
    back, so fewer than ``k`` rows do when fewer are eligible. Scores must not be NaN.

    Examples
    --------
    >>> rows, top = best_rows(np.array([0.1, 0.9, 0.5, 0.7]), 2, np.array([1]))
    >>> rows.tolist(), top.tolist()
    ([3, 2], [0.7, 0.5])
    """
    n = len(scores)
    if excluded is not None and len(excluded):
        scores[excluded] = -np.inf
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64), scores[:0]
    if k < n:
        pool = _reaching(scores, k)
        chosen = pool[np.argpartition(scores[pool], len(pool) - k)[len(pool) - k :]]
        threshold = scores[chosen].min()
        inside = np.count_nonzero(scores[chosen] == threshold)
        if inside < np.count_nonzero(scores == threshold):  # ties cross the edge
            better = chosen[scores[chosen] > threshold]
            tied = np.flatnonzero(scores == threshold)[: k - len(better)]
            chosen = np.concatenate([better, tied])
    else:
        chosen = np.arange(n)
    chosen = chosen[np.lexsort((chosen, -scores[chosen]))]
    if excluded is not None and len(excluded):
        chosen = chosen[scores[chosen] > -np.inf]
    return chosen.astype(np.int64, copy=False), scores[chosen]


def _reaching(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows whose score reaches the k-th largest block maximum: at least ``k`` rows,
    among them every row of the top ``k`` (all rows where blocks would not help)."""
    n = len(scores)
    blocks = min(_BLOCKS, n // _BLOCK_ROWS)
    if 4 * k > blocks:
        return np.arange(n)
    width = n // blocks
    maxima = scores[: blocks * width].reshape(blocks, width).max(axis=1)
    return np.flatnonzero(scores >= np.partition(maxima, blocks - k)[blocks - k])
