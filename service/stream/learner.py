"""The learner: test-then-train on every stored event, and the online state it owns.

Every labelled event is predicted by the version serving at that moment before anything
learns from it (prequential evaluation, ``docs/architecture.md`` "Data flow"); then it is
folded into its user's vector and its item's bias. Beside the serving track runs the
static track, the first version frozen without fold-in, so the gain of retraining and
fold-in can be read live. The ranking sample, the rated items and the popular items are
kept current on the same walk.

A version in shadow (``service.stream.shadow``), when the rollout guard runs one, is
predicted, ranked and learnt on the same walk: each labelled event by the serving state
and the shadow alike, before either learns it, so the two are compared on the same
events (``Evaluation.shadow``).

The learner applies the event log (the events table, in id order) and nothing else:
``applied`` is the newest id it has learnt, whoever stored the events, so replicas that
share a database learn the same events in the same order (``service.wiring``).

Ownership: the learner is the one writer of its state. ``lock`` orders everything that
adds events to it: the ingest path holds it from storing a batch to learning it (so the
store and the learnt state agree on which events are in), the log tail while it applies
other replicas' events, and a swap while it folds in the last events and installs the
next serving state. Readers (``/recommend``) take the published snapshots
(``serving.view``, ``history``, ``popular``) without it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from drift import PrequentialTracker
from functions.ids import IdCodes, Ids
from functions.mf import BiasedMF
from service.metrics import Metrics
from service.serving.history import RatedItems
from service.serving.model import ServingModel
from service.serving.popular import PopularItems
from service.serving.registry import LoadedVersion
from service.store import Database
from service.store.events import (
    NewEvent,
    count_events,
    labelled_events,
    max_event_id,
    recent_pairs,
)
from service.stream.ranking import PairedRanks, PrequentialRanking
from service.stream.shadow import ShadowBatch, ShadowTrack


@dataclass(frozen=True)
class Evaluation:
    """What test-then-train found on one batch's labelled events, for the monitor.

    ``labelled_before`` is how many labelled events the learner had seen before the
    batch; ``version`` is the serving version that predicted them and ``serving``
    whether any version serves (before the first, the monitor raises no alerts).
    ``shadow`` is what a version in shadow made of the same events (None: none runs).
    """

    users: Sequence[str]
    items: Sequence[str]
    squared_errors: np.ndarray
    static_squared_errors: np.ndarray
    labelled_before: int
    labelled_seen: int
    version: str | None
    serving: bool
    shadow: ShadowBatch | None = None

    @property
    def empty(self) -> bool:
        return not self.users


@dataclass(frozen=True)
class _Columns:
    """A batch's events as columns, taken once: every event's user and item (rated and
    popular items count them all), and the labelled events' users, items and ratings."""

    all_users: Ids
    all_items: Ids
    users: Ids
    items: Ids
    ratings: np.ndarray

    @classmethod
    def of(cls, stored: Sequence[NewEvent], item_codes: IdCodes | None) -> _Columns:
        """The columns, the ids as :class:`functions.ids.Ids`: each stage that maps them
        through a table meets each user's string once, stages mapping them through the
        same version's table share one look-up, and items are looked up by their
        codes in ``item_codes`` (None: by their strings)."""
        all_users = Ids.of([e.user_id for e in stored], repeated=True)
        all_items = Ids.of([e.item_id for e in stored], repeated=False, codes=item_codes)
        ratings = [e.rating for e in stored]
        if None not in ratings:  # the usual batch: every event rated
            return cls(all_users, all_items, all_users, all_items, np.array(ratings, dtype=float))
        labelled = [e for e in stored if e.rating is not None]
        return cls(
            all_users,
            all_items,
            Ids.of([e.user_id for e in labelled], repeated=True),
            Ids.of([e.item_id for e in labelled], repeated=False, codes=item_codes),
            np.array([e.rating for e in labelled], dtype=float),
        )


class Learner:
    """Test-then-train over stored events; owns the serving state and the tracks."""

    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        serving: ServingModel,
        ranking: PrequentialRanking,
        history: RatedItems,
        *,
        popular_window: int,
        history_pairs: int | None,
        rating_range: tuple[float, float],
        evaluate: bool = True,
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.serving = serving
        self.ranking = ranking
        self.history = history
        self.popular = PopularItems(popular_window)
        self.popular_window = popular_window
        self.history_pairs = history_pairs
        self.rating_range = rating_range
        #: The version serving now (None before the first), installed with ``serving``.
        self.current: LoadedVersion | None = None
        #: The never-retrained baseline: the first version, frozen, without fold-in.
        self.static: BiasedMF | None = None
        self.tracker = PrequentialTracker()
        self.labelled_seen = 0
        #: ``labelled_seen`` when the serving version was installed.
        self.seen_at_swap = 0
        #: A version the rollout guard runs beside the serving one (None: none).
        self.shadow: ShadowTrack | None = None
        self.lock = threading.Lock()
        #: The newest event id (log position) learnt; events are learnt in id order.
        self.applied = 0
        #: Whether events are evaluated before they are learnt (test, then train). A
        #: serving process leaves that to its stream process (``service.wiring``) and
        #: only folds the log in: no predictions, ranking sample or tracks.
        self.evaluate = evaluate
        #: Integer codes of the items the ingest path meets, for every table on it
        #: (None: tables look items up by their strings).
        self.item_codes: IdCodes | None = IdCodes()

    # -- start-up ---------------------------------------------------------------------
    def restore(self, static: BiasedMF | None) -> None:
        """Counters, rated items and popular items from the store after a restart.

        Every stored labelled event was evaluated right after its commit, so the count
        of labelled events carries on from the stored count.
        """
        self.static = static
        with self.db.connect() as conn:
            self.applied = max_event_id(conn)
            self.labelled_seen = count_events(conn, labelled_only=True, up_to_id=self.applied)
            self.history.add(*recent_pairs(conn, self.history_pairs))
            self.popular.add(*recent_pairs(conn, self.popular_window))

    def replay_all(self) -> None:
        """Fold in every stored labelled event (a restart with no version yet)."""
        with self.db.connect() as conn:
            replay = labelled_events(conn, up_to_id=self.applied)
        self.serving.learn(replay.user_ids, replay.item_ids, replay.ratings)

    # -- the ingest path (under ``lock``) --------------------------------------------
    def learn(self, stored: Sequence[NewEvent], position: int) -> Evaluation:
        """Evaluate then learn the events of the log up to ``position``; rated and
        popular items too."""
        batch = _Columns.of(stored, self.item_codes)
        evaluation = (
            self._evaluate_and_learn(stored, batch) if self.evaluate else self._fold_in(batch)
        )
        self.popular.add(batch.all_users, batch.all_items)
        self.applied = max(self.applied, position)
        return evaluation

    def _fold_in(self, batch: _Columns) -> Evaluation:
        """Learn without evaluating: the serving state, rated items and counters."""
        before = self.labelled_seen
        if batch.users:
            self.serving.learn(batch.users, batch.items, batch.ratings)
            self.labelled_seen += len(batch.users)
        self.history.add(batch.all_users, batch.all_items)
        nothing = np.empty(0)
        return Evaluation(
            [], [], nothing, nothing, before, self.labelled_seen, self.serving.version, False
        )

    def _evaluate_and_learn(self, stored: Sequence[NewEvent], batch: _Columns) -> Evaluation:
        view = self.serving.view  # the items as the batch found them, for ranking
        shadow = self.shadow
        shadow_view = None if shadow is None else shadow.view  # as the batch found it too
        before = self.labelled_seen
        if not batch.users:
            self.ranking.rank(
                stored, view, self.static, users=batch.all_users, items=batch.all_items
            )
            nothing = np.empty(0)
            return Evaluation([], [], nothing, nothing, before, before, view.version, False)
        users, items, ratings = batch.users, batch.items, batch.ratings
        predicted, vectors = self.serving.predict_then_learn_vectors(users, items, ratings)
        shadowed = None
        if shadow is not None and shadow_view is not None:
            shadow_predicted, shadow_vectors = shadow.predict_then_learn(users, items, ratings)
            shadowed = (shadow_view, shadow_vectors)
        ranks = self.ranking.rank(
            stored,
            view,
            self.static,
            vectors,
            users=batch.all_users,
            items=batch.all_items,
            shadow=shadowed,
        )
        static = self._static_predict(users, items, predicted)
        self.tracker.record("driftline", ratings, predicted)
        self.tracker.record("static", ratings, static)
        self.labelled_seen += len(users)
        self.metrics.labelled_events.inc(len(users))
        errors = (ratings - predicted) ** 2
        paired = None
        if shadow is not None and shadowed is not None and ranks is not None:
            paired = self._paired(shadow, errors, (ratings - shadow_predicted) ** 2, ranks)
        return Evaluation(
            users,
            items,
            errors,
            (ratings - static) ** 2,
            before,
            self.labelled_seen,
            self.serving.version,
            self.current is not None,
            paired,
        )

    def _paired(
        self, shadow: ShadowTrack, errors: np.ndarray, shadow_errors: np.ndarray, ranks: PairedRanks
    ) -> ShadowBatch:
        """What the serving state and ``shadow`` made of the batch, for the guard."""
        return ShadowBatch(
            version=shadow.version,
            serving_version=self.serving.version,
            role=shadow.role,
            users=ranks.users,
            user_codes=ranks.labelled_users,
            serving_errors=errors,
            shadow_errors=shadow_errors,
            ranked_codes=ranks.labelled_users[ranks.chosen],
            serving_ranks=ranks.served,
            shadow_ranks=ranks.shadowed,
        )

    def _static_predict(
        self, users: Sequence[str], items: Sequence[str], live: np.ndarray
    ) -> np.ndarray:
        """The static track's predictions; until a first version exists both tracks
        are the same predictor."""
        if self.static is None:
            return live
        return self.static.predict(users, items, clip=self.rating_range)

    # -- versions (under ``lock``) ------------------------------------------------------
    def install(self, serving: ServingModel, loaded: LoadedVersion) -> None:
        """Serve ``serving`` (built for ``loaded``) from now on; the first version
        installed becomes the static track's model."""
        self.serving = serving
        self.current = loaded
        self.seen_at_swap = self.labelled_seen
        if self.static is None:
            self.static = loaded.model

    def start_shadow(self, shadow: ShadowTrack) -> None:
        """Run ``shadow`` beside the serving state from the next batch on (its state
        caught up to ``applied``); it replaces any shadow running."""
        self.shadow = shadow

    def stop_shadow(self) -> ShadowTrack | None:
        """Stop running the shadow; returns it (None: none ran)."""
        shadow, self.shadow = self.shadow, None
        return shadow

    def promote_shadow(self, *, keep_replaced: bool) -> LoadedVersion | None:
        """Serve the shadow's state as it is (caught up: no rebuild); with
        ``keep_replaced`` the state it replaces runs on as the shadow (role
        ``previous``), else it is dropped. Returns the version replaced."""
        shadow = self.shadow
        if shadow is None:
            raise RuntimeError("no version in shadow to promote")
        replaced, state = self.current, self.serving
        self.install(shadow.serving, shadow.loaded)
        self.shadow = None
        if keep_replaced and replaced is not None:
            self.shadow = ShadowTrack(state, replaced, "previous")
        return replaced

    @property
    def labelled_since_swap(self) -> int | None:
        """Labelled events learnt since the serving version came in (None: none serves)."""
        return None if self.current is None else self.labelled_seen - self.seen_at_swap

    # -- reads ----------------------------------------------------------------------------
    def accuracy_summary(self) -> dict[str, dict[str, Any]]:
        """Running RMSE and, beside it, hit-rate@10 and NDCG@10 per track."""
        ranking = self.ranking.tracker
        return {
            track: {
                **stats,
                "hit_rate": ranking.hit_rate(track),
                "ndcg": ranking.ndcg(track),
                "ranked_events": ranking.count(track),
            }
            for track, stats in self.tracker.summary().items()
        }
