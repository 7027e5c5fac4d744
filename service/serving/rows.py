"""Per-key rows of online state, bounded by evicting the least recently seen keys.

A stream keeps bringing users and items the server has never seen; without a bound the
per-key statistics grow with every new id (200,000 new ids once took a server from
311 MB to 778 MB). ``LruRows`` keeps at most ``limit`` keys: once it is over, the least
recently seen keys are evicted and their rows reused by the next new keys, so the
arrays stop growing. An evicted user or item falls back to what the published version
knows about it, which is what it would get had it never been folded in.

Recency is a stamp per row (the position of the key's last sighting in the stream of
keys), set for a whole batch with one array operation rather than a linked-list move
per key. Eviction takes the smallest stamps, found a few thousand at a time with a
partial sort and checked again when used (a key seen since has a newer stamp), so it
stays exact least-recently-seen order at a small cost per evicted key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from functions.ids import IdCodes, Ids, look_up

#: The stamp of a free row: never among the least recently seen.
_FREE = np.iinfo(np.int64).max
#: Fewest eviction candidates found at a time (the partial sort's batch).
_CANDIDATES = 4096


class LruRows:
    """Keys mapped to rows of named float arrays, at most ``limit`` keys.

    Parameters
    ----------
    shapes
        Name → trailing shape of each array; every key owns one row of each.
    limit
        Most keys kept (None: unbounded). ``evict`` enforces it; callers evict after a
        batch is learnt, so the keys of that batch, just seen, are never the ones evicted.

    Examples
    --------
    >>> rows = LruRows({"total": ()}, limit=2)
    >>> rows.rows_for(["a", "b", "a"]).tolist()
    [0, 1, 0]
    >>> rows.rows_for(["c"]).tolist(), rows.evict()
    ([2], ['b'])
    >>> rows.rows_for(["d"]).tolist(), rows.evict(), rows.by_recency()
    ([1], ['a'], ['c', 'd'])
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]], limit: int | None = None) -> None:
        self.index: dict[str, int] = {}
        self.limit = limit
        self.arrays: dict[str, np.ndarray] = {
            name: np.zeros((0, *shape)) for name, shape in shapes.items()
        }
        self._keys: list[str | None] = []
        self._free: list[int] = []
        #: Per row, the position of its key's last sighting (``_FREE``: no key).
        self._seen = np.empty(0, dtype=np.int64)
        #: Keys sighted so far: the next stamp.
        self._clock = 0
        #: (row, stamp) of the least recently seen rows, oldest first, as last found.
        self._oldest: deque[tuple[int, int]] = deque()
        self.fresh = np.empty(0, dtype=np.int64)
        #: The id codes ``rows_for`` was last handed ids by: they keep rows it found.
        self._coded_by: IdCodes | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def capacity(self) -> int:
        return len(self._keys)

    def get(self, key: str) -> int | None:
        """The row of ``key`` without counting it as seen, or None."""
        return self.index.get(key)

    def key_of(self, row: int) -> str | None:
        return self._keys[row]

    def by_recency(self) -> list[str]:
        """The keys, least recently seen first."""
        rows = np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index))
        order = rows[np.argsort(self._seen[rows], kind="stable")]
        return [self._keys[row] or "" for row in order.tolist()]

    def rows_for(self, keys: Sequence[str]) -> np.ndarray:
        """The row of each key, marking each as just seen; new keys get zeroed rows.

        The rows handed to keys new in this call are left in ``fresh`` (unique, in
        order of first appearance) so the caller can give them their priors.
        """
        n = len(keys)
        if isinstance(keys, Ids) and keys.codes is not None:
            self._coded_by = keys.codes  # told of every row given up (``evict``)
        rows = look_up(keys, self, self.index.get)
        missing = np.flatnonzero(rows < 0)
        fresh: list[int] = []
        if missing.size:
            at = missing.tolist()
            fresh = [self._allocate(key) for key in dict.fromkeys(keys[j] for j in at)]
            rows[missing] = [self.index[keys[j]] for j in at]
        # A key named twice keeps the stamp of its last sighting (stamps only grow).
        np.maximum.at(self._seen, rows, np.arange(self._clock, self._clock + n))
        self._clock += n
        self.fresh = np.asarray(fresh, dtype=np.int64)
        if fresh:
            for array in self.arrays.values():
                array[self.fresh] = 0.0
        return rows

    def evict(self) -> list[str]:
        """Drop the least recently seen keys over ``limit``; returns them, oldest first."""
        if self.limit is None:
            return []
        evicted = []
        while len(self.index) > self.limit:
            if not self._oldest:
                self._find_oldest(len(self.index) - self.limit)
            row, stamp = self._oldest.popleft()
            if self._seen[row] != stamp:  # seen again (or evicted) since it was found
                continue
            key = self._keys[row]
            assert key is not None
            del self.index[key]
            self._keys[row] = None
            self._seen[row] = _FREE
            self._free.append(row)
            evicted.append(key)
        if evicted and self._coded_by is not None:
            self._coded_by.forget(self, evicted)
        return evicted

    def _find_oldest(self, wanted: int) -> None:
        """Queue the least recently seen rows, at least ``wanted`` of them.

        Rows not queued were all seen later than every queued one, and stamps only
        grow, so a queued row whose stamp is unchanged is still among the oldest.
        """
        seen = self._seen
        count = min(len(self.index), max(wanted, _CANDIDATES))
        if count < len(self.index):
            rows = np.argpartition(seen, count - 1)[:count]
        else:
            rows = np.flatnonzero(seen != _FREE)
        rows = rows[np.argsort(seen[rows], kind="stable")]
        self._oldest = deque(zip(rows.tolist(), seen[rows].tolist(), strict=True))

    def export_state(self, prefix: str) -> dict[str, np.ndarray]:
        """A copy of the rows as plain arrays named ``prefix`` + field, enough for
        ``load_state`` to continue exactly where this left off: the keys in recency
        order with their rows, the free rows in the order they are handed out, and
        every array at full capacity (a key's row takes part in the batch arithmetic).
        """
        keys = self.by_recency()
        state = {
            f"{prefix}keys": np.array(keys, dtype=str),
            f"{prefix}rows": np.fromiter(
                map(self.index.__getitem__, keys), dtype=np.int64, count=len(keys)
            ),
            f"{prefix}free": np.asarray(self._free, dtype=np.int64),
            f"{prefix}capacity": np.array(self.capacity, dtype=np.int64),
        }
        for name, array in self.arrays.items():
            state[f"{prefix}array_{name}"] = array.copy()
        return state

    def load_state(self, state: dict[str, np.ndarray], prefix: str) -> None:
        """Take the rows ``export_state`` wrote (``ValueError`` if they do not fit)."""
        capacity = int(state[f"{prefix}capacity"])
        keys = [str(key) for key in state[f"{prefix}keys"].tolist()]
        rows = state[f"{prefix}rows"].astype(np.int64).tolist()
        free = state[f"{prefix}free"].astype(np.int64).tolist()
        if len(keys) != len(rows) or len(set(rows)) != len(rows):
            raise ValueError("the rows' keys and rows do not match")
        if sorted(rows + free) != list(range(capacity)):
            raise ValueError("the rows and free rows do not cover the capacity")
        arrays = {}
        for name, array in self.arrays.items():
            loaded = np.asarray(state[f"{prefix}array_{name}"], dtype=np.float64)
            if loaded.shape != (capacity, *array.shape[1:]):
                raise ValueError(f"array {name} has shape {loaded.shape}")
            arrays[name] = loaded.copy()
        slots: list[str | None] = [None] * capacity
        seen = np.full(capacity, _FREE, dtype=np.int64)
        for stamp, (key, row) in enumerate(zip(keys, rows, strict=True)):
            slots[row] = key
            seen[row] = stamp
        self.index = dict(zip(keys, rows, strict=True))
        self.arrays, self._keys, self._free = arrays, slots, free
        self._seen, self._clock, self._oldest = seen, len(keys), deque()
        self.fresh = np.empty(0, dtype=np.int64)
        if self._coded_by is not None:
            self._coded_by.drop(self)

    def _allocate(self, key: str) -> int:
        if not self._free:
            self._grow()
        row = self._free.pop()
        self.index[key] = row
        self._keys[row] = key
        self._seen[row] = -1  # stamped by the sighting that allocates it
        return row

    def _grow(self) -> None:
        """Double the storage; new rows join the free list, lowest row first."""
        old = self.capacity
        capacity = max(64, 2 * old)
        if self.limit is not None:
            # A batch may add its new keys before eviction runs: leave room for it.
            capacity = min(capacity, max(old + 64, self.limit + 4096))
        for name, array in self.arrays.items():
            grown = np.zeros((capacity, *array.shape[1:]))
            grown[:old] = array
            self.arrays[name] = grown
        self._seen = np.concatenate([self._seen, np.full(capacity - old, _FREE, dtype=np.int64)])
        self._keys.extend([None] * (capacity - old))
        self._free.extend(range(capacity - 1, old - 1, -1))
