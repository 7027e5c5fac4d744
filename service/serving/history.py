"""The items each user has rated, in memory and bounded, for leaving them out of rankings.

Ranking an item for a user only means something among the items the user could still
be shown: ``/recommend`` leaves out what the user already has, and so must prequential
ranking (``drift/ranking.py``), which cannot afford a database query per ranked event
on the ingest path. ``RatedItems`` keeps each user's items in memory, learnt from the
same events the serving model learns from.

A stream keeps bringing new users, so the history is bounded like the online user rows
(``service/serving/rows.py``): at most ``max_pairs`` (user, item) pairs, the least
recently seen users evicted first. An evicted user who comes back starts an empty
history, so items rated before the eviction are no longer left out of their rankings.

Concurrency, as for the serving view: one writer (the ingest path) adds; readers take
``snapshot`` once and look users up in it without a lock. A snapshot is a persistent
map (``immutables.Map``) of frozensets: a batch's additions build the next map and the
reference is swapped whole, never a set changed under a reader.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from immutables import Map, MapMutation

_EMPTY: frozenset[str] = frozenset()


class RatedItems:
    """Per-user sets of rated items, at most ``max_pairs`` (user, item) pairs in all.

    Parameters
    ----------
    max_pairs
        Most (user, item) pairs kept (None: unbounded). Users are evicted least
        recently seen first, so the users of the batch just added go last. A single
        user whose own history passes the bound keeps the newest items of the batch
        and an arbitrary part of the older ones.

    Examples
    --------
    >>> history = RatedItems(max_pairs=3)
    >>> history.add(["a", "a", "b"], ["i1", "i2", "i1"])
    >>> sorted(history.items("a")), history.pairs
    (['i1', 'i2'], 3)
    >>> history.add(["c", "c"], ["i3", "i3"])
    >>> sorted(history.users()), history.pairs, sorted(history.items("a"))
    (['b', 'c'], 2, [])
    """

    def __init__(self, max_pairs: int | None = None) -> None:
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"max_pairs must be at least 1, got {max_pairs}")
        self.max_pairs = max_pairs
        self._recency: OrderedDict[str, None] = OrderedDict()
        self._snapshot: Map[str, frozenset[str]] = Map()
        self._pairs = 0

    @property
    def snapshot(self) -> Map[str, frozenset[str]]:
        """User → rated items as they are now; take it once per read."""
        return self._snapshot

    @property
    def pairs(self) -> int:
        """(user, item) pairs held."""
        return self._pairs

    def __len__(self) -> int:
        return len(self._recency)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._snapshot

    def users(self) -> list[str]:
        """Users held, least recently seen first."""
        return list(self._recency)

    def items(self, user_id: str) -> frozenset[str]:
        """The items ``user_id`` has rated, as far as the history holds; empty if none."""
        return self._snapshot.get(user_id, _EMPTY)

    def add(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> None:
        """Record that each user rated the item beside it, then evict over the bound."""
        if len(user_ids) != len(item_ids):
            raise ValueError(f"{len(user_ids)} users for {len(item_ids)} items")
        batch: dict[str, list[str]] = {}
        for user, item in zip(user_ids, item_ids, strict=True):
            held = batch.get(user)
            if held is None:
                batch[user] = [item]
            else:
                held.append(item)
        self.add_by_user(batch)

    def add_by_user(self, batch: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """``add`` with the batch already grouped: each user's items in arrival order,
        the users in the order they first appear.

        Returns
        -------
        dict[str, list[str]]
            For each user whose set only grew (neither cut to the bound nor evicted),
            the items new to it, in arrival order: the user's new set is exactly the
            old one and these. Whoever keeps something derived from a user's set (the
            ranking's encoded rows) can extend it rather than rebuild it.
        """
        recency, pairs = self._recency, self._pairs
        grown: dict[str, list[str]] = {}
        with self._snapshot.mutate() as snapshot:
            for user, items in batch.items():
                old = snapshot.get(user, _EMPTY)
                if len(items) == 1:  # most users of a batch from many users
                    fresh = [] if items[0] in old else list(items)
                else:
                    fresh = [item for item in dict.fromkeys(items) if item not in old]
                if fresh:
                    new = old.union(fresh)
                    if self.max_pairs is not None and len(new) > self.max_pairs:
                        new = _newest(old, items, self.max_pairs)
                    else:
                        grown[user] = fresh
                    if len(new) != len(old):
                        snapshot[user] = new
                        pairs += len(new) - len(old)
                recency[user] = None
                recency.move_to_end(user)
            held = len(recency)
            pairs = self._evict(snapshot, pairs)
            self._snapshot = snapshot.finish()
        self._pairs = pairs
        if len(recency) == held:  # nobody evicted
            return grown
        return {user: fresh for user, fresh in grown.items() if user in self._snapshot}

    def export_state(self) -> dict[str, np.ndarray]:
        """The users, least recently seen first, and their items (sorted), flattened:
        ``history_items[history_starts[j]:history_starts[j + 1]]`` are user j's."""
        snapshot, users = self._snapshot, list(self._recency)
        items = [sorted(snapshot.get(user, _EMPTY)) for user in users]
        starts = np.cumsum([0] + [len(held) for held in items], dtype=np.int64)
        return {
            "history_users": np.array(users, dtype=str),
            "history_starts": starts,
            "history_items": np.array([item for held in items for item in held], dtype=str),
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Hold what ``export_state`` wrote instead of what is held now."""
        users = [str(user) for user in state["history_users"].tolist()]
        starts = state["history_starts"].astype(np.int64).tolist()
        items = [str(item) for item in state["history_items"].tolist()]
        if len(starts) != len(users) + 1 or starts[0] != 0 or starts[-1] != len(items):
            raise ValueError("the rated items do not match their users")
        held = {
            user: frozenset(items[start:end])
            for user, start, end in zip(users, starts[:-1], starts[1:], strict=True)
        }
        self._recency = OrderedDict.fromkeys(users)
        self._pairs = sum(len(user_items) for user_items in held.values())
        self._snapshot = Map(held)

    def _evict(self, snapshot: MapMutation[str, frozenset[str]], pairs: int) -> int:
        """Drop the least recently seen users while over the bound; returns the pairs left.

        This batch's users are the most recent, so they go last, and the very last one
        never: a bound smaller than one batch still leaves the newest user's items.
        """
        if self.max_pairs is None:
            return pairs
        recency = self._recency
        while pairs > self.max_pairs and len(recency) > 1:
            user, _ = recency.popitem(last=False)
            pairs -= len(snapshot.get(user, _EMPTY))
            snapshot.pop(user, None)
        return pairs


def _newest(old: frozenset[str], items: Iterable[str], limit: int) -> frozenset[str]:
    """At most ``limit`` items: this batch's newest first, then older ones to fill up."""
    kept = list(dict.fromkeys(reversed(list(items))))[:limit]
    room, chosen = limit - len(kept), set(kept)
    fill = [item for item in old if item not in chosen][:room] if room > 0 else []
    return frozenset(kept + fill)
