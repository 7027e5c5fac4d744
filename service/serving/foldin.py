"""Running sums per key inside a batch, with exponential forgetting.

The serving model keeps, per user, ridge statistics (a Gram matrix and a vector) that
every labelled event adds to. To predict event j exactly as if events arrived one at a
time, event j must see the statistics of every earlier event of its key, earlier events
of the same batch included. With forgetting, each new event of a key first multiplies
that key's statistics by ``decay``, so the newest evidence weighs most:

    S_k = decay · S_{k-1} + v_k

One stable sort groups the batch by key; a cumulative sum of v_i · decay^(−i) over each
group then gives every prefix, and multiplying back by decay^(k−1) gives S before event
k. ``chunk_limit`` bounds the batch so decay^(−i) cannot overflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.serving.rows import LruRows

#: decay^(−i) is kept below this so nothing overflows. Precision does not suffer from
#: large scales: the rounding error of a prefix is relative to decay^(−k) and is
#: multiplied back by decay^(k−1), so it stays relative to the decayed sum itself.
_MAX_SCALE = 1e150
_MAX_CHUNK = 2_048


def chunk_limit(decay: float) -> int:
    """The most events one call may group, for ``decay`` in (0, 1].

    >>> chunk_limit(1.0), chunk_limit(0.95), chunk_limit(0.5)
    (2048, 2048, 498)
    """
    if decay >= 1.0:
        return _MAX_CHUNK
    return max(16, min(_MAX_CHUNK, int(math.log(_MAX_SCALE) / -math.log(decay))))


@dataclass(frozen=True)
class GroupSums:
    """Decayed sums over each event's earlier events of the same key.

    Attributes
    ----------
    unique_rows
        The keys' rows that occur in the batch, (m,).
    stored_weight
        At each event (n,), the weight the statistics stored before the batch carry:
        decay^(earlier events of its key in the batch).
    final_weight
        Per unique row (m,), the weight of the stored statistics after the batch.
    before
        Per input, (n, ...): decayed sum of the earlier events of the same key.
    totals
        Per input, (m, ...): decayed sum of all the key's events, as of the batch's end.
    """

    unique_rows: np.ndarray
    stored_weight: np.ndarray
    final_weight: np.ndarray
    before: list[np.ndarray]
    totals: list[np.ndarray]


def decayed_group_sums(
    rows: np.ndarray, values: Sequence[np.ndarray], decay: float = 1.0
) -> GroupSums:
    """Prefix sums per key (``rows``, n) of each array in ``values`` (n, ...).

    Examples
    --------
    >>> sums = decayed_group_sums(np.array([3, 5, 3]), [np.array([1.0, 10.0, 100.0])], 0.5)
    >>> sums.before[0].tolist(), sums.unique_rows.tolist(), sums.totals[0].tolist()
    ([0.0, 0.0, 1.0], [3, 5], [100.5, 10.0])
    >>> sums.stored_weight.tolist(), sums.final_weight.tolist()
    ([1.0, 1.0, 0.5], [0.25, 0.5])
    """
    order = np.argsort(rows, kind="stable")
    unique_rows, starts, counts = np.unique(rows[order], return_index=True, return_counts=True)
    group = np.repeat(np.arange(len(starts)), counts)
    position = np.arange(len(rows)) - starts[group]
    if len(rows) and position.max() >= chunk_limit(decay) + 1:
        raise ValueError(f"a key repeats {position.max() + 1} times; split the batch first")
    unscale = decay ** -position.astype(np.float64)
    rescale = decay ** (position - 1.0)
    before_all, totals_all = [], []
    for array in values:
        shape = (-1,) + (1,) * (array.ndim - 1)
        scaled = array[order] * unscale.reshape(shape)
        running = np.cumsum(scaled, axis=0)
        end = running[starts + counts - 1]
        running -= scaled
        at_start = running[starts]
        running -= at_start[group]
        running *= rescale.reshape(shape)
        before = np.empty_like(running)
        before[order] = running
        before_all.append(before)
        totals_all.append((end - at_start) * (decay ** (counts - 1.0)).reshape(shape))
    stored_weight = np.empty(len(rows))
    stored_weight[order] = decay**position
    return GroupSums(unique_rows, stored_weight, decay**counts, before_all, totals_all)


class OnlineBiases:
    """A bias per key: the shrunk, forgetting mean of the residuals it has been given.

    bias = Σ decayᵃᵍᵉ · w · residual / (regularization + Σ decayᵃᵍᵉ · w²), where w is the
    residual's weight (1 unless given) and a residual's age
    counts the key's later events. A key never seen, or evicted (at most ``max_keys`` are
    kept, least recently seen evicted first), has bias zero.

    Examples
    --------
    >>> biases = OnlineBiases(regularization=1.0, forgetting=1.0)
    >>> biases.learn_sequential(["a", "b", "a"], np.array([2.0, 4.0, 2.0])).tolist()
    [0.0, 0.0, 1.0]
    >>> biases.values(["a", "b", "c"]).tolist()
    [1.3333333333333333, 2.0, 0.0]
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
        """Current bias of each key (n,), zero for keys never seen.

        ``regularization`` shrinks the same sums harder (or less) than the biases the
        predictions use: ranking wants a key with few residuals pulled further to zero
        than predicting its next rating does (None: the biases' own).

        >>> biases = OnlineBiases(regularization=1.0)
        >>> _ = biases.learn_sequential(["a", "a", "a"], np.array([2.0, 2.0, 2.0]))
        >>> biases.values(["a"]).tolist(), biases.values(["a"], regularization=9.0).tolist()
        ([1.5], [0.5])
        """
        index = self.rows.index
        rows = np.fromiter((index.get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        out = np.zeros(len(keys)) if prior is None else np.array(prior, dtype=np.float64)
        seen = rows >= 0
        out[seen] = self._bias(rows[seen], regularization, None if prior is None else out[seen])
        return out

    def learn_sequential(
        self, keys: Sequence[str], residuals: np.ndarray, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """Each event's bias from the key's earlier residuals (n,); then absorbs them all.

        With ``weights`` w, a residual measures the bias scaled by w (residual ≈ w · b),
        and the bias is its ridge least-squares estimate, Σ w · residual / (λ + Σ w²):
        a residual of weight zero says nothing, one of weight −1 says the opposite.

        >>> biases = OnlineBiases(regularization=1.0)
        >>> _ = biases.learn_sequential(["a", "a"], np.array([1.0, -1.0]), np.array([1.0, -1.0]))
        >>> biases.values(["a"]).tolist()
        [0.6666666666666666]
        """
        rows = self.rows.rows_for(keys)
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
        sums = decayed_group_sums(rows, [w * residuals, w * w], self.forgetting)
        weight = sums.stored_weight
        stored_sum, stored_count = self.rows["sum"], self.rows["count"]
        total = weight * stored_sum[rows] + sums.before[0]
        count = weight * stored_count[rows] + sums.before[1]
        unique, final = sums.unique_rows, sums.final_weight
        stored_sum[unique] = final * stored_sum[unique] + sums.totals[0]
        stored_count[unique] = final * stored_count[unique] + sums.totals[1]
        return total / (self.regularization + count)

    def evict(self) -> list[str]:
        """Forget the least recently seen keys over the limit; returns them."""
        return self.rows.evict()

    def export_state(self, prefix: str) -> dict[str, np.ndarray]:
        """A copy of the sums per key (``LruRows.export_state``)."""
        return self.rows.export_state(prefix)

    def load_state(self, state: dict[str, np.ndarray], prefix: str) -> None:
        """Take the sums ``export_state`` wrote."""
        self.rows.load_state(state, prefix)

    def _bias(
        self, rows: np.ndarray, regularization: float | None = None, prior: np.ndarray | None = None
    ) -> np.ndarray:
        shrink = self.regularization if regularization is None else regularization
        total = self.rows["sum"][rows] if prior is None else self.rows["sum"][rows] + shrink * prior
        return total / (shrink + self.rows["count"][rows])
