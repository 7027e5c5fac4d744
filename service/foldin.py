"""Running sums per key inside a batch, with exponential forgetting.

The serving model keeps, per user, ridge statistics (a Gram matrix and a vector) that
every labelled event adds to. To predict event j exactly as if events arrived one at a
time, event j must see the statistics of every earlier event of its key, earlier events
of the same batch included. With forgetting, each new event of a key first multiplies
that key's statistics by ``decay``, so the newest evidence weighs most:

    S_k = decay · S_{k-1} + v_k

One stable sort groups the batch by key; a cumulative sum of v_i · decay^(−i) over each
group then gives every prefix, and multiplying back by decay^(k−1) gives S before event
k. ``chunk_limit`` bounds the batch so decay^(−i) stays far from overflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: decay^(−i) is kept below this, so prefix sums keep ~10 significant digits.
_MAX_SCALE = 1e6
_MAX_CHUNK = 2_048


def chunk_limit(decay: float) -> int:
    """The most events one call may group, for ``decay`` in (0, 1].

    >>> chunk_limit(1.0), chunk_limit(0.95)
    (2048, 269)
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
