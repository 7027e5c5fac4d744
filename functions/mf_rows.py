"""The id → row tables of :class:`functions.mf.BiasedMF`: id encoding and row storage.

Each side of the model (users, items) maps string ids to dense rows on first sight and
keeps one bias and one factor vector per row, in storage that grows as ids arrive
(:class:`IdRows`). :class:`UserItemRows` pairs the two sides; the model inherits from it
the id encoding and the views on its learned arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from functions.ids import Ids, look_up

__all__ = ["DTYPE", "IdRows", "UserItemRows"]

#: Floating point type of every learned array. float64 keeps round trips and
#: seeded runs bit-exact and is what ``np.bincount`` accumulates in anyway, so float32
#: would add conversions on the hot path for little gain at these batch sizes.
DTYPE = np.float64

_MIN_CAPACITY = 16


class IdRows:
    """A growable id → row table with one bias and one factor vector per row.

    Storage is over-allocated and doubled when full, so that adding a few new ids per
    batch costs amortised O(new ids) instead of copying the whole table each time.
    The public views (`bias`, `factors`) cover only the rows in use.
    """

    def __init__(self, factors: int) -> None:
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self._bias = np.zeros(0, dtype=DTYPE)
        self._factors = np.zeros((0, factors), dtype=DTYPE)

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def bias(self) -> np.ndarray:
        """Biases of the rows in use, shape (size,); a writable view."""
        return self._bias[: self.size]

    @property
    def factors(self) -> np.ndarray:
        """Factor vectors of the rows in use, shape (size x factors); a writable view."""
        return self._factors[: self.size]

    def new_ids(self, ids: Iterable[str]) -> list[str]:
        """Ids not yet in the table, once each, in order of first appearance."""
        index = self.index
        return [str(x) for x in dict.fromkeys(ids) if x not in index]

    def append(self, ids: list[str], vectors: np.ndarray) -> None:
        """Add rows for `ids` (all new) with zero bias and the given factor rows."""
        start, stop = self.size, self.size + len(ids)
        if stop > len(self._bias):
            self._reserve(max(stop, 2 * len(self._bias), _MIN_CAPACITY))
        self._bias[start:stop] = 0.0
        self._factors[start:stop] = vectors
        self.index.update(zip(ids, range(start, stop), strict=True))
        self.ids.extend(ids)

    def _reserve(self, capacity: int) -> None:
        bias = np.zeros(capacity, dtype=DTYPE)
        factors = np.zeros((capacity, self._factors.shape[1]), dtype=DTYPE)
        bias[: self.size] = self.bias
        factors[: self.size] = self.factors
        self._bias, self._factors = bias, factors

    def encode(self, ids: Sequence[str]) -> np.ndarray:
        """Row index of each id, -1 for ids not in the table; int64, shape (len(ids),).

        ``map`` over ``dict.get`` rather than a generator: ingestion encodes dozens of
        id lists a batch. A batch's :class:`functions.ids.Ids` are looked up once per
        size of the table (rows are only ever added) and the answer shared, read-only.
        """
        if isinstance(ids, Ids):
            return ids.encoded(self, self.size, self._look_up)
        return self._look_up(ids)

    def _look_up(self, ids: Sequence[str]) -> np.ndarray:
        return look_up(ids, self, self.index.get, size=self.size)  # rows are only added


class UserItemRows:
    """The users' and the items' id tables of a model, and views on their rows.

    Attributes
    ----------
    user_ids, item_ids : list[str]
        Id of each row, in row order.
    user_index, item_index : dict[str, int]
        Id → row.
    user_bias : np.ndarray
        Shape (n_users,).
    item_bias : np.ndarray
        Shape (n_items,).
    user_factors : np.ndarray
        Shape (n_users x factors).
    item_factors : np.ndarray
        Shape (n_items x factors).

    The array attributes are writable views into storage that adding rows may
    reallocate: read them again after growing instead of keeping references.
    """

    def __init__(self, factors: int) -> None:
        self._users = IdRows(factors)
        self._items = IdRows(factors)

    @property
    def n_users(self) -> int:
        return self._users.size

    @property
    def n_items(self) -> int:
        return self._items.size

    @property
    def user_ids(self) -> list[str]:
        return self._users.ids

    @property
    def item_ids(self) -> list[str]:
        return self._items.ids

    @property
    def user_index(self) -> dict[str, int]:
        return self._users.index

    @property
    def item_index(self) -> dict[str, int]:
        return self._items.index

    @property
    def user_bias(self) -> np.ndarray:
        return self._users.bias

    @property
    def item_bias(self) -> np.ndarray:
        return self._items.bias

    @property
    def user_factors(self) -> np.ndarray:
        return self._users.factors

    @property
    def item_factors(self) -> np.ndarray:
        return self._items.factors

    def encode_users(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each user id, -1 where unknown; int64, shape (len(ids),)."""
        return self._users.encode(ids)

    def encode_items(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each item id, -1 where unknown; int64, shape (len(ids),)."""
        return self._items.encode(ids)
