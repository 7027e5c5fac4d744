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
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

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

    Memory is bounded by ``capacity`` events (a few dozen bytes each besides the id
    strings, which the buffer shares with the events) and one counter per distinct
    item among them. ``record`` is a short loop per event for the item counters;
    ``report`` is vectorised and runs only when an alert is raised.

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
        self._users = np.empty(capacity, dtype=object)
        self._items = np.empty(capacity, dtype=object)
        self._errors = np.zeros(capacity, dtype=np.float64)
        self._popularity = np.zeros(capacity, dtype=np.int64)
        self._item_counts: dict[str, int] = {}
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

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
        positions = after + 1 + np.arange(errors.size, dtype=np.int64)
        for start in range(0, errors.size, self.capacity):
            part = slice(start, start + self.capacity)
            self._write(users[part], items[part], errors[part], positions[part])

    def _write(
        self,
        users: Sequence[str],
        items: Sequence[str],
        errors: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        """Store at most ``capacity`` events over the oldest, counting item popularity."""
        n = errors.size
        slots = (self._next + np.arange(n)) % self.capacity
        leaving = self._items[slots].tolist()
        counts = self._item_counts
        popularity = np.empty(n, dtype=np.int64)
        for k, item in enumerate(items):
            gone = leaving[k]
            if gone is not None:  # the oldest event leaves before this one is counted
                left = counts[gone] - 1
                if left:
                    counts[gone] = left
                else:
                    del counts[gone]
            seen = counts.get(item, 0)
            popularity[k] = seen
            counts[item] = seen + 1
        self._users[slots] = list(users)
        self._items[slots] = list(items)
        self._errors[slots] = errors
        self._positions[slots] = positions
        self._popularity[slots] = popularity
        self._next = int((self._next + n) % self.capacity)
        self._size = min(self.capacity, self._size + n)

    def _ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The buffer's columns, oldest event first."""
        if self._size < self.capacity:
            order = np.arange(self._size)
        else:
            order = (self._next + np.arange(self.capacity)) % self.capacity
        return (
            self._positions[order],
            self._users[order],
            self._items[order],
            self._errors[order],
            self._popularity[order],
        )

    def report(self, change_events: int) -> dict[str, Any] | None:
        """How the rise after ``change_events`` splits across segments, as plain JSON.

        Returns
        -------
        dict or None
            See ``attribute_rise``; None when the buffer holds no event on one side of
            the change (a change older than the buffer, or the buffer emptied by a
            restart).
        """
        return attribute_rise(*self._ordered(), change_events, self.rules)


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
    old = positions <= change_events
    after = ~old
    before = old & (np.cumsum(old[::-1])[::-1] <= rules.reference_events)
    if not (before.any() and after.any()):
        return None
    mse_before = float(squared_errors[before].mean())
    mse_after = float(squared_errors[after].mean())
    rise = mse_after - mse_before
    user_names, user_codes = _factorize(users)
    events_before_change = np.bincount(user_codes[old], minlength=user_names.size)
    new_user = events_before_change[user_codes] < rules.new_user_events
    compared = before | after
    threshold = _head_threshold(popularity[compared], rules.head_share)
    head = popularity >= threshold
    sides = _Sides(squared_errors, before, after, mse_before, rise)
    item_names, item_codes = _factorize(items)
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
        "top_users": sides.top(user_codes, user_names, rules),
        "top_items": sides.top(item_codes, item_names, rules),
        "rules": rules.as_dict(),
    }


def _head_threshold(popularity: np.ndarray, head_share: float) -> int:
    """The least popularity of a head event: the most popular events up to ``head_share``
    of them are the head (ties at the boundary join it)."""
    ranked = np.sort(popularity)[::-1]
    last = max(0, int(np.ceil(head_share * ranked.size)) - 1)
    return int(ranked[last])


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

    def top(self, codes: np.ndarray, names: np.ndarray, rules: SegmentRules) -> list[dict]:
        """The ``rules.top`` ids whose mean squared error rose most, with
        ``rules.min_events`` events after the change at least."""
        size = names.size
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
        by_id = np.argsort(np.argsort(names[eligible].astype(str)))
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


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)`` with ``names[codes] == values``, names in order of first
    appearance: a dict pass, several times faster than sorting Python strings."""
    index: dict[Any, int] = {}
    codes = np.fromiter(
        (index.setdefault(value, len(index)) for value in values.tolist()),
        dtype=np.int64,
        count=values.size,
    )
    names = np.empty(len(index), dtype=object)
    names[:] = list(index)
    return names, codes


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None
