"""What strangers are recommended: the items most users had events for, lately.

``/recommend`` answers a user the model cannot place with the items that most distinct
users had events for among the newest ``POPULAR_WINDOW`` events. Counting them with SQL
on every such request would cost a query over the window per request; here the counts
are kept in memory as events arrive, each event entering the window and, ``window``
events later, leaving it, and a request reads a ranking that is already sorted.

Counted in distinct users: one user's events count once per item, so a
client replaying one user's rating a thousand times moves an item no more than that
user rating it once.

The work is per batch, not per event in Python: ids become integer codes and a (user,
item) pair one int64 key. One compiled pass moves the window (a ring of keys) by the
batch: a leaving pair's count drops in an open-addressing table, an arriving one's
rises, and a pair that vanishes or appears moves its item's distinct users. The ranking
is then one counting sort on distinct users over the items taken in id order (the codes
keep that order as ids arrive), so ties still go by item id. An earlier version moved
each changed item in a sorted list by bisection, a few microseconds per event
(``docs/decisions/0004-serving-index-and-model-choices.md``).

Concurrency, as for the serving view: one writer (the ingest path) adds and publishes
an immutable ranking (a tuple swapped whole); readers take it without a lock.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit
from sortedcontainers import SortedList

from functions.ids import distinct, look_up

#: Items kept in the published ranking. ``/recommend`` asks for at most 1,000 and drops
#: the stranger's own items (at most the events it had in the window).
RANKED = 2_000

#: A pair key is ``user code << _ITEM_BITS | item code``.
_ITEM_BITS = 32
_ITEM_MASK = (1 << _ITEM_BITS) - 1

#: Ids the codes may hold per event of the window before they are re-made from the
#: window's events: re-making walks the whole window, so on a stream where most events
#: bring new ids it must be rare.
_CODES_PER_EVENT = 8
#: Slack, in ids, above that before the codes are re-made.
_SLACK = 64


class _Codes:
    """Ids as integer codes, given in order of first sight.

    Parameters
    ----------
    repeated
        Whether a batch holds few distinct ids, each many times (its users): they are
        then looked up once each and the batch mapped through a dictionary of those.
    """

    def __init__(self, repeated: bool = False) -> None:
        self.repeated = repeated
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        #: ``names`` as an object array (capacity doubles), for gathering many at once.
        self.objects = np.empty(64, dtype=object)

    def encode(self, ids: Sequence[str]) -> np.ndarray:
        """The code of each id ``(n,)`` int64, new ids given the next codes."""
        index = self.index
        if self.repeated:
            first, at = distinct(ids)
            new = [name for name in first if name not in index]
            if new:
                self._append(new)
            return np.fromiter(map(index.__getitem__, first), np.int64, count=len(first))[at]
        codes = look_up(ids, self, index.get)
        missing = np.flatnonzero(codes < 0)
        if missing.size:
            self._append(list(dict.fromkeys(ids[j] for j in missing.tolist())))
            get = index.__getitem__
            codes[missing] = [get(ids[j]) for j in missing.tolist()]
        return codes

    def _append(self, new: list[str]) -> None:
        start = len(self.names)
        self.index.update(zip(new, range(start, start + len(new)), strict=True))
        self.names += new
        if len(self.names) > len(self.objects):
            grown = np.empty(2 * len(self.names), dtype=object)
            grown[:start] = self.objects[:start]
            self.objects = grown
        self.objects[start : len(self.names)] = new


class _ItemCodes(_Codes):
    """Item codes that also know the items' order by id: ``by_id`` lists the codes
    sorted by their ids, so items sort by (count, id) with a counting sort."""

    def __init__(self) -> None:
        super().__init__()
        #: The ids in order, kept sorted as they arrive: a batch's few new ids each cost
        #: a bisection, not a pass over the catalogue.
        self.sorted: SortedList = SortedList()
        self.by_id = np.empty(0, dtype=np.int64)

    def _append(self, new: list[str]) -> None:
        super()._append(new)
        fresh = sorted(new)
        places = [self.sorted.bisect_left(name) for name in fresh]  # among the old ids
        self.by_id = np.insert(self.by_id, places, [self.index[name] for name in fresh])
        self.sorted.update(fresh)


class _Ranking(NamedTuple):
    """A published ranking: the best items' codes and distinct users ``(r,)``, the
    window's distinct (user, item) pairs, and the array of names the codes index."""

    codes: np.ndarray
    users: np.ndarray
    pairs: int
    objects: np.ndarray


class _Window:
    """The window's events and their counts, all in codes.

    Attributes
    ----------
    ring
        Pair keys of the events, a circular buffer of ``window`` slots; the oldest is at
        ``start`` and ``size`` are held.
    table, counts
        An open-addressing hash table of the window's distinct pairs (``_EMPTY`` marks
        a free slot) and how many of its events each has.
    distinct
        Per item code, the distinct users it has in the window.
    pairs
        Distinct pairs in the window.
    """

    def __init__(self, window: int) -> None:
        self.users = _Codes(repeated=True)
        self.items = _ItemCodes()
        self.ring = np.empty(window, dtype=np.int64)
        self.start = 0
        self.size = 0
        slots = 1 << max(4, (2 * window - 1).bit_length())  # at most half full
        self.table = np.full(slots, _EMPTY, dtype=np.int64)
        self.counts = np.zeros(slots, dtype=np.int64)
        self.distinct = np.zeros(64, dtype=np.int64)
        self.pairs = 0

    def add(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> None:
        """Push the oldest events out of the window and let these in (oldest first)."""
        users = self.users.encode(user_ids)
        items = self.items.encode(item_ids)
        if len(self.distinct) < len(self.items.names):
            grown = np.zeros(2 * len(self.items.names), dtype=np.int64)
            grown[: len(self.distinct)] = self.distinct
            self.distinct = grown
        arrived = (users << _ITEM_BITS) | items
        state = np.array([self.start, self.size, self.pairs], dtype=np.int64)
        _slide(self.ring, state, arrived, self.table, self.counts, self.distinct)
        self.start, self.size, self.pairs = state.tolist()

    def top(self, ranked: int) -> _Ranking:
        """The best ``ranked`` items (codes) and their distinct users, best first, ties
        by id, as fresh read-only arrays, with the names their codes index: a code's
        slot in ``objects`` never changes once written (new ids take new slots, and a
        larger array replaces it), so a reader maps codes to names when it reads."""
        best = _best(self.distinct, self.items.by_id, ranked)
        users = self.distinct[best]
        best.flags.writeable = users.flags.writeable = False
        return _Ranking(best, users, self.pairs, self.items.objects)

    def events(self) -> tuple[list[str], list[str]]:
        """The window's users and items, oldest first."""
        keys = self.ring[(self.start + np.arange(self.size)) % len(self.ring)]
        users = self.users.objects[keys >> _ITEM_BITS].tolist()
        items = self.items.objects[keys & _ITEM_MASK].tolist()
        return users, items

    def wasteful(self) -> bool:
        """Whether the codes hold more than ``_CODES_PER_EVENT`` ids per event of the
        window: ids that left the window keep their codes until the window is re-coded
        from its events."""
        limit = _CODES_PER_EVENT * len(self.ring) + _SLACK
        return len(self.users.names) > limit or len(self.items.names) > limit


@njit(cache=True, nogil=True)
def _best(distinct: np.ndarray, by_id: np.ndarray, ranked: int) -> np.ndarray:  # pragma: no cover
    """The codes of the ``ranked`` items with the most distinct users, ties by id: a
    counting sort on the count of the items taken in id order (``by_id``)."""
    most = 0
    for count in distinct:
        most = max(most, count)
    ahead = np.zeros(most + 2, dtype=np.int64)  # items with a count above each count
    for count in distinct:
        if count > 0:
            ahead[count - 1] += 1
    for count in range(most - 1, -1, -1):
        ahead[count] += ahead[count + 1]
    best = np.empty(min(ranked, ahead[0]), dtype=np.int64)
    for code in by_id:
        count = distinct[code]
        if count > 0 and ahead[count] < best.size:
            best[ahead[count]] = code
            ahead[count] += 1
    return best


#: A free slot of the pair table (pair keys are never negative).
_EMPTY = -1


@njit(cache=True, nogil=True)
def _home(key: int, shift: np.uint64) -> int:  # pragma: no cover - compiled
    """Where ``key``'s probe run starts: a Fibonacci hash, its top bits."""
    return int(np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> shift))


@njit(cache=True, nogil=True)
def _slot(table: np.ndarray, key: int, shift: np.uint64) -> int:  # pragma: no cover
    """The slot holding ``key``, or the free slot where it would go (linear probing)."""
    mask = table.size - 1
    at = _home(key, shift)
    while table[at] != key and table[at] != _EMPTY:
        at = (at + 1) & mask
    return at


@njit(cache=True, nogil=True)
def _free(
    table: np.ndarray, counts: np.ndarray, at: int, shift: np.uint64
) -> None:  # pragma: no cover - compiled
    """Empty slot ``at``, shifting back the entries its key's probe run displaced, so no
    probe run is broken and no tombstone is left."""
    mask = table.size - 1
    gap, probe = at, (at + 1) & mask
    while table[probe] != _EMPTY:
        home = _home(table[probe], shift)
        if (probe - home) & mask >= (probe - gap) & mask:  # may move back into the gap
            table[gap], counts[gap] = table[probe], counts[probe]
            gap = probe
        probe = (probe + 1) & mask
    table[gap], counts[gap] = _EMPTY, 0


@njit(cache=True, nogil=True)
def _slide(
    ring: np.ndarray,
    state: np.ndarray,
    arrived: np.ndarray,
    table: np.ndarray,
    counts: np.ndarray,
    distinct: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Move the window by ``arrived``: the oldest events leave (a pair whose last event
    leaves takes a user from its item), then the new ones enter (a pair's first event
    gives its item a user). ``state`` is [start, size, pairs], updated in place."""
    window = ring.size
    start, size, pairs = state[0], state[1], state[2]
    bits = 0
    while (1 << bits) < table.size:
        bits += 1
    shift = np.uint64(64 - bits)
    leaving = max(0, size + arrived.size - window)
    for _ in range(leaving):
        key = ring[start]
        start = (start + 1) % window
        at = _slot(table, key, shift)
        counts[at] -= 1
        if counts[at] == 0:
            _free(table, counts, at, shift)
            distinct[key & _ITEM_MASK] -= 1
            pairs -= 1
    size -= leaving
    for key in arrived:
        ring[(start + size) % window] = key
        size += 1
        at = _slot(table, key, shift)
        if table[at] == _EMPTY:
            table[at] = key
            distinct[key & _ITEM_MASK] += 1
            pairs += 1
        counts[at] += 1
    state[0], state[1], state[2] = start, size, pairs


class PopularItems:
    """Items ranked by distinct users among the newest ``window`` events.

    Parameters
    ----------
    window
        How many of the newest events count (``POPULAR_WINDOW``).
    ranked
        How many items the published ranking holds.

    Examples
    --------
    >>> popular = PopularItems(window=4)
    >>> popular.add(["a", "b", "a", "c"], ["x", "x", "x", "y"])
    >>> popular.ranking
    (('x', 2), ('y', 1))
    >>> popular.add(["d", "d"], ["y", "z"])  # a's and b's first events leave the window
    >>> popular.ranking
    (('y', 2), ('x', 1), ('z', 1))
    >>> popular.top(2, exclude={"y"})  # scores: shares of the window's 4 user-item pairs
    [('x', 0.25), ('z', 0.25)]
    """

    def __init__(self, window: int, ranked: int = RANKED) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        self.ranked = ranked
        self._window = _Window(window)
        #: The best ``ranked`` items with their distinct users and the window's
        #: distinct (user, item) pairs, published together (replaced whole: a batch
        #: publishes codes, a reader turns the few it takes into names).
        self._published = _Ranking(
            np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 0, np.empty(0, dtype=object)
        )

    @property
    def ranking(self) -> tuple[tuple[str, int], ...]:
        """(item, distinct users) best first, ties by item id."""
        published = self._published
        names = published.objects[published.codes].tolist()
        return tuple(zip(names, published.users.tolist(), strict=True))

    def top(self, k: int, exclude: Container[str] = ()) -> list[tuple[str, float]]:
        """The ``k`` best items not in ``exclude``, each scored by its share of the
        window's distinct (user, item) pairs (lock-free)."""
        codes, users, pairs, objects = self._published
        chosen: list[tuple[str, float]] = []
        for at, code in enumerate(codes):  # lazily: most reads stop after a few
            if len(chosen) == k:
                break
            item = objects[code]
            if item not in exclude:
                chosen.append((item, int(users[at]) / pairs))
        return chosen

    @property
    def pairs(self) -> int:
        """Distinct (user, item) pairs in the window."""
        return self._window.pairs

    def add(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> None:
        """Let events in (oldest first), push the oldest out of the window, re-rank.

        Only the newest ``window`` of a batch can stay in the window; older ones would
        enter and leave within the batch, so they are not counted at all.
        """
        if len(user_ids) != len(item_ids):
            raise ValueError(f"{len(user_ids)} users for {len(item_ids)} items")
        if not len(user_ids):
            return
        if len(user_ids) > self.window:
            user_ids, item_ids = user_ids[-self.window :], item_ids[-self.window :]
        window = self._window
        window.add(user_ids, item_ids)
        if window.wasteful():
            window = self._window = self._recoded(window)
        self._published = window.top(self.ranked)

    def export_state(self) -> dict[str, np.ndarray]:
        """The window's events, oldest first: the counts and the ranking follow from them."""
        users, items = self._window.events()
        return {
            "popular_users": np.array(users, dtype=str),
            "popular_items": np.array(items, dtype=str),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], window: int, ranked: int = RANKED
    ) -> PopularItems:
        """The ranking of the window ``export_state`` wrote (its newest ``window`` events)."""
        popular = cls(window, ranked)
        users = [str(user) for user in state["popular_users"].tolist()]
        items = [str(item) for item in state["popular_items"].tolist()]
        popular.add(users, items)
        return popular

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Rank the window ``export_state`` wrote instead of the one held now."""
        loaded = self.from_state(state, self.window, self.ranked)
        self._window, self._published = loaded._window, loaded._published

    def _recoded(self, window: _Window) -> _Window:
        """The same window with codes for its own ids only."""
        fresh = _Window(self.window)
        users, items = window.events()
        if users:
            fresh.add(users, items)
        return fresh
