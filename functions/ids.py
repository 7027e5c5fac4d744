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
  batch's items, for the fold-in and for ranking), and one look-up can serve them all;
* a batch's items are mostly distinct, but the same catalogue comes back batch after
  batch: :class:`IdCodes` gives each id a dense integer code once, and each table keeps
  what it found by code (``Ids.look_up``), so a later batch meets the string once, in
  the codes, and every table after that gathers from an array.

:class:`Ids` is a batch's ids as an immutable sequence that factorizes itself once, on
first use (its distinct ids and each id's code among them), and keeps what pure
look-ups found for it (``encoded``). Every table still takes any ``Sequence[str]``: the
helpers here use what an ``Ids`` knows and compute it otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np

__all__ = ["IdCodes", "Ids", "codes_through", "distinct", "look_up"]

#: Ids an :class:`IdCodes` numbers before it starts afresh: about 100 bytes each for
#: the codes and 8 per table that keeps rows by them.
CODES_LIMIT = 1 << 18


class IdCodes:
    """Dense integer codes of the ids a process meets, and what tables found for them.

    A code is an id's position in order of first sight. Each table that looks ids up
    by ``Ids.look_up`` gets an array here, by code, of the rows it found. A row found
    stays until the table takes it away (``forget``, or ``drop`` for all); an absence
    is kept only for a table that says it only grows, and only until it grows (its
    ``size`` at the look-up is kept with the absence).

    Bounded: past ``limit`` ids the codes start afresh (a new ``generation``) and every
    table's array with them; an :class:`Ids` coded in an earlier generation is looked
    up id by id.

    A table is told apart by identity and held weakly (its array goes with it), so a
    table must be an object whose class keeps the default equality.

    Ownership: one writer, the ingest path (under the learner's lock), codes ids and
    reads and writes the tables' arrays; no other thread uses them.
    """

    def __init__(self, limit: int = CODES_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.generation = 0
        self._index: dict[str, int] = {}
        self._found: WeakKeyDictionary[object, np.ndarray] = WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._index)

    def encode(self, ids: Sequence[str]) -> np.ndarray:
        """The code of each id ``(n,)`` int64, new ids given the next codes; starts a
        new generation first when they would pass the limit."""
        index = self._index
        codes = np.fromiter(map(index.get, ids, repeat(-1)), np.int64, count=len(ids))
        missing = np.flatnonzero(codes < 0).tolist()
        if not missing:
            return codes
        new = list(dict.fromkeys(ids[j] for j in missing))
        if len(index) + len(new) > self.limit:
            index = self._start_afresh()
            new = list(dict.fromkeys(ids))
            missing = list(range(len(ids)))
        start = len(index)
        index.update(zip(new, range(start, start + len(new)), strict=True))
        codes[missing] = [index[ids[j]] for j in missing]
        return codes

    def look_up(
        self,
        table: object,
        ids: Sequence[str],
        codes: np.ndarray,
        get: Callable[[str, int], int | None],
        size: int | None = None,
    ) -> np.ndarray:
        """``get(id, -1)`` of every id ``(n,)`` int64, ``codes`` being theirs in this
        generation: gathered from what ``table`` found before, looked up where it had
        found nothing (and kept where it finds something now).

        ``size`` is for a table that only ever gains ids: its count of ids, so that an
        id it lacks is remembered as lacking until the table grows.
        """
        found = self._found.get(table)
        if found is None or found.size < len(self._index):
            found = self._grown(table, found)
        rows = found[codes]
        # -1: not looked up yet; -2 - size: lacking when the table held ``size`` ids.
        lacking = -1 if size is None else -2 - size
        missing = np.flatnonzero((rows == -1) | ((rows < -1) & (rows != lacking)))
        if missing.size:
            at = missing.tolist()
            looked = np.fromiter(
                map(get, [ids[j] for j in at], repeat(-1)), np.int64, count=len(at)
            )
            rows[missing] = looked
            found[codes[missing]] = np.where(looked < 0, lacking, looked)
        rows[rows < 0] = -1
        return rows

    def forget(self, table: object, ids: Iterable[str]) -> None:
        """``table`` no longer holds these ids where it did."""
        found = self._found.get(table)
        if found is None:
            return
        codes = [code for code in map(self._index.get, ids) if code is not None]
        found[[code for code in codes if code < found.size]] = -1

    def drop(self, table: object) -> None:
        """Forget everything ``table`` found (its ids were numbered afresh)."""
        self._found.pop(table, None)

    def _grown(self, table: object, found: np.ndarray | None) -> np.ndarray:
        held = 0 if found is None else found.size
        grown = np.full(max(64, 2 * len(self._index)), -1, dtype=np.int64)
        if found is not None:
            grown[:held] = found
        self._found[table] = grown
        return grown

    def _start_afresh(self) -> dict[str, int]:
        """A new generation: no codes and no table's rows; the new, empty index."""
        self._index = {}
        self._found = WeakKeyDictionary()
        self.generation += 1
        return self._index


class Ids(tuple[str, ...]):
    """A batch's ids, in order, with their factorization computed once.

    Immutable, so what it keeps can never go stale; arrays it hands out are read-only
    (callers that change them take a copy). ``repeated`` says the ids repeat enough for
    look-ups of the distinct ones to pay for the factorization (a batch's users, not
    its items).
    """

    repeated: bool = False
    #: The codes tables look these ids up by (None: by their strings).
    codes: IdCodes | None = None
    _coded: tuple[int, np.ndarray]
    _distinct: tuple[list[str], np.ndarray]
    _encoded: dict[tuple[object, Any], np.ndarray]

    @classmethod
    def of(cls, ids: Sequence[str], *, repeated: bool, codes: IdCodes | None = None) -> Ids:
        """``ids`` as :class:`Ids`; with ``codes``, tables look them up by code."""
        made = cls(ids)
        made.repeated = repeated
        made.codes = codes
        return made

    def look_up(
        self, table: object, get: Callable[[str, int], int | None], size: int | None = None
    ) -> np.ndarray:
        """``get(id, -1)`` of every id ``(n,)`` int64, a fresh array: by code, from
        what ``table`` found for earlier batches, when these ids have codes (see
        :class:`IdCodes` for what ``table`` must tell it, and for ``size``); otherwise
        as ``codes_through``. ``get`` must be ``table``'s own pure look-up."""
        codes = self.codes
        if codes is None:
            return codes_through(self, get)
        try:
            generation, coded = self._coded
        except AttributeError:
            generation, coded = self._coded = codes.generation, _read_only(codes.encode(self))
        if generation != codes.generation:
            return codes_through(self, get)
        return codes.look_up(table, self, coded, get, size)

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


def look_up(
    ids: Sequence[str],
    table: object,
    get: Callable[[str, int], int | None],
    size: int | None = None,
) -> np.ndarray:
    """``get(id, -1)`` of every id ``(n,)`` int64, a fresh array: ``Ids.look_up`` for an
    :class:`Ids` (by code, from what ``table`` found before), ``codes_through`` otherwise."""
    if isinstance(ids, Ids):
        return ids.look_up(table, get, size)
    return codes_through(ids, get)


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
