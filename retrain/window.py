"""The data a retraining job learns from.

A window is the events since the serving model's version plus a uniform sample of older
history, so the model adapts to what changed without forgetting what did not. A job a
drift alert started weighs the change more: every event since the estimated change
point, and a smaller uniform sample of what came before (``ChangeWindowPolicy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from functions.mf import BiasedMF

#: Fewest events since the change a user needs before ``changed_users`` judges them.
CHANGED_USER_MIN_EVENTS = 3


@dataclass(frozen=True)
class RatingsWindow:
    """Labelled events as parallel columns (``n`` events)."""

    user_ids: list[str]
    item_ids: list[str]
    ratings: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.user_ids) == len(self.item_ids) == len(self.ratings):
            raise ValueError("user_ids, item_ids and ratings must have the same length")

    def __len__(self) -> int:
        return len(self.user_ids)

    def take(self, mask: np.ndarray) -> RatingsWindow:
        rows = np.flatnonzero(mask)
        return RatingsWindow(
            [self.user_ids[r] for r in rows],
            [self.item_ids[r] for r in rows],
            self.ratings[rows],
        )

    def split_holdout(self, every: int = 10) -> tuple[RatingsWindow, RatingsWindow]:
        """(train, holdout) where the holdout is every ``every``-th event.

        A stride rather than a random draw keeps a job's figures reproducible.
        """
        if every < 2 or len(self) < every:
            return self, RatingsWindow([], [], np.empty(0))
        holdout = np.zeros(len(self), dtype=bool)
        holdout[every - 1 :: every] = True
        return self.take(~holdout), self.take(holdout)


class WindowSource(Protocol):
    """Where windows come from; the service implements it over its event store."""

    def since(self, after_id: int, up_to_id: int) -> RatingsWindow: ...

    def uniform_sample(self, up_to_id: int, size: int, seed: int) -> RatingsWindow:
        """``size`` events with ``id <= up_to_id`` drawn uniformly without replacement
        (all of them when fewer), the same ones for the same seed."""
        ...


@dataclass(frozen=True)
class WindowPolicy:
    """How much history joins the new events: ``history_sample`` older events at most,
    drawn uniformly by ``seed`` (the same draw the archive keeps a sample for,
    ``service.store.archive_sample``, so a window costs the same however long the
    history). ``max_recent`` bounds the new events to the newest of the log: a version
    that keeps serving for long (the rollout guard holds its successors) would otherwise
    give every refresh a window as long as the stream since it."""

    history_sample: int = 50_000
    seed: int = 0
    max_recent: int | None = None

    def __post_init__(self) -> None:
        _check_max_recent(self.max_recent)

    def build(
        self, source: WindowSource, since_id: int, up_to_id: int, base: BiasedMF | None = None
    ) -> RatingsWindow:
        """The window; ``base`` (the version the job starts from) is not used here."""
        start = _bounded(since_id, up_to_id, self.max_recent)
        recent = source.since(start, up_to_id)
        older = (
            source.uniform_sample(start, self.history_sample, self.seed)
            if start > 0 and self.history_sample > 0
            else None
        )
        if older is None or len(older) == 0:
            return recent
        return RatingsWindow(
            older.user_ids + recent.user_ids,
            older.item_ids + recent.item_ids,
            np.concatenate([older.ratings, recent.ratings]),
        )


@dataclass(frozen=True)
class ChangeWindowPolicy:
    """A drift job's window: every event after ``after_id``, where the change began, and
    a uniform sample of older events at most ``history_ratio`` times as many.

    After a drift the newest events are the only ones that show the new taste, and the
    default window dilutes them: a job soon after the change holds a few thousand new
    events against up to ``history_sample`` old ones, and fits the old taste it was
    called to correct. Here the new events are the majority for any ratio below 1, and
    the older sample (uniform over all history before the change, so no period is
    favoured) keeps the model from forgetting users and items the change left alone.
    The version the job starts from does not matter: every event since the change is
    in, whether that version saw it or not.

    Parameters
    ----------
    after_id
        Id of the last event before the estimated change point.
    history_ratio
        Older events per event since the change, >= 0.
    history_sample
        Older events at most, whatever the ratio (the default window's bound).
    seed
        Seed of the older sample; the same seed draws the same events.
    user_change_ratio
        A user whose events since the change the job's base version predicts with an
        RMSE at least this many times the window's (``changed_users``) is learnt from
        the change on: their older events leave the sample. None: every user's stay.
    max_recent
        Events after the change at most, the newest (see ``WindowPolicy``); the older
        ones count as history. None: all of them.

    Examples
    --------
    >>> import numpy as np
    >>> class Source:
    ...     def since(self, after_id, up_to_id):
    ...         return RatingsWindow(["new"] * (up_to_id - after_id), ["i"] * (up_to_id - after_id),
    ...                              np.ones(up_to_id - after_id))
    ...     def uniform_sample(self, up_to_id, size, seed):
    ...         n = min(size, up_to_id)
    ...         return RatingsWindow(["old"] * n, ["i"] * n, np.ones(n))
    >>> window = ChangeWindowPolicy(after_id=900, history_ratio=0.5).build(Source(), 0, 1_000)
    >>> window.user_ids.count("new"), window.user_ids.count("old")
    (100, 50)
    """

    after_id: int
    history_ratio: float
    history_sample: int = 50_000
    seed: int = 0
    user_change_ratio: float | None = None
    max_recent: int | None = None

    def __post_init__(self) -> None:
        if self.user_change_ratio is not None and not self.user_change_ratio > 0:
            raise ValueError(f"user_change_ratio must be > 0, got {self.user_change_ratio}")
        if self.after_id < 0:
            raise ValueError(f"after_id must be >= 0, got {self.after_id}")
        if not self.history_ratio >= 0:
            raise ValueError(f"history_ratio must be >= 0, got {self.history_ratio}")
        if self.history_sample < 0:
            raise ValueError(f"history_sample must be >= 0, got {self.history_sample}")
        _check_max_recent(self.max_recent)

    def build(
        self, source: WindowSource, since_id: int, up_to_id: int, base: BiasedMF | None = None
    ) -> RatingsWindow:
        """The window over events up to ``up_to_id``; ``since_id`` (the version's last
        event) is not used, see the class docstring. ``base`` judges which users
        changed (``user_change_ratio``)."""
        start = _bounded(min(self.after_id, up_to_id), up_to_id, self.max_recent)
        recent = source.since(start, up_to_id)
        size = min(self.history_sample, int(self.history_ratio * len(recent)))
        if start == 0 or size == 0:
            return recent
        older = source.uniform_sample(start, size, self.seed)
        if base is not None and self.user_change_ratio is not None:
            changed = changed_users(recent, base, self.user_change_ratio)
            older = older.take(np.array([user not in changed for user in older.user_ids]))
        return RatingsWindow(
            older.user_ids + recent.user_ids,
            older.item_ids + recent.item_ids,
            np.concatenate([older.ratings, recent.ratings]),
        )


def _check_max_recent(max_recent: int | None) -> None:
    if max_recent is not None and max_recent < 1:
        raise ValueError(f"max_recent must be at least 1, got {max_recent}")


def _bounded(start: int, up_to_id: int, max_recent: int | None) -> int:
    """``start``, moved later so that at most ``max_recent`` ids follow it up to
    ``up_to_id``."""
    return start if max_recent is None else max(start, up_to_id - max_recent)


def changed_users(recent: RatingsWindow, model: BiasedMF, ratio: float) -> set[str]:
    """Users whose ``recent`` events ``model`` predicts with an RMSE at least ``ratio``
    times that of all of ``recent`` (from ``CHANGED_USER_MIN_EVENTS`` events on).

    Their older events teach the taste they left: kept in a drift job's sample they
    pull the user's vector back to it, and a user inverted after the change ends up
    in between (bench drift, history ratio 2: a synthetic taste inversion's RMSE
    after the onset 1.0374 with them, 1.0247 without, river's BiasedMF 1.0272). A change that moved
    every user a little (items re-rated, bench drift's ``item_shift``) singles out
    none, and every user's history stays.

    Examples
    --------
    >>> model = BiasedMF.from_arrays({**BiasedMF(factors=1).to_arrays(),
    ...     "global_mean": np.array(3.0), "user_ids": np.array(["a", "b"]),
    ...     "item_ids": np.array(["i"]), "user_bias": np.zeros(2), "item_bias": np.zeros(1),
    ...     "user_factors": np.zeros((2, 1)), "item_factors": np.zeros((1, 1))})
    >>> recent = RatingsWindow(["a"] * 3 + ["b"] * 3, ["i"] * 6,
    ...                        np.array([3.0, 3.0, 3.0, 5.0, 5.0, 5.0]))
    >>> sorted(changed_users(recent, model, 1.4))
    ['b']
    """
    if len(recent) == 0:
        return set()
    errors = (recent.ratings - model.predict(recent.user_ids, recent.item_ids)) ** 2
    users, positions, counts = np.unique(
        np.array(recent.user_ids), return_inverse=True, return_counts=True
    )
    per_user = np.bincount(positions, weights=errors) / counts
    worse = (per_user >= ratio**2 * errors.mean()) & (counts >= CHANGED_USER_MIN_EVENTS)
    return {str(user) for user in users[worse]}
