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
from collections.abc import Collection, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

from drift.ranking import (
    DEFAULT_K,
    NOT_RANKED,
    RankingSampler,
    RankingTracker,
    hits,
    ndcg,
    ranks_of,
)
from functions.mf import BiasedMF
from service.serving.history import RatedItems
from service.serving.vector import BIAS, EXTRA
from service.serving.view import ServingView
from service.store.events import NewEvent

#: A labelled event outside the sample, in the per-event pending ranks.
_UNSAMPLED = -1

#: The ranking columns of a heartbeat row, besides ``ranked_events``.
_FIGURES = ("hit_rate", "ndcg", "static_hit_rate", "static_ndcg")


#: Users whose encoded history a ``CatalogueRanker`` keeps (cleared whole when full).
_ENCODED_USERS = 10_000


class RatedBefore(Collection[str]):
    """A user's rated items before an event: the history's set plus the user's earlier
    items of the same batch, without copying the (possibly long) history.

    Parameters
    ----------
    user_id
        Whose items they are.
    before
        The history's items of the user, as the batch found them.
    batch
        The user's items from earlier events of the batch.
    """

    __slots__ = ("user_id", "before", "batch")

    def __init__(self, user_id: str, before: frozenset[str], batch: Sequence[str] = ()) -> None:
        self.user_id = user_id
        self.before = before
        self.batch = frozenset(item for item in batch if item not in before)

    def __contains__(self, item: object) -> bool:
        return item in self.batch or item in self.before

    def __len__(self) -> int:
        return len(self.before) + len(self.batch)

    def __iter__(self) -> Iterator[str]:
        return chain(self.before, self.batch)


class CatalogueRanker:
    """Ranks events' items over one version's whole catalogue: ``drift.ranking.ranks_of``
    with scores ``mu + b_u + b_i + p_u . q_i`` and exclusions given as item ids.

    Two costs dominate and both are paid once per version rather than per event:

    * the scores' product runs through ``np.einsum`` over the item factors, transposed
      once and kept: BLAS ``matmul`` wakes its threads for an ``m x k x n`` product this
      small, which on a busy 2-core machine costs far more than the product;
    * a user's history is encoded into the version's rows incrementally: the history
      hands out a new frozenset when the user rates something, so only the items added
      since the last encoding are looked up (users rate in bursts, and a heavy user has
      rated thousands of items).
    """

    def __init__(self) -> None:
        self._model: BiasedMF | None = None
        self._factors_t = np.zeros((0, 0))
        self._encoded: dict[str, tuple[frozenset[str], np.ndarray]] = {}

    def ranks(
        self,
        model: BiasedMF,
        user_vectors: np.ndarray,
        placed: np.ndarray,
        item_ids: Sequence[str],
        excluded: Sequence[Collection[str]],
        *,
        global_mean: float,
        item_bias: np.ndarray,
    ) -> np.ndarray:
        """Rank of each event's item ``(m,)`` among the items not in its exclusion set.

        Parameters
        ----------
        model
            The version whose items are ranked.
        user_vectors
            Each event's user vector [p_u; b_u; s_u] (``m x k+2``,
            ``service.serving.vector``).
        placed
            Which users the model could place ``(m,)``; the others are ``NOT_RANKED``.
        item_ids
            Each event's item ``(m,)``.
        excluded
            Per event, the item ids the user had rated before it.
        global_mean, item_bias
            The rest of the score: μ and every item's bias ``(n_items,)``.
        """
        if model is not self._model:
            self._model, self._encoded = model, {}
            self._factors_t = np.ascontiguousarray(model.item_factors.T)
        # [p_u; s_u] · [q_i; b_i] in one product: a separate s_u · b_i term would cost
        # a fresh m x n temporary, more than the extra row of the item matrix.
        scaled = np.ascontiguousarray(np.delete(user_vectors, BIAS, axis=1))
        items = np.vstack([self._factors_t, item_bias[None, :]])
        scores = np.einsum("md,dn->mn", scaled, items)
        scores += (global_mean + user_vectors[:, BIAS])[:, None]
        targets = model.encode_items(list(item_ids))
        targets[~placed] = -1
        exclusions = [self._rows(model, rated) for rated in excluded]
        return ranks_of(scores, targets, exclusions, distinct=True)

    def _rows(self, model: BiasedMF, rated: Collection[str]) -> np.ndarray:
        """The version's rows of ``rated``, each once."""
        if not isinstance(rated, RatedBefore):
            return _encode(model, set(rated))
        return np.concatenate([self._history_rows(model, rated), _encode(model, rated.batch)])

    def _history_rows(self, model: BiasedMF, rated: RatedBefore) -> np.ndarray:
        cached = self._encoded.get(rated.user_id)
        if cached is not None and cached[0] is rated.before:
            return cached[1]
        if cached is not None and cached[0] <= rated.before:
            rows = np.concatenate([cached[1], _encode(model, rated.before - cached[0])])
        else:
            rows = _encode(model, rated.before)
        if len(self._encoded) >= _ENCODED_USERS:
            self._encoded.clear()
        self._encoded[rated.user_id] = (rated.before, rows)
        return rows


def _encode(model: BiasedMF, items: Collection[str]) -> np.ndarray:
    rows = model.encode_items(list(items))
    return rows[rows >= 0]


class PrequentialRanking:
    """Ranks each batch's sampled liked events and keeps the figures per heartbeat.

    Parameters
    ----------
    sampler
        Which events are ranked (``RANKING_MIN_RATING``, ``RANKING_SAMPLE``).
    history
        The users' rated items; each batch is added to it once ranked.
    k
        Length of the list judged.
    """

    def __init__(self, sampler: RankingSampler, history: RatedItems, k: int = DEFAULT_K) -> None:
        self.sampler = sampler
        self.history = history
        self.tracker = RankingTracker(k)
        self._serving = CatalogueRanker()
        self._static = CatalogueRanker()
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
    ) -> None:
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
        """
        began = time.perf_counter()
        positions = [at for at, event in enumerate(stored) if event.rating is not None]
        labelled = [stored[at] for at in positions]
        chosen = self._sampled(labelled)
        pending = np.full((len(labelled), 2), _UNSAMPLED, dtype=np.int64)
        if chosen.size:
            excluded, returning = self._rated_before(stored, [positions[j] for j in chosen])
            users = [labelled[j].user_id for j in chosen]
            items = [labelled[j].item_id for j in chosen]
            own = None if vectors is None else vectors[chosen]
            served = self._view_ranks(view, users, items, excluded, returning, own)
            frozen = served
            if static is not None:
                frozen = self._static_ranks(static, users, items, excluded)
            self.tracker.record("driftline", served)
            self.tracker.record("static", frozen)
            pending[chosen, 0], pending[chosen, 1] = served, frozen
        self._pending = np.concatenate([self._pending, pending])
        self.history.add([e.user_id for e in stored], [e.item_id for e in stored])
        self.seconds += time.perf_counter() - began

    def _sampled(self, labelled: Sequence[NewEvent]) -> np.ndarray:
        if not labelled or self.sampler.fraction <= 0.0:
            return np.empty(0, dtype=np.int64)
        mask = self.sampler.mask(
            [e.user_id for e in labelled],
            [e.item_id for e in labelled],
            [e.timestamp for e in labelled],
            [e.rating for e in labelled],
        )
        return np.flatnonzero(mask)

    def _rated_before(
        self, stored: Sequence[NewEvent], ranked: Sequence[int]
    ) -> tuple[list[Collection[str]], np.ndarray]:
        """Per ranked position of ``stored``: the items its user rated before it (the
        history's and the user's earlier events of this batch, labelled or not, as
        ``/recommend`` counts them), and whether the user had an earlier labelled event
        in the batch (which the fold-in has learnt by then)."""
        wanted = set(ranked)
        earlier: dict[str, list[str]] = {stored[at].user_id: [] for at in ranked}
        learnt: set[str] = set()
        snapshot = self.history.snapshot
        excluded: list[Collection[str]] = []
        returning = np.zeros(len(ranked), dtype=bool)
        for at, event in enumerate(stored[: max(ranked) + 1]):
            user = event.user_id
            if at in wanted:
                returning[len(excluded)] = user in learnt
                before = snapshot.get(user, frozenset())
                excluded.append(RatedBefore(user, before, earlier[user]))
            if user in earlier:
                earlier[user].append(event.item_id)
                if event.rating is not None:
                    learnt.add(user)
        return excluded, returning

    def _view_ranks(
        self,
        view: ServingView,
        users: Sequence[str],
        items: Sequence[str],
        excluded: Sequence[Collection[str]],
        returning: np.ndarray,
        vectors: np.ndarray | None,
    ) -> np.ndarray:
        """Ranks by the serving model; a user it had never seen before the event (not in
        its version, never folded in) is not placed, as ``/recommend`` would not."""
        model = view.model
        if model is None:  # nothing ranks yet (``/recommend`` serves what is popular)
            return np.full(len(users), NOT_RANKED, dtype=np.int64)
        held = [view.user_vector(user) for user in users]
        placed = returning | np.array([vector is not None for vector in held], dtype=bool)
        if vectors is None:
            vectors = np.zeros((len(users), model.factors + EXTRA))
            for position, vector in enumerate(held):
                if vector is not None:
                    vectors[position] = vector
        return self._serving.ranks(
            model,
            vectors,
            placed,
            items,
            excluded,
            global_mean=view.global_mean,
            item_bias=view.item_bias,
        )

    def _static_ranks(
        self,
        model: BiasedMF,
        users: Sequence[str],
        items: Sequence[str],
        excluded: Sequence[Collection[str]],
    ) -> np.ndarray:
        rows = model.encode_users(list(users))
        placed = rows >= 0
        if not placed.any():
            return np.full(len(users), NOT_RANKED, dtype=np.int64)
        known = np.where(placed, rows, rows[placed][0])
        scale = np.ones(len(known))  # the version's own score: μ + b_u + b_i + q_i · p_u
        vectors = np.column_stack([model.user_factors[known], model.user_bias[known], scale])
        return self._static.ranks(
            model,
            vectors,
            placed,
            items,
            excluded,
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
