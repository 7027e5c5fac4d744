"""Top-K recommendations from the learner's published state.

Lock-free and without I/O: the serving model's view, the user's rated items and the
popular ranking are in-memory snapshots that the learner replaces whole, each taken
once. An acknowledged event is in all three before ``ingest`` returns, so the user's
next request reflects it. The items and the version named in an answer always belong
together, whatever swap or batch happens meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from service.serving.history import RatedItems
from service.serving.model import ServingModel
from service.serving.popular import PopularItems


@dataclass(frozen=True)
class Recommendation:
    user_id: str
    items: list[tuple[str, float]]
    model_version: str
    source: str  # "model" or "popular"


class OnlineState(Protocol):
    """What the recommender reads: the learner's serving state, rated and popular items."""

    serving: ServingModel
    history: RatedItems
    popular: PopularItems


class Recommender:
    """Answers ``/recommend`` from the online state; users the model cannot place get
    what is popular now."""

    def __init__(self, state: OnlineState, index_min_items: int) -> None:
        self.state = state
        #: Catalogues below this size are scored whole (no index is built for them).
        self.index_min_items = index_min_items

    @property
    def is_quick(self) -> bool:
        """Whether ``recommend`` costs well under a millisecond now: an item index
        serves it, or the catalogue is below the size that would get one."""
        view = self.state.serving.view
        items = 0 if view.model is None else view.model.n_items
        return view.index is not None or items < self.index_min_items

    @property
    def searches_index(self) -> bool:
        """Whether ``recommend`` asks an item index now (which searches without
        holding the interpreter) rather than scoring the catalogue."""
        return self.state.serving.view.index is not None

    def recommend(self, user_id: str, k: int) -> Recommendation:
        """Top-``k`` items ``user_id`` has not rated."""
        return self.recommend_many([(user_id, k)])[0]

    def recommend_many(self, asked: Sequence[tuple[str, int]]) -> list[Recommendation]:
        """``recommend`` of each (user, k), from one view: one index search for all."""
        state = self.state
        view = state.serving.view
        version = view.version or "none"
        history, popular = state.history, state.popular
        seen = [history.items(user_id) for user_id, _ in asked]
        personal = view.recommend_many(
            [(user_id, k, items) for (user_id, k), items in zip(asked, seen, strict=True)]
        )
        return [
            Recommendation(user_id, answer, version, "model")
            if answer is not None
            else Recommendation(user_id, popular.top(k, items), version, "popular")
            for (user_id, k), items, answer in zip(asked, seen, personal, strict=True)
        ]
