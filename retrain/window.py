"""The data a retraining job learns from.

A window is the events since the serving model's version plus an even sample of older
history, so the model adapts to what changed without forgetting what did not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


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

    def history_sample(self, up_to_id: int, size: int) -> RatingsWindow: ...


@dataclass(frozen=True)
class WindowPolicy:
    """How much history joins the new events: ``history_sample`` older events at most."""

    history_sample: int = 50_000

    def build(self, source: WindowSource, since_id: int, up_to_id: int) -> RatingsWindow:
        recent = source.since(since_id, up_to_id)
        older = source.history_sample(since_id, self.history_sample) if since_id > 0 else None
        if older is None or len(older) == 0:
            return recent
        return RatingsWindow(
            older.user_ids + recent.user_ids,
            older.item_ids + recent.item_ids,
            np.concatenate([older.ratings, recent.ratings]),
        )
