"""Prequential ranking in the learner: hit-rate@10 and NDCG@10 beside the RMSE.

Each batch's sampled liked events (``drift.ranking.RankingSampler``) are ranked as they
stood before anything learnt them: by the serving model, with the user vector the event's
rating was predicted with (its user's earlier events count, those of the same batch too,
as for the RMSE) and the version's items as the batch found them, and by the
never-retrained first version; among the items the user had not rated before the
event, those the in-memory history holds plus the user's earlier events in the batch.
The ranks feed running figures (``tracker``) and the heartbeats, which carry the mean
of the ranked events they hold.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from immutables import Map

from drift.ranking import (
    DEFAULT_K,
    NOT_RANKED,
    RankingSampler,
    RankingTracker,
    hits,
    ndcg,
    ranks_within,
)
from functions.ids import distinct
from functions.mf import BiasedMF
from service.serving.history import RatedItems
from service.serving.vector import BIAS, EXTRA, SCALE
from service.serving.view import ServingView
from service.store.events import NewEvent

#: A labelled event outside the sample, in the per-event pending ranks.
_UNSAMPLED = -1

#: The ranking columns of a heartbeat row, besides ``ranked_events``.
_FIGURES = ("hit_rate", "ndcg", "static_hit_rate", "static_ndcg")


#: Users whose encoded history a ``CatalogueRanker`` keeps (cleared whole when full).
_ENCODED_USERS = 10_000

_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BatchColumns:
    """A batch's events as columns, and its events grouped by user, taken once.

    Attributes
    ----------
    users, items
        Every event's user and item ``(n,)``, labelled or not.
    ratings
        Every event's rating ``(n,)``, NaN where it has none.
    timestamps
        Every event's timestamp, None where it has none.
    labelled
        Positions of the labelled events, ascending.
    first
        The batch's users in the order of their first event; user ``first[c]`` is
        ``codes == c``.
    codes
        Each event's user as its index in ``first`` ``(n,)``.
    order, starts
        Positions grouped by user, each group in arrival order: user ``c``'s events are
        ``order[starts[c]:starts[c + 1]]``.
    """

    users: Sequence[str]
    items: Sequence[str]
    ratings: np.ndarray
    timestamps: Sequence[float | None]
    labelled: np.ndarray
    first: list[str]
    codes: np.ndarray
    order: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(
        cls,
        stored: Sequence[NewEvent],
        users: Sequence[str] | None = None,
        items: Sequence[str] | None = None,
    ) -> BatchColumns:
        """The columns of ``stored``; ``users`` and ``items``, when the caller has
        taken them already, are used as they are (every event's, in order)."""
        users = [e.user_id for e in stored] if users is None else users
        items = [e.item_id for e in stored] if items is None else items
        if not len(users) == len(items) == len(stored):
            raise ValueError(f"{len(users)} users and {len(items)} items for {len(stored)} events")
        rated = [e.rating for e in stored]
        stamps = [e.timestamp for e in stored]
        if None in rated:
            labelled = np.array([at for at, r in enumerate(rated) if r is not None], np.int64)
        else:  # the usual batch: every event rated
            labelled = np.arange(len(rated))
        ratings = np.array(rated, dtype=np.float64)  # None reads as NaN
        first, codes = distinct(users)
        starts = np.zeros(len(first) + 1, dtype=np.int64)
        np.cumsum(np.bincount(codes, minlength=len(first)), out=starts[1:])
        order = np.argsort(codes, kind="stable")
        return cls(users, items, ratings, stamps, labelled, first, codes, order, starts)

    def first_positions(self, items: dict[str, list[str]]) -> dict[str, list[int]]:
        """Where each user's ``items`` (of the batch) first occur in the batch."""
        code = {user: c for c, user in enumerate(self.first)}
        found: dict[str, list[int]] = {}
        for user, theirs in items.items():
            c = code[user]
            at = self.order[self.starts[c] : self.starts[c + 1]].tolist()[::-1]
            first = dict(zip(map(self.items.__getitem__, at), at, strict=True))
            found[user] = [first[item] for item in theirs]
        return found

    def by_user(self) -> dict[str, list[str]]:
        """Each user's items in arrival order, the users in order of first event."""
        grouped = np.array(self.items, dtype=object)[self.order]
        bounds = self.starts.tolist()
        return {
            user: grouped[bounds[c] : bounds[c + 1]].tolist() for c, user in enumerate(self.first)
        }


@dataclass(frozen=True)
class RankedEvents:
    """The sampled events of one batch and what each leaves out, as item ids.

    Event ``j`` (of ``m``) leaves out the items its user had in the history as the
    batch found it (``before[j]``) and the items of the user's earlier events in the
    batch, labelled or not, as ``/recommend`` counts them: ``batch.items[earlier]``
    where ``earlier_owners == j``.

    Attributes
    ----------
    users, targets
        Each event's user and item ``(m,)``.
    before
        Each event's user's set in the history (shared, never copied).
    returning
        Whether the user had an earlier labelled event in the batch ``(m,)``, which
        the fold-in has learnt by then.
    batch
        The batch the events are from.
    earlier, earlier_owners
        Positions in the batch and the event each belongs to ``(e,)``.
    """

    users: list[str]
    targets: list[str]
    before: list[frozenset[str]]
    returning: np.ndarray
    batch: BatchColumns
    earlier: np.ndarray
    earlier_owners: np.ndarray

    @classmethod
    def of(
        cls, batch: BatchColumns, positions: np.ndarray, snapshot: Map[str, frozenset[str]]
    ) -> RankedEvents:
        """The batch's events at ``positions`` (ascending), vectorised over them: each
        one's earlier events are the head of its user's group in ``batch.order``."""
        n, m = len(batch.users), len(positions)
        rank_in_batch = np.empty(n, dtype=np.int64)
        rank_in_batch[batch.order] = np.arange(n)
        group = batch.starts[batch.codes[positions]]
        ahead = rank_in_batch[positions] - group  # the user's events before each one
        owners = np.repeat(np.arange(m), ahead)
        within = np.arange(len(owners)) - np.repeat(np.cumsum(ahead) - ahead, ahead)
        earlier = batch.order[np.repeat(group, ahead) + within]
        if len(batch.labelled) == n:
            returning = ahead > 0
        else:
            labelled = np.zeros(n, dtype=bool)
            labelled[batch.labelled] = True
            rated = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(labelled[batch.order], out=rated[1:])
            returning = rated[group + ahead] > rated[group]
        users = [batch.users[at] for at in positions.tolist()]
        return cls(
            users=users,
            targets=[batch.items[at] for at in positions.tolist()],
            before=[snapshot.get(user, _EMPTY) for user in users],
            returning=returning,
            batch=batch,
            earlier=earlier,
            earlier_owners=owners,
        )


class CatalogueRanker:
    """Ranks events' items over one version's whole catalogue: ``drift.ranking``'s
    ``ranks_within`` with scores ``mu + b_u + s_u b_i + p_u . q_i``, ranks past
    ``within`` given as ``within + 1`` (hit-rate and NDCG at ``within`` are exact).

    Three costs would dominate and each is paid once per version, or only where it
    matters, rather than per event and item:

    * the item side of the product, [q_i, b_i] (``n_items x k+1``), is laid out once
      and kept; only its bias column is written per batch;
    * an event's count of the items ahead of its own stops once ``within`` are, so most
      events score a few dozen items, not the catalogue;
    * a user's history is encoded into the version's rows once, then extended by the
      items each batch adds to it (``advance``, from what ``RatedItems.add`` reports),
      so a heavy user's thousands of items are not looked up again every batch.
    """

    def __init__(self, within: int = DEFAULT_K) -> None:
        self.within = within
        self._model: BiasedMF | None = None
        #: [q_i, b_i] of every item (``n_items x k+1``); the bias column is the caller's.
        self._items = np.zeros((0, 0))
        self._encoded: dict[str, tuple[frozenset[str], np.ndarray]] = {}
        #: The batch whose items ``_batch_encoded`` holds the rows of (by identity: a
        #: ``BatchColumns`` is made per ``rank`` call).
        self._batch: BatchColumns | None = None
        self._batch_encoded = np.empty(0, dtype=np.int64)

    def ranks(
        self,
        model: BiasedMF,
        user_vectors: np.ndarray,
        placed: np.ndarray,
        events: RankedEvents,
        *,
        global_mean: float,
        item_bias: np.ndarray,
    ) -> np.ndarray:
        """Rank of each event's item ``(m,)`` among the items it does not leave out
        (past ``within``: ``within + 1``).

        Parameters
        ----------
        model
            The version whose items are ranked.
        user_vectors
            Each event's user vector [p_u; b_u; s_u] (``m x k+2``,
            ``service.serving.vector``).
        placed
            Which users the model could place ``(m,)``; the others are ``NOT_RANKED``.
        events
            The events: their items and what each leaves out.
        global_mean, item_bias
            The rest of the score: μ and every item's bias ``(n_items,)``.
        """
        self._use(model)
        # [p_u; s_u] · [q_i; b_i] in one product: the scale weighs the item's bias as
        # another factor.
        self._items[:, -1] = item_bias
        scaled = np.delete(user_vectors, BIAS, axis=1)
        shift = global_mean + user_vectors[:, BIAS]
        targets = model.encode_items(events.targets)
        targets[~placed] = -1
        owners, rows = self._excluded(model, events, targets >= 0)
        return ranks_within(scaled, self._items, shift, targets, owners, rows, self.within)

    def advance(
        self,
        before: Map[str, frozenset[str]],
        after: Map[str, frozenset[str]],
        fresh_at: dict[str, list[int]],
        batch: BatchColumns,
    ) -> None:
        """Carry the encoded histories of the batch's users from the history's
        ``before`` to its ``after`` snapshot: ``fresh_at`` holds, for each user whose
        set only grew, where in ``batch`` the items new to it first occur.
        Their rows are the batch's, encoded once a batch."""
        model, encoded = self._model, self._encoded
        if model is None:
            return
        carried: list[tuple[str, frozenset[str], np.ndarray, int]] = []
        positions: list[int] = []
        for user, cached in [(user, encoded.get(user)) for user in fresh_at]:
            if cached is None:
                continue
            held, now = cached[0], after.get(user)
            if now is None or held is not before.get(user):
                del encoded[user]
                continue
            carried.append((user, now, cached[1], len(fresh_at[user])))
            positions += fresh_at[user]
        if not carried:
            return
        rows = self._batch_rows(model, batch)[positions]
        end = 0
        for user, now, old, count in carried:
            start, end = end, end + count
            new = rows[start:end]
            encoded[user] = (now, np.concatenate([old, new[new >= 0]]))

    def keeps(self, user: str) -> bool:
        """Whether the user's history is kept encoded (``advance`` carries it forward)."""
        return user in self._encoded

    def _batch_rows(self, model: BiasedMF, batch: BatchColumns) -> np.ndarray:
        """The version's row of each of the batch's items, -1 where unknown; encoded once
        a batch, for the exclusions and for the histories carried forward."""
        if self._batch is not batch:
            self._batch, self._batch_encoded = batch, model.encode_items(batch.items)
        return self._batch_encoded

    def _use(self, model: BiasedMF) -> None:
        if model is self._model:
            return
        self._model, self._encoded, self._batch = model, {}, None
        factors = model.item_factors
        self._items = np.empty((factors.shape[0], factors.shape[1] + 1))
        self._items[:, :-1] = factors

    def _excluded(
        self, model: BiasedMF, events: RankedEvents, ranked: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The version's rows each event leaves out, flattened: ``(owners, rows)``. Only
        the ``ranked`` events' (placed, with a known item) matter: the others are not
        ranked whatever they leave out, so their users' histories are not encoded."""
        empty = np.empty(0, dtype=np.int64)
        held = [
            self._history_rows(model, user, before) if take else empty
            for user, before, take in zip(events.users, events.before, ranked, strict=True)
        ]
        wanted = ranked[events.earlier_owners]
        rows = self._batch_rows(model, events.batch)[events.earlier[wanted]]
        known = rows >= 0
        owners = np.repeat(np.arange(len(held)), [len(h) for h in held])
        return (
            np.concatenate([owners, events.earlier_owners[wanted][known]]),
            np.concatenate([*held, rows[known]]),
        )

    def _history_rows(self, model: BiasedMF, user: str, before: frozenset[str]) -> np.ndarray:
        cached = self._encoded.get(user)
        if cached is not None and cached[0] is before:
            return cached[1]
        rows = _encode(model, before)
        if len(self._encoded) >= _ENCODED_USERS:
            self._encoded.clear()
        self._encoded[user] = (before, rows)
        return rows


def _encode(model: BiasedMF, items: Collection[str]) -> np.ndarray:
    rows = model.encode_items(list(items))
    return rows[rows >= 0]


@dataclass(frozen=True)
class PairedRanks:
    """A batch's sampled events ranked by the serving model and by a shadow (the
    rollout guard's comparison): which labelled events (indices into the batch's
    labelled events, ascending) and each one's rank by either ``(m,)``; and the
    batch's users once each (``users``) with each labelled event's index among them
    (``labelled_users``), so the comparison looks each user up once a batch."""

    chosen: np.ndarray
    served: np.ndarray
    shadowed: np.ndarray
    users: list[str]
    labelled_users: np.ndarray


class PrequentialRanking:
    """Ranks each batch's sampled liked events and keeps the figures per heartbeat.

    Parameters
    ----------
    sampler
        Which events are ranked (``RANKING_MIN_RATING``, ``RANKING_SAMPLE``).
    history
        The users' rated items; each batch is added to it once ranked.
    k
        Length of the list judged; a rank past it is kept as ``k + 1`` (every figure
        made from the ranks, the rollout guard's too, judges at most ``k``).
    shadow_share
        Share of the sample a version in shadow is ranked on too, a nested sample of
        the same hash (``SHADOW_RANKING_SHARE``): ranking costs in proportion to the
        catalogue.
    """

    def __init__(
        self,
        sampler: RankingSampler,
        history: RatedItems,
        k: int = DEFAULT_K,
        shadow_share: float = 1.0,
    ) -> None:
        self.sampler = sampler
        self.history = history
        self.shadow_share = shadow_share
        self.tracker = RankingTracker(k)
        self._serving = CatalogueRanker(k)
        self._static = CatalogueRanker(k)
        #: Ranks for a version in shadow (``service.stream.shadow``), beside the serving one.
        self._shadow = CatalogueRanker(k)
        #: Time spent in ``rank`` (sampling, scoring, the history), which the
        #: prequential benchmark reports as the price of ranking on the ingest path.
        self.seconds = 0.0
        #: Per labelled event not yet in a heartbeat: its rank by the serving and by the
        #: static model, or ``_UNSAMPLED``; aligned with the heartbeat aggregator.
        self._pending = np.empty((0, 2), dtype=np.int64)

    def rank(
        self,
        stored: Sequence[NewEvent],
        view: ServingView,
        static: BiasedMF | None,
        vectors: np.ndarray | None = None,
        *,
        users: Sequence[str] | None = None,
        items: Sequence[str] | None = None,
        shadow: tuple[ServingView, np.ndarray] | None = None,
    ) -> PairedRanks | None:
        """Rank the sampled events of ``stored`` (in order), then add it to the history.

        Parameters
        ----------
        stored
            The batch's new events, labelled or not, in arrival order.
        view
            The serving view as the batch found it: its version's items and biases.
        static
            The never-retrained version; None (before a first version) ranks with the
            serving model, as the RMSE's static track predicts with it.
        vectors
            The user vector [p_u; b_u; s_u] each labelled event was predicted with
            (``n_labelled x k+2``, ``ServingModel.predict_then_learn_vectors``), so a
            user's earlier events in the batch count, as they do for the RMSE; None
            scores with the view's vectors.
        users, items
            Every event's user and item, in order, if the caller has them as lists
            already (the learner does): taken as they are rather than read again.
        shadow
            A version in shadow's view as the batch found it and its user vectors
            (as ``view`` and ``vectors``): the same events are ranked by it too, and
            returned beside the serving ranks; None (no shadow) returns None.
        """
        began = time.perf_counter()
        batch = BatchColumns.of(stored, users, items)
        chosen, points = self._sampled(batch)
        snapshot = self.history.snapshot
        pending = np.full((len(batch.labelled), 2), _UNSAMPLED, dtype=np.int64)
        nothing = np.empty(0, dtype=np.int64)
        labelled_users = batch.codes[batch.labelled]
        paired = None
        if shadow is not None:
            paired = PairedRanks(nothing, nothing, nothing, batch.first, labelled_users)
        if chosen.size:
            events = RankedEvents.of(batch, batch.labelled[chosen], snapshot)
            own = None if vectors is None else vectors[chosen]
            served = self._view_ranks(view, events, own)
            frozen = served
            if static is not None:
                frozen = self._static_ranks(static, events)
            self.tracker.record("driftline", served)
            self.tracker.record("static", frozen)
            pending[chosen, 0], pending[chosen, 1] = served, frozen
            if shadow is not None:
                paired = self._shadow_ranks(batch, chosen, points, served, snapshot, shadow)
        self._pending = np.concatenate([self._pending, pending])
        grown = self.history.add_by_user(batch.by_user())
        after = self.history.snapshot
        rankers = (self._serving, self._static, self._shadow)
        # Only the histories a ranker keeps encoded are carried forward: on a stream of
        # many users most of a batch's users have none.
        kept = {user: items for user, items in grown.items() if any(r.keeps(user) for r in rankers)}
        fresh_at = batch.first_positions(kept)
        self._serving.advance(snapshot, after, fresh_at, batch)
        self._static.advance(snapshot, after, fresh_at, batch)
        if shadow is not None:
            self._shadow.advance(snapshot, after, fresh_at, batch)
        self.seconds += time.perf_counter() - began
        return paired

    def _sampled(self, batch: BatchColumns) -> tuple[np.ndarray, np.ndarray]:
        """Which labelled events are ranked (indices into ``batch.labelled``), and each
        one's sample point."""
        sampler = self.sampler
        nowhere = np.empty(0, dtype=np.int64), np.empty(0)
        if not len(batch.labelled) or sampler.fraction <= 0.0:
            return nowhere
        liked = np.flatnonzero(batch.ratings[batch.labelled] >= sampler.min_rating)
        if not liked.size:
            return nowhere
        if sampler.fraction >= 1.0:
            return liked, np.zeros(len(liked))
        # The whole batch's points, then the liked events': its ids are looked up as
        # the batch's columns (each user once, items by code), not as picked lists.
        points = sampler.points(batch.users, batch.items, batch.timestamps)
        points = points[batch.labelled[liked]]
        inside = points < sampler.fraction
        return liked[inside], points[inside]

    def _shadow_ranks(
        self,
        batch: BatchColumns,
        chosen: np.ndarray,
        points: np.ndarray,
        served: np.ndarray,
        snapshot: Map[str, frozenset[str]],
        shadow: tuple[ServingView, np.ndarray],
    ) -> PairedRanks:
        """The shadow's ranks of the sampled events within its share, beside the
        serving model's ranks of the same events."""
        within = points < self.sampler.fraction * self.shadow_share
        if self.shadow_share >= 1.0:
            within[:] = True
        picked = chosen[within]
        labelled_users = batch.codes[batch.labelled]
        if not picked.size:
            nothing = np.empty(0, dtype=np.int64)
            return PairedRanks(picked, nothing, nothing, batch.first, labelled_users)
        events = RankedEvents.of(batch, batch.labelled[picked], snapshot)
        shadowed = self._view_ranks(shadow[0], events, shadow[1][picked], self._shadow)
        return PairedRanks(picked, served[within], shadowed, batch.first, labelled_users)

    def _view_ranks(
        self,
        view: ServingView,
        events: RankedEvents,
        vectors: np.ndarray | None,
        ranker: CatalogueRanker | None = None,
    ) -> np.ndarray:
        """Ranks by the serving model (or a shadow's, with its own ``ranker``); a user
        it had never seen before the event (not in its version, never folded in) is not
        placed, as ``/recommend`` would not."""
        model = view.model
        if model is None:  # nothing ranks yet (``/recommend`` serves what is popular)
            return np.full(len(events.users), NOT_RANKED, dtype=np.int64)
        if vectors is None:
            held = [view.user_vector(user) for user in events.users]
            known = np.array([vector is not None for vector in held], dtype=bool)
            vectors = np.zeros((len(held), model.factors + EXTRA))
            for position, vector in enumerate(held):
                if vector is not None:
                    vectors[position] = vector
        else:  # ``view.user_vector(user) is not None``, without building the vectors
            folded, index = view.user_vectors, model.user_index
            known = np.array([user in folded or user in index for user in events.users], dtype=bool)
        return (ranker or self._serving).ranks(
            model,
            vectors,
            events.returning | known,
            events,
            global_mean=view.global_mean,
            item_bias=view.item_bias,
        )

    def _static_ranks(self, model: BiasedMF, events: RankedEvents) -> np.ndarray:
        """The never-retrained version's ranks, by its own score μ + b_u + b_i + q_i · p_u.

        A user it never saw gets what its predictions give such a user (the RMSE's
        static track): no bias and no factors, so its items rank by μ + b_i.
        """
        rows = model.encode_users(events.users)
        known = rows >= 0
        vectors = np.zeros((len(rows), model.factors + 2))
        vectors[known, : model.factors] = model.user_factors[rows[known]]
        vectors[known, BIAS] = model.user_bias[rows[known]]
        vectors[:, SCALE] = 1.0  # the version's item biases as they are
        return self._static.ranks(
            model,
            vectors,
            np.ones(len(rows), dtype=bool),
            events,
            global_mean=model.global_mean,
            item_bias=model.item_bias,
        )

    def take(self, events: int) -> dict[str, Any]:
        """The heartbeat fields of the next ``events`` labelled events, which leave the
        pending ranks; the figures are None when none of them was ranked."""
        beat, self._pending = self._pending[:events], self._pending[events:]
        ranked = beat[beat[:, 0] != _UNSAMPLED]
        if not len(ranked):
            return {**dict.fromkeys(_FIGURES), "ranked_events": 0}
        k = self.tracker.k
        served, frozen = ranked[:, 0], ranked[:, 1]
        return {
            "hit_rate": float(hits(served, k).mean()),
            "ndcg": float(ndcg(served, k).mean()),
            "static_hit_rate": float(hits(frozen, k).mean()),
            "static_ndcg": float(ndcg(frozen, k).mean()),
            "ranked_events": len(ranked),
        }

    def pending_state(self) -> list[list[int]]:
        """The pending ranks as JSON, saved with the heartbeat aggregator's state."""
        return self._pending.tolist()

    def restore_pending(self, saved: Any, events: int) -> None:
        """Take back saved pending ranks for ``events`` pending labelled events; anything
        that does not fit them counts those events as outside the sample."""
        try:
            pending = np.asarray(saved, dtype=np.int64).reshape(-1, 2)
        except (TypeError, ValueError):
            pending = np.empty((0, 2), dtype=np.int64)
        if len(pending) != events:
            pending = np.full((events, 2), _UNSAMPLED, dtype=np.int64)
        self._pending = pending
