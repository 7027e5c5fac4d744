"""A batch's ids, each one's string touched once.

On the ingest path a batch's events meet about a dozen id tables: the fold-in's rows,
the serving and the never-retrained versions' rows, the ranking's, popular items', the
drift segments'. Looking an id up in a large dictionary costs a cache miss or two per
event (100–300 ns on a loaded machine), which made id look-ups about a third of the
learning path. Two facts cut that down:

* a batch's users repeat (users rate in bursts: a batch of 500 MovieLens events holds
  about a dozen users), so a table can look up each distinct user once and gather the
  rest by code;
* several stages map the same ids through the same table (the version's rows of the
  batch's items, for the fold-in and for ranking), and one look-up can serve them all.

:class:`Ids` is a batch's ids as an immutable sequence that factorizes itself once, on
first use (its distinct ids and each id's code among them), and keeps what pure
look-ups found for it (``encoded``). Every table still takes any ``Sequence[str]``: the
helpers here use what an ``Ids`` knows and compute it otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

__all__ = ["Ids", "codes_through", "distinct"]


class Ids(tuple[str, ...]):
    """A batch's ids, in order, with their factorization computed once.

    Immutable, so what it keeps can never go stale; arrays it hands out are read-only
    (callers that change them take a copy). ``repeated`` says the ids repeat enough for
    look-ups of the distinct ones to pay for the factorization (a batch's users, not
    its items).
    """

    repeated: bool = False
    _distinct: tuple[list[str], np.ndarray]
    _encoded: dict[tuple[object, Any], np.ndarray]

    @classmethod
    def of(cls, ids: Sequence[str], *, repeated: bool) -> Ids:
        made = cls(ids)
        made.repeated = repeated
        return made

    def distinct(self) -> tuple[list[str], np.ndarray]:
        """The distinct ids in order of first appearance, and each id's index among
        them ``(n,)`` int64."""
        try:
            return self._distinct
        except AttributeError:
            self._distinct = _factorize(self)
            return self._distinct

    def encoded(
        self, table: object, state: Any, encode: Callable[[Sequence[str]], np.ndarray]
    ) -> np.ndarray:
        """``encode(self)``, computed once per ``table`` in a given ``state`` (a value
        that changes whenever the table's answer could: its size, for a table that only
        grows). ``encode`` must be a pure look-up."""
        try:
            cache = self._encoded
        except AttributeError:
            cache = self._encoded = {}
        key = (table, state)  # the table itself: an id could be reused once it is gone
        found = cache.get(key)
        if found is None:
            found = cache[key] = _read_only(encode(self))
        return found


def distinct(ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct ids of ``ids`` in order of first appearance, and each id's index
    among them ``(n,)`` int64 (kept by an :class:`Ids`, computed otherwise)."""
    if isinstance(ids, Ids):
        return ids.distinct()
    return _factorize(ids)


def codes_through(ids: Sequence[str], get: Callable[[str, int], int | None]) -> np.ndarray:
    """``get(id, -1)`` of every id ``(n,)`` int64; for an :class:`Ids` with repeated ids,
    each distinct id is looked up once and the rest gathered by code."""
    if isinstance(ids, Ids) and ids.repeated:
        first, codes = ids.distinct()
        if len(first) < len(ids):
            found = np.fromiter(map(get, first, repeat(-1)), dtype=np.int64, count=len(first))
            return found[codes]
    return np.fromiter(map(get, ids, repeat(-1)), dtype=np.int64, count=len(ids))


def _factorize(ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
    first = list(dict.fromkeys(ids))
    index = dict(zip(first, range(len(first)), strict=True))
    codes = np.fromiter(map(index.__getitem__, ids), dtype=np.int64, count=len(ids))
    return first, _read_only(codes)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
