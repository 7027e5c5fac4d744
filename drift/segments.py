"""Where an alert's error rise comes from: user and item segments, and the top movers.

An alert says *that* the serving model got worse; an operator next asks *for whom*. Did
users who were already here change their taste, or did newcomers the model cannot place
arrive? Is it the blockbusters or the long tail? Which users and items got worse most?
``SegmentBuffer`` keeps the newest labelled events with their squared prediction errors
and, given the change point an alert estimates, answers those questions.

How the rise is split. With event shares ``w`` and mean squared errors ``m`` of a
segment ``s`` before (``b``) and after (``a``) the change, and ``m_b`` the overall level
before it, segment ``s`` contributes

    ``c_s = w_a[s] (m_a[s] - m_b[s]) + (w_a[s] - w_b[s]) (m_b[s] - m_b)``

to the rise ``m_a - m_b``: its own rise, weighted by how much of the traffic it is now,
plus what its growing or shrinking share moved the mix (a segment that was always worse
than average and now draws more events raises the overall error without getting worse
itself). The contributions of a partition sum to the whole rise exactly, so each
segment's ``share_of_rise`` is ``c_s / (m_a - m_b)``. A segment without events before
the change (newcomers) is measured against the overall level before it.

Segments: **new vs returning users** (new: fewer than ``new_user_events`` events in the
buffer before the change point; the property belongs to the user, so a cohort the model
never saw is told apart from old users whose taste moved; only the buffer is looked at)
and **head vs tail items** (the head: the most popular items, by their events in the
buffer when each event arrived, that draw the first ``head_share`` of the events
compared, the short head of Abdollahpouri et al.; a share of events, not of items,
keeps the head the same size in traffic whatever the catalogue's size).

The top users and items are ranked by their rise of mean squared error, each needing
``min_events`` events after the change, so one unlucky rating cannot top the list; their
level before is their own where they had ``min_events`` events, else the overall one.

References
----------
Himan Abdollahpouri, Masoud Mansoury, Robin Burke and Bamshad Mobasher. "The unfairness
of popularity bias in recommendation." RMSE workshop at RecSys 2019 (head: the popular
items that take up 20 % of the ratings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from drift.batch_ids import distinct, look_up, repeats

__all__ = ["SegmentBuffer", "SegmentRules", "attribute_rise"]


@dataclass(frozen=True)
class SegmentRules:
    """How a rise is attributed; see the module docstring for why each is what it is.

    Attributes
    ----------
    reference_events
        The level before the change is read off at most this many events just before
        it: long enough to average over heavy users' sessions, recent enough to be the
        level the alert compared against.
    new_user_events
        A user with fewer events than this before the change point is new (>= 1).
    head_share
        Share of the compared events the head items draw, in (0, 1).
    min_events
        Fewest events after the change for a user or item to be ranked (>= 1): with
        three, one unlucky rating cannot top the list, yet users get listed at the
        alert, a thousand or two events after the change, when most have rated only a
        few items since.
    top
        Users and items listed (>= 0).
    """

    reference_events: int = 20_000
    new_user_events: int = 1
    head_share: float = 0.2
    min_events: int = 3
    top: int = 10

    def __post_init__(self) -> None:
        for name, least in (
            ("reference_events", 1),
            ("new_user_events", 1),
            ("min_events", 1),
            ("top", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not 0.0 < self.head_share < 1.0:
            raise ValueError(f"head_share must be in (0, 1), got {self.head_share!r}")

    def as_dict(self) -> dict[str, Any]:
        """The rules as plain JSON, recorded with each report."""
        return {
            "reference_events": self.reference_events,
            "new_user_events": self.new_user_events,
            "head_share": self.head_share,
            "min_events": self.min_events,
            "top": self.top,
        }


class SegmentBuffer:
    """The newest labelled events, their squared errors, and the split of a rise.

    Memory is bounded by ``capacity`` events (a few dozen bytes each) and by the ids
    the buffer has codes for, at most about twice as many as it holds events (the
    table of codes is rebuilt from the events kept when it grows past that). Each id
    gets a small integer code once, so ``record`` is a dictionary look-up per id and a
    compiled loop for the item counters, and ``report`` works on integer arrays: the
    events compared (the reference before the change and everything after it) and one
    count per user of the events before the change.

    Parameters
    ----------
    capacity
        Events kept (>= 2). It must cover the events since the change point, the
        ``reference_events`` before it, and history enough for "new" to mean new.
    rules
        How the rise is attributed.

    Examples
    --------
    >>> import numpy as np
    >>> position = np.arange(600)
    >>> users = [f"u{k % 20}" for k in position]
    >>> items = [f"i{k % 30}" for k in position]
    >>> drifted = (position >= 400) & (position % 20 < 5)  # u0-u4 change their taste
    >>> buffer = SegmentBuffer(capacity=1_000)
    >>> buffer.record(users, items, np.where(drifted, 2.5, 0.5), after=0)
    >>> report = buffer.report(change_events=400)
    >>> report["events_before"], report["events_after"], round(report["mse_rise"], 2)
    (400, 200, 0.5)
    >>> round(report["users"]["returning"]["share_of_rise"], 2)
    1.0
    >>> sorted(entry["id"] for entry in report["top_users"][:5])
    ['u0', 'u1', 'u2', 'u3', 'u4']
    """

    def __init__(self, capacity: int = 100_000, rules: SegmentRules | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 2:
            raise ValueError(f"capacity must be an integer >= 2, got {capacity!r}")
        self.capacity = capacity
        self.rules = rules if rules is not None else SegmentRules()
        self._positions = np.zeros(capacity, dtype=np.int64)
        self._users = np.full(capacity, -1, dtype=np.int64)
        self._items = np.full(capacity, -1, dtype=np.int64)
        self._errors = np.zeros(capacity, dtype=np.float64)
        self._popularity = np.zeros(capacity, dtype=np.int64)
        self._user_codes = _Codes()
        self._item_codes = _Codes()
        #: Events in the buffer per item code.
        self._item_events = np.zeros(0, dtype=np.int64)
        self._next = 0
        self._size = 0
        #: Whether every event came after the ones before it (then a report reads the
        #: events either side of the change as two runs of the buffer).
        self._increasing = True

    def __len__(self) -> int:
        return self._size

    @property
    def _item_counts(self) -> dict[str, int]:
        """The items in the buffer and their events."""
        names = self._item_codes.names
        return {names[k]: int(n) for k, n in enumerate(self._item_events.tolist()) if n}

    def record(
        self,
        users: Sequence[str],
        items: Sequence[str],
        squared_errors: ArrayLike,
        *,
        after: int,
    ) -> None:
        """Add labelled events in arrival order.

        Parameters
        ----------
        users, items
            The events' ids, ``n`` each.
        squared_errors
            The serving model's squared error on each event, shape ``(n,)``.
        after
            Events seen before these: they get positions ``after + 1 .. after + n``,
            the same count the alerts' ``events_seen`` and ``change_events`` use.
        """
        errors = np.asarray(squared_errors, dtype=np.float64).reshape(-1)
        if not len(users) == len(items) == errors.size:
            raise ValueError("users, items and squared_errors must have the same length")
        if not errors.size:
            return
        if self._size and after + 1 <= self._newest_position():
            self._increasing = False
        self._compact_codes()
        user_codes = self._user_codes.encode(users)
        item_codes = self._item_codes.encode(items)
        if self._item_events.size < len(self._item_codes):
            grown = np.zeros(2 * len(self._item_codes), dtype=np.int64)
            grown[: self._item_events.size] = self._item_events
            self._item_events = grown
        positions = after + 1 + np.arange(errors.size, dtype=np.int64)
        for start in range(0, errors.size, self.capacity):
            part = slice(start, start + self.capacity)
            self._write(user_codes[part], item_codes[part], errors[part], positions[part])

    def _newest_position(self) -> int:
        return int(self._positions[(self._next - 1) % self.capacity])

    def _write(
        self,
        users: np.ndarray,
        items: np.ndarray,
        errors: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        """Store at most ``capacity`` events over the oldest, counting item popularity."""
        n = errors.size
        slots = (self._next + np.arange(n)) % self.capacity
        popularity = np.empty(n, dtype=np.int64)
        _count_items(items, self._items[slots], self._item_events, popularity)
        self._users[slots] = users
        self._items[slots] = items
        self._errors[slots] = errors
        self._positions[slots] = positions
        self._popularity[slots] = popularity
        self._next = int((self._next + n) % self.capacity)
        self._size = min(self.capacity, self._size + n)

    def _compact_codes(self) -> None:
        """Give the ids of the events kept new codes once the tables hold more than
        twice as many ids as the buffer holds events (ids long gone still had codes)."""
        limit = 2 * self.capacity
        if len(self._user_codes) <= limit and len(self._item_codes) <= limit:
            return
        kept = slice(0, self._size)  # the slots in use (all of them once full)
        self._user_codes, self._users[kept] = self._user_codes.compacted(self._users[kept])
        old_items = self._items[kept]
        self._item_codes, new_items = self._item_codes.compacted(old_items)
        events = np.zeros(len(self._item_codes), dtype=np.int64)
        events[new_items] = self._item_events[old_items]
        self._item_events = events
        self._items[kept] = new_items

    def _span(self, column: np.ndarray, start: int = 0) -> np.ndarray:
        """``column`` of the ``start``-th oldest event up to the newest."""
        if self._size < self.capacity:
            return column[start : self._size]
        first = self._next + start
        if first < self.capacity:
            return np.concatenate([column[first:], column[: self._next]])
        return column[first - self.capacity : self._next]

    def _ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The buffer's columns, oldest event first, ids as ``str`` objects."""
        return (
            self._span(self._positions),
            self._user_codes.decode(self._span(self._users)),
            self._item_codes.decode(self._span(self._items)),
            self._span(self._errors),
            self._span(self._popularity),
        )

    def report(self, change_events: int) -> dict[str, Any] | None:
        """How the rise after ``change_events`` splits across segments, as plain JSON.

        The same figures ``attribute_rise`` gives on the whole buffer: only the events
        it compares are gathered, since the others count only in the users' events
        before the change.

        Returns
        -------
        dict or None
            See ``attribute_rise``; None when the buffer holds no event on one side of
            the change (a change older than the buffer, or the buffer emptied by a
            restart).
        """
        if not self._increasing:
            return attribute_rise(*self._ordered(), change_events, self.rules)
        positions = self._span(self._positions)
        old = int(np.searchsorted(positions, change_events, side="right"))
        first = max(0, old - self.rules.reference_events)
        earlier = np.bincount(self._span(self._users)[:old], minlength=len(self._user_codes))
        compared = _Events(
            positions[first:],
            self._span(self._users, first),
            self._span(self._items, first),
            self._span(self._errors, first),
            self._span(self._popularity, first),
        )
        names = (self._user_codes.names, self._item_codes.names)
        return _attribute(compared, earlier, names, change_events, self.rules)


class _Codes:
    """Small integer codes of ids, in order of first appearance."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self.names)

    def encode(self, ids: Sequence[str]) -> np.ndarray:
        """The codes of ``ids``, shape ``(n,)``; new ids get the next codes."""
        index = self._index
        first: Sequence[str]
        at: np.ndarray | None
        if repeats(ids):
            first, at = distinct(ids)
            codes = np.fromiter(map(index.get, first, repeat(-1)), np.int64, count=len(first))
        else:
            first, at = ids, None
            codes = look_up(ids, self, index.get)
        missing = np.flatnonzero(codes < 0).tolist()
        if missing:
            # New ids are numbered in sorted order, so that codes do not depend on the
            # order within the batch or on string hashing.
            for name in sorted({first[j] for j in missing}):
                index[name] = len(self.names)
                self.names.append(name)
            codes[missing] = [index[first[j]] for j in missing]
        return codes if at is None else codes[at]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """The ids of ``codes`` as an object array."""
        names = np.empty(codes.size, dtype=object)
        names[:] = [self.names[k] for k in codes.tolist()]
        return names

    def compacted(self, codes: np.ndarray) -> tuple[_Codes, np.ndarray]:
        """Codes for only the ids of ``codes``, numbered afresh (a new table: codes
        looked up by ``look_up`` are kept per table), and their new codes."""
        kept, new_codes = np.unique(codes, return_inverse=True)
        fresh = _Codes()
        fresh.names = [self.names[k] for k in kept.tolist()]
        fresh._index = {name: k for k, name in enumerate(fresh.names)}
        return fresh, new_codes.reshape(-1)


@njit(cache=True, nogil=True)
def _count_items(
    items: np.ndarray, leaving: np.ndarray, events: np.ndarray, popularity: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Each arriving item's events in the buffer when it arrives (after the event its
    slot pushes out has left), counting it in; ``leaving`` is -1 for an empty slot."""
    for k in range(items.size):
        gone = leaving[k]
        if gone >= 0:
            events[gone] -= 1
        popularity[k] = events[items[k]]
        events[items[k]] += 1


@dataclass(frozen=True)
class _Events:
    """The columns of the events a report looks at, oldest first, shape ``(n,)`` each;
    ids as integer codes."""

    positions: np.ndarray
    users: np.ndarray
    items: np.ndarray
    errors: np.ndarray
    popularity: np.ndarray


def attribute_rise(
    positions: np.ndarray,
    users: np.ndarray,
    items: np.ndarray,
    squared_errors: np.ndarray,
    popularity: np.ndarray,
    change_events: int,
    rules: SegmentRules,
) -> dict[str, Any] | None:
    """Split the rise of mean squared error after ``change_events`` across segments.

    Parameters
    ----------
    positions
        Each event's position in the stream, increasing, shape ``(n,)``.
    users, items
        Each event's ids, shape ``(n,)`` (object arrays of ``str``).
    squared_errors
        Each event's squared prediction error, shape ``(n,)``.
    popularity
        Each event's item popularity when it arrived, shape ``(n,)``.
    change_events
        The change point: events at positions above it come after the change.
    rules
        How the rise is attributed.

    Returns
    -------
    dict or None
        ``change_events``; ``events_before`` and ``events_after`` compared;
        ``rmse_before``, ``rmse_after`` and ``mse_rise``; ``users`` (``new``,
        ``returning``) and ``items`` (``head``, ``tail``), each segment with its
        ``events_before``, ``events_after``, ``rmse_before``, ``rmse_after`` and
        ``share_of_rise`` (None unless the error rose); ``head_min_popularity``;
        ``top_users`` and ``top_items``; ``rules``. None when either side is empty.
    """
    user_names, user_codes = _factorize(users)
    item_names, item_codes = _factorize(items)
    earlier = np.bincount(user_codes[positions <= change_events], minlength=len(user_names))
    events = _Events(positions, user_codes, item_codes, squared_errors, popularity)
    return _attribute(events, earlier, (user_names, item_names), change_events, rules)


def _attribute(
    events: _Events,
    earlier: np.ndarray,
    names: tuple[Sequence[str], Sequence[str]],
    change_events: int,
    rules: SegmentRules,
) -> dict[str, Any] | None:
    """``attribute_rise`` on coded ``events``: ``earlier`` counts each user code's events
    before the change (also those older than ``events``), ``names`` the user and item
    ids of the codes."""
    old = events.positions <= change_events
    after = ~old
    before = old & (np.cumsum(old[::-1])[::-1] <= rules.reference_events)
    if not (before.any() and after.any()):
        return None
    squared_errors = events.errors
    mse_before = float(squared_errors[before].mean())
    mse_after = float(squared_errors[after].mean())
    rise = mse_after - mse_before
    new_user = earlier[events.users] < rules.new_user_events
    compared = before | after
    threshold = _head_threshold(events.popularity[compared], rules.head_share)
    head = events.popularity >= threshold
    sides = _Sides(squared_errors, before, after, mse_before, rise)
    user_names, item_names = names
    return {
        "change_events": int(change_events),
        "events_before": int(before.sum()),
        "events_after": int(after.sum()),
        "rmse_before": float(np.sqrt(mse_before)),
        "rmse_after": float(np.sqrt(mse_after)),
        "mse_rise": rise,
        "users": {"new": sides.segment(new_user), "returning": sides.segment(~new_user)},
        "items": {"head": sides.segment(head), "tail": sides.segment(~head)},
        "head_min_popularity": int(threshold),
        "top_users": sides.top(events.users, user_names, rules),
        "top_items": sides.top(events.items, item_names, rules),
        "rules": rules.as_dict(),
    }


def _head_threshold(popularity: np.ndarray, head_share: float) -> int:
    """The least popularity of a head event: the most popular events up to ``head_share``
    of them are the head (ties at the boundary join it)."""
    last = max(0, int(np.ceil(head_share * popularity.size)) - 1)
    # The (last + 1)-th largest, without sorting the rest.
    at = popularity.size - 1 - last
    return int(np.partition(popularity, at)[at])


@dataclass(frozen=True)
class _Sides:
    """The errors and the before/after masks a report compares, shared by its parts."""

    errors: np.ndarray
    before: np.ndarray
    after: np.ndarray
    mse_before: float
    rise: float

    def segment(self, member: np.ndarray) -> dict[str, Any]:
        """One segment's counts, levels and share of the rise (see the module docstring)."""
        n_before = int((member & self.before).sum())
        n_after = int((member & self.after).sum())
        m_before = _mean(self.errors[member & self.before])
        m_after = _mean(self.errors[member & self.after])
        w_before = n_before / int(self.before.sum())
        w_after = n_after / int(self.after.sum())
        level = self.mse_before if m_before is None else m_before
        own_rise = 0.0 if m_after is None else m_after - level
        contribution = w_after * own_rise + (w_after - w_before) * (level - self.mse_before)
        return {
            "events_before": n_before,
            "events_after": n_after,
            "rmse_before": None if m_before is None else float(np.sqrt(m_before)),
            "rmse_after": None if m_after is None else float(np.sqrt(m_after)),
            "share_of_rise": contribution / self.rise if self.rise > 0 else None,
        }

    def top(self, codes: np.ndarray, names: Sequence[str], rules: SegmentRules) -> list[dict]:
        """The ``rules.top`` ids whose mean squared error rose most, with
        ``rules.min_events`` events after the change at least; ``names`` are the ids
        of the ``codes``."""
        size = len(names)
        n_after = np.bincount(codes[self.after], minlength=size)
        n_before = np.bincount(codes[self.before], minlength=size)
        sum_after = np.bincount(codes[self.after], weights=self.errors[self.after], minlength=size)
        sum_before = np.bincount(
            codes[self.before], weights=self.errors[self.before], minlength=size
        )
        own = n_before >= rules.min_events
        mean_after = sum_after / np.maximum(n_after, 1)
        mean_before = sum_before / np.maximum(n_before, 1)
        rise = mean_after - np.where(own, mean_before, self.mse_before)
        eligible = np.flatnonzero(n_after >= rules.min_events)
        # Largest rise first; ties by more events after, then by id, so lists reproduce.
        ids = np.array([names[k] for k in eligible.tolist()], dtype=str)
        by_id = np.argsort(np.argsort(ids))
        order = eligible[np.lexsort((by_id, -n_after[eligible], -rise[eligible]))]
        return [
            {
                "id": str(names[k]),
                "events_before": int(n_before[k]),
                "events_after": int(n_after[k]),
                "rmse_before": float(np.sqrt(mean_before[k])) if n_before[k] else None,
                "rmse_after": float(np.sqrt(mean_after[k])),
                "mse_rise": float(rise[k]),
                "baseline": "own" if own[k] else "overall",
            }
            for k in order[: rules.top]
        ]


def _factorize(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """``(names, codes)`` with ``names[code] == value`` for each value, names in order of
    first appearance: a dict pass, several times faster than sorting Python strings
    (``attribute_rise`` on object arrays; a ``SegmentBuffer`` keeps codes as it goes)."""
    index: dict[str, int] = {}
    codes = np.fromiter(
        (index.setdefault(value, len(index)) for value in values.tolist()),
        dtype=np.int64,
        count=values.size,
    )
    return list(index), codes


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None
