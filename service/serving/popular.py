"""What strangers are recommended: the items most users had events for, lately.

``/recommend`` answers a user the model cannot place with the items that most distinct
users had events for among the newest ``POPULAR_WINDOW`` events. Counting them with SQL
on every such request would cost a query over the window per request; here the counts
are kept in memory as events arrive, each event entering the window and, ``window``
events later, leaving it, and the ranking is kept sorted as counts move (an item whose
count changed is taken out and put back by bisection), so the work per event is a few
microseconds and a request reads a ranking that is already sorted (why not re-sort per
batch: ``docs/decisions/0004-serving-index-and-model-choices.md``).

Counted in distinct users: one user's events count once per item, so a
client replaying one user's rating a thousand times moves an item no more than that
user rating it once.

Concurrency, as for the serving view: one writer (the ingest path) adds and publishes
an immutable ranking (a tuple swapped whole); readers take it without a lock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Container, Sequence
from itertools import islice

import numpy as np

#: Items kept in the published ranking. ``/recommend`` asks for at most 1,000 and drops
#: the stranger's own items (at most the events it had in the window).
RANKED = 2_000


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
        self._events: deque[tuple[str, str]] = deque()
        self._pairs: dict[tuple[str, str], int] = {}
        self._users: dict[str, int] = {}
        #: (−distinct users, item) of every item in the window, sorted: best first.
        self._order: list[tuple[int, str]] = []
        #: The best ``ranked`` of ``_order`` and the window's distinct (user, item)
        #: pairs, published together.
        self._published: tuple[tuple[tuple[int, str], ...], int] = ((), 0)

    @property
    def ranking(self) -> tuple[tuple[str, int], ...]:
        """(item, distinct users) best first, ties by item id."""
        return tuple((item, -negative) for negative, item in self._published[0])

    def top(self, k: int, exclude: Container[str] = ()) -> list[tuple[str, float]]:
        """The ``k`` best items not in ``exclude``, each scored by its share of the
        window's distinct (user, item) pairs (lock-free)."""
        ranking, pairs = self._published
        chosen = islice((entry for entry in ranking if entry[1] not in exclude), k)
        return [(item, -negative / pairs) for negative, item in chosen]

    @property
    def pairs(self) -> int:
        """Distinct (user, item) pairs in the window."""
        return len(self._pairs)

    def add(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> None:
        """Let events in (oldest first), push the oldest out of the window, re-rank.

        Counts are read with ``dict.get``: a ``Counter``'s missing key goes through a
        Python-level ``__missing__``, and most of a batch's pairs are new to the window.
        """
        if len(user_ids) != len(item_ids):
            raise ValueError(f"{len(user_ids)} users for {len(item_ids)} items")
        events, pairs, users = self._events, self._pairs, self._users
        before: dict[str, int] = {}  # each moved item's count before this batch
        arrived = list(zip(user_ids, item_ids, strict=True))
        events.extend(arrived)
        for pair in arrived:
            count = pairs.get(pair, 0)
            pairs[pair] = count + 1
            if not count:
                item = pair[1]
                seen = users.get(item, 0)
                before.setdefault(item, seen)
                users[item] = seen + 1
        for _ in range(len(events) - self.window):
            pair = events.popleft()
            count = pairs[pair] - 1
            if count:
                pairs[pair] = count
                continue
            del pairs[pair]
            item = pair[1]
            seen = users[item]
            before.setdefault(item, seen)
            users[item] = seen - 1
        for item, old in before.items():
            self._move(item, old, users[item])
            if users[item] == 0:
                del users[item]
        if user_ids:
            self._published = (tuple(self._order[: self.ranked]), len(pairs))

    def export_state(self) -> dict[str, np.ndarray]:
        """The window's events, oldest first: the counts and the ranking follow from them."""
        users = [user for user, _ in self._events]
        items = [item for _, item in self._events]
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
        self._events, self._pairs, self._users = loaded._events, loaded._pairs, loaded._users
        self._order, self._published = loaded._order, loaded._published

    def _move(self, item: str, old: int, new: int) -> None:
        """Re-place ``item`` in the sorted order after its count went from old to new."""
        if old == new:
            return
        order = self._order
        if old:
            del order[bisect_left(order, (-old, item))]
        if new:
            insort(order, (-new, item))
