"""Building the next serving state: a version, the fold-in of what it has not seen, its index.

A version knows each user's long-run taste; the fold-in knows their latest ratings,
which a version trained on everything averages away. So the fold-in of a new serving
state starts ``FOLD_IN_REPLAY_EVENTS`` before the version's last event, then catches up
with the events stored while it replayed, round after round, until a round finds at most
``TAIL_EVENTS``: the caller folds that tail in under the learner's lock, just before the
switch, so ingestion keeps flowing meanwhile. No round reads past the log position the
learner has applied (``upto``): the events after it reach the new state through the
learner, once. The item index (``SERVING_INDEX``) is built last, outside the lock too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from service.serving.index import IndexOptions, build_index
from service.serving.model import ServingModel
from service.serving.registry import LoadedVersion
from service.store import Database
from service.store.eventlog import EventLog
from service.store.events import labelled_events

log = logging.getLogger(__name__)

#: A round that folds in at most this many events ends the catch-up.
TAIL_EVENTS = 2_000
#: Most catch-up rounds before the tail is left to the caller whatever its size.
CATCH_UP_ROUNDS = 5
#: The catch-up rounds' pause between chunks of events (``ServingModel.learn``), so a
#: replay beside the request loop leaves it room.
FOLD_IN_PAUSE_S = 0.005


@dataclass(frozen=True)
class FoldInOptions:
    """The online model's settings (``FOLD_IN_*``, ``SERVING_*``)."""

    regularization: float
    bias_regularization: float
    item_bias_regularization: float | None
    ranking_item_bias_regularization: float | None
    scale_regularization: float
    forgetting: float
    rating_range: tuple[float, float]
    max_users: int | None
    max_items: int | None
    cached_answers: int
    answer_max_age_s: float
    replay_events: int


@dataclass
class NextServing:
    """A serving state under construction, and the id of the newest event it learnt."""

    serving: ServingModel
    caught_up_to: int


class ServingBuilder:
    """Builds serving states from versions and the event store."""

    def __init__(
        self,
        db: Database,
        options: FoldInOptions,
        index_options: IndexOptions,
        event_log: EventLog | None = None,
    ) -> None:
        self.db = db
        self.options = options
        self.index_options = index_options
        #: Reads a replay reaching back past the table into the archive (event retention).
        self.event_log = event_log

    def empty(self) -> ServingModel:
        """The serving state before any version: a running mean plus online biases."""
        return self._model(None)

    def build(self, loaded: LoadedVersion, upto: Callable[[], int]) -> NextServing:
        """``loaded`` with the replay and the catch-up up to ``upto()`` folded in and its
        index built."""
        serving = self._model(loaded)
        start = max(0, min(loaded.last_event_id - self.options.replay_events, upto()))
        next_state = NextServing(serving, start)
        for _round in range(CATCH_UP_ROUNDS):
            if self.catch_up(next_state, upto(), FOLD_IN_PAUSE_S) <= TAIL_EVENTS:
                break
        self._index(serving)
        return next_state

    def catch_up(self, next_state: NextServing, upto: int, pause_s: float = 0.0) -> int:
        """Fold in the labelled events stored after ``next_state.caught_up_to`` up to
        ``upto``; returns how many there were."""
        if upto <= next_state.caught_up_to:
            return 0
        with self.db.connect() as conn:
            if self.event_log is None:
                events = labelled_events(conn, after_id=next_state.caught_up_to, up_to_id=upto)
            else:
                events = self.event_log.labelled(conn, next_state.caught_up_to, upto)
        next_state.serving.learn(events.user_ids, events.item_ids, events.ratings, pause_s)
        next_state.caught_up_to = upto
        return len(events)

    def _model(self, loaded: LoadedVersion | None) -> ServingModel:
        options = self.options
        return ServingModel(
            loaded.model if loaded else None,
            loaded.version if loaded else None,
            regularization=options.regularization,
            bias_regularization=options.bias_regularization,
            item_bias_regularization=options.item_bias_regularization,
            ranking_item_bias_regularization=options.ranking_item_bias_regularization,
            scale_regularization=options.scale_regularization,
            forgetting=options.forgetting,
            rating_range=options.rating_range,
            max_users=options.max_users,
            max_items=options.max_items,
            cached_answers=options.cached_answers,
            answer_max_age_s=options.answer_max_age_s,
        )

    def _index(self, serving: ServingModel) -> None:
        """Build the item index ``SERVING_INDEX`` asks for and hand it to ``serving``."""
        model = serving.model
        if model is None:
            return
        index = build_index(model.item_factors, serving.view.item_bias, self.index_options)
        serving.attach_index(index)
        if index is not None:
            log.info(
                "%s index of %d items for %s built in %.1f s",
                index.name,
                index.n_items,
                serving.version,
                index.build_seconds,
            )
