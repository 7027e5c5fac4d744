"""The items' online biases: shrunk, forgetting means of their residuals.

The fold-in (``service.serving.sequential``) learns, per item, a forgetting sum of
weighted residuals and of squared weights; this module owns those sums (one row per
item, bounded, ``service.serving.rows``) and reads biases from them, for predictions and,
shrunk harder towards the version's bias, for ranking.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.serving.rows import LruRows

#: Most events one fold-in call takes: long replays go in chunks of this many, and the
#: bounds on users and items are never below it, so the keys a chunk has just learnt
#: are never the ones evicted after it.
LEARN_CHUNK = 2_048


class OnlineBiases:
    """A bias per key: the shrunk, forgetting mean of the residuals it has been given.

    bias = Σ decayᵃᵍᵉ · w · residual / (regularization + Σ decayᵃᵍᵉ · w²), where w is the
    residual's weight and a residual's age counts the key's later events. The fold-in
    kernel keeps the two sums per key (``rows["sum"]`` and ``rows["count"]``); a key
    never seen, or evicted (at most ``max_keys`` are kept, least recently seen evicted
    first), has bias zero.

    Examples
    --------
    >>> biases = OnlineBiases(regularization=1.0)
    >>> rows = biases.rows.rows_for(["a", "b"])
    >>> biases.rows["sum"][rows], biases.rows["count"][rows] = [3.0, 2.0], [2.0, 1.0]
    >>> biases.values(["a", "b", "c"]).tolist()
    [1.0, 1.0, 0.0]
    """

    def __init__(
        self, regularization: float, forgetting: float = 1.0, max_keys: int | None = None
    ) -> None:
        self.regularization = regularization
        self.forgetting = forgetting
        self.rows = LruRows({"sum": (), "count": ()}, max_keys)

    def __len__(self) -> int:
        return len(self.rows)

    def values(
        self,
        keys: Sequence[str],
        regularization: float | None = None,
        prior: np.ndarray | None = None,
    ) -> np.ndarray:
        """Current bias of each key (n,), zero (or ``prior``) for keys never seen."""
        get = self.rows.index.get
        rows = np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        out = np.zeros(len(keys)) if prior is None else np.array(prior, dtype=np.float64)
        seen = rows >= 0
        out[seen] = self.biases_of_rows(
            rows[seen], regularization, None if prior is None else out[seen]
        )
        return out

    def biases_of_rows(
        self, rows: np.ndarray, regularization: float | None = None, prior: np.ndarray | None = None
    ) -> np.ndarray:
        """The bias of the keys at ``rows``, shrunk towards ``prior`` (None: zero).

        ``regularization`` shrinks the same sums harder (or less) than the biases the
        predictions use: ranking wants a key with few residuals pulled further towards
        its prior than predicting its next rating does (None: the biases' own).

        >>> biases = OnlineBiases(regularization=1.0)
        >>> rows = biases.rows.rows_for(["a"])
        >>> biases.rows["sum"][rows], biases.rows["count"][rows] = 4.5, 2.0
        >>> biases.biases_of_rows(rows).tolist(), biases.biases_of_rows(rows, 9.0).tolist()
        ([1.5], [0.4090909090909091])
        """
        shrink = self.regularization if regularization is None else regularization
        total = self.rows["sum"][rows]
        if prior is not None:
            total = total + shrink * prior
        return total / (shrink + self.rows["count"][rows])

    def evict(self) -> list[str]:
        """Forget the least recently seen keys over the limit; returns them."""
        return self.rows.evict()

    def export_state(self, prefix: str) -> dict[str, np.ndarray]:
        """A copy of the sums per key (``LruRows.export_state``)."""
        return self.rows.export_state(prefix)

    def load_state(self, state: dict[str, np.ndarray], prefix: str) -> None:
        """Take the sums ``export_state`` wrote."""
        self.rows.load_state(state, prefix)
