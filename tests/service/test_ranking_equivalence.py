"""The batched ranking sample and rated-items history give what one event at a time gives.

``PrequentialRanking.rank`` groups a batch by user, takes each sampled event's exclusions
as rows in one array, carries users' encoded histories from batch to batch and ranks in
one compiled pass; ``RatedItems.add_by_user`` reports what each user gained. These tests
replay seeded streams (skewed users and items, repeated pairs, unlabelled events, items
and users the models do not know, a history bound small enough to evict and to cut, a
version swap) through them and through the per-event logic written out below, and ask
for the same sampled events, the same ranks and the same rated items.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from immutables import Map

from drift.ranking import NOT_RANKED, RankingSampler
from functions.mf import BiasedMF
from service.serving.history import RatedItems
from service.serving.view import ServingView
from service.store.events import NewEvent
from service.stream.ranking import PrequentialRanking
from tests.support.ranking_reference import reference_rank

_EMPTY: frozenset[str] = frozenset()


class _ReferenceHistory:
    """``RatedItems`` as it was first written: each user's batch items unioned in."""

    def __init__(self, max_pairs: int | None) -> None:
        self.max_pairs = max_pairs
        self.recency: OrderedDict[str, None] = OrderedDict()
        self.sets: dict[str, frozenset[str]] = {}
        self.pairs = 0

    def add(self, users: Sequence[str], items: Sequence[str]) -> None:
        batch: dict[str, list[str]] = {}
        for user, item in zip(users, items, strict=True):
            batch.setdefault(user, []).append(item)
        for user, theirs in batch.items():
            old = self.sets.get(user, _EMPTY)
            new = old.union(theirs)
            if self.max_pairs is not None and len(new) > self.max_pairs:
                kept = list(dict.fromkeys(reversed(theirs)))[: self.max_pairs]
                room, chosen = self.max_pairs - len(kept), set(kept)
                fill = [item for item in old if item not in chosen][:room] if room > 0 else []
                new = frozenset(kept + fill)
            if len(new) != len(old):
                self.sets[user] = new
                self.pairs += len(new) - len(old)
            self.recency[user] = None
            self.recency.move_to_end(user)
        while self.max_pairs is not None and self.pairs > self.max_pairs and len(self.recency) > 1:
            user, _ = self.recency.popitem(last=False)
            self.pairs -= len(self.sets.pop(user, _EMPTY))


def _reference_rank(
    model: BiasedMF,
    vector: np.ndarray,
    global_mean: float,
    item_bias: np.ndarray,
    item: str,
    excluded: set[str],
) -> int:
    """One event: every item scored with [p_u; b_u; s_u] as ``np.einsum`` sums it, then
    counted against the target among the items not left out."""
    target = model.item_index.get(item, -1)
    if target < 0 or item in excluded:
        return NOT_RANKED
    items = np.vstack([model.item_factors.T, item_bias[None, :]])
    scaled = np.delete(vector, -2)[None, :]
    scores = np.einsum("md,dn->mn", scaled, items)[0] + (global_mean + vector[-2])
    rows_out = {model.item_index[i] for i in excluded if i in model.item_index}
    return reference_rank(scores, target, rows_out)


def _reference_batch(
    history: _ReferenceHistory,
    sampler: RankingSampler,
    stored: Sequence[NewEvent],
    view: ServingView,
    static: BiasedMF | None,
    vectors: np.ndarray,
) -> list[tuple[int, int]]:
    """Per labelled event: (serving rank, static rank), or (-1, -1) outside the sample."""
    pending: list[tuple[int, int]] = []
    earlier: dict[str, list[str]] = {}
    learnt: set[str] = set()
    labelled = 0
    for event in stored:
        user, item = event.user_id, event.item_id
        if event.rating is not None:
            if sampler.includes(user, item, event.timestamp, event.rating):
                excluded = set(history.sets.get(user, _EMPTY)) | set(earlier.get(user, []))
                served = NOT_RANKED
                model = view.model
                placed = user in learnt or view.user_vector(user) is not None
                if model is not None and placed:
                    served = _reference_rank(
                        model, vectors[labelled], view.global_mean, view.item_bias, item, excluded
                    )
                frozen = served
                if static is not None:  # a user it never saw: no bias, no factors
                    row = static.user_index.get(user)
                    own = np.zeros(static.factors + 2)
                    own[-1] = 1.0
                    if row is not None:
                        own[:-2], own[-2] = static.user_factors[row], static.user_bias[row]
                    frozen = _reference_rank(
                        static, own, static.global_mean, static.item_bias, item, excluded
                    )
                pending.append((served, frozen))
            else:
                pending.append((-1, -1))
            labelled += 1
            learnt.add(user)
        earlier.setdefault(user, []).append(item)
    history.add([e.user_id for e in stored], [e.item_id for e in stored])
    return pending


def _model(seed: int, users: int, items: int, ties: bool, factors: int = 3) -> BiasedMF:
    rng = np.random.default_rng(seed)
    model = BiasedMF(factors=factors, seed=seed)
    model.grow([f"u{k}" for k in range(users)], [f"i{k}" for k in range(items)])
    if ties:  # small integers: exact scores, so many exact ties
        model.item_factors[:] = rng.integers(-1, 2, model.item_factors.shape)
        model.item_bias[:] = rng.integers(0, 2, model.n_items) * 0.5
    else:
        model.item_factors[:] = rng.normal(size=model.item_factors.shape)
        model.item_bias[:] = rng.normal(size=model.n_items)
    model.user_factors[:] = rng.normal(size=model.user_factors.shape)
    model.user_bias[:] = rng.normal(size=model.n_users)
    model.global_mean = 3.5
    return model


def _stream(seed: int, n: int) -> list[NewEvent]:
    """Zipf users and items (repeated pairs), a tenth unlabelled, some without a time."""
    rng = np.random.default_rng(seed)
    users = rng.zipf(1.3, n) % 60
    items = rng.zipf(1.15, n) % 500
    ratings = rng.integers(2, 11, n) / 2
    return [
        NewEvent(
            f"u{users[k]}",
            f"i{items[k]}",
            None if k % 10 == 3 else float(ratings[k]),
            None if k % 17 == 5 else float(1_000 + k // 2),
        )
        for k in range(n)
    ]


def _batches(n: int, seed: int) -> Iterator[slice]:
    rng = np.random.default_rng(seed)
    start = 0
    while start < n:
        stop = min(n, start + int(rng.choice([1, 2, 7, 40, 150, 500])))
        yield slice(start, stop)
        start = stop


@pytest.mark.parametrize(
    ("seed", "ties", "max_pairs", "k"),
    [
        (0, False, None, 10),
        (1, True, None, 1_000),
        (2, False, 300, 1_000),
        (3, True, 120, 10),
        (4, False, 40, 3),
    ],
)
def test_the_batched_sample_ranks_as_one_event_at_a_time(
    seed: int, ties: bool, max_pairs: int | None, k: int
) -> None:
    """With ``k`` past the catalogue every rank is whole; below it, ranks past ``k``
    are kept as ``k + 1``."""
    n = 4_000
    stream = _stream(seed, n)
    # The versions know some of the users and 400 of the 500 items; the second one,
    # swapped in half way, ranks with other factors.
    first, second = _model(seed, 40, 400, ties), _model(seed + 100, 50, 420, ties)
    static = _model(seed + 200, 25, 400, ties)
    sampler = RankingSampler(fraction=0.4)
    ranking = PrequentialRanking(sampler, RatedItems(max_pairs), k=k)
    reference = _ReferenceHistory(max_pairs)
    rng = np.random.default_rng(seed + 300)
    folded = Map({"u55": rng.normal(size=5), "u3": rng.normal(size=5)})
    for number, part in enumerate(_batches(n, seed)):
        stored = stream[part]
        model = first if part.start < n // 2 else second
        view = ServingView(model, "v", 3.4, rng.normal(size=model.n_items), folded)
        labelled = sum(e.rating is not None for e in stored)
        vectors = rng.normal(size=(labelled, model.factors + 2))
        vectors[:, -1] = rng.choice([1.0, 0.5, 2.0], labelled)
        expected = [
            (min(served, k + 1), min(frozen, k + 1))
            for served, frozen in _reference_batch(
                reference, sampler, stored, view, static, vectors
            )
        ]
        if number % 2:  # the learner hands over the columns it has taken already
            users, items = [e.user_id for e in stored], [e.item_id for e in stored]
            ranking.rank(stored, view, static, vectors, users=users, items=items)
        else:
            ranking.rank(stored, view, static, vectors)
        assert [tuple(row) for row in ranking.pending_state()] == expected, f"batch {number}"
        ranking.restore_pending([], 0)
        assert dict(ranking.history.snapshot) == reference.sets, f"batch {number}"
        assert ranking.history.users() == list(reference.recency)
        assert ranking.history.pairs == reference.pairs
    assert ranking.tracker.count("driftline") > 300


def test_without_vectors_or_a_static_version_the_views_own_vectors_rank() -> None:
    stream = _stream(9, 1_500)
    model = _model(9, 40, 400, ties=False)
    sampler = RankingSampler(fraction=0.5)
    ranking = PrequentialRanking(sampler, RatedItems(), k=model.n_items)  # whole ranks
    reference = _ReferenceHistory(None)
    view = ServingView(model, "v", 3.4, model.item_bias.copy(), Map())
    for part in _batches(len(stream), 9):
        stored = stream[part]
        vectors = np.array(
            [
                view.user_vector(e.user_id)
                if view.user_vector(e.user_id) is not None
                else np.zeros(model.factors + 2)
                for e in stored
                if e.rating is not None
            ]
        ).reshape(-1, model.factors + 2)
        expected = _reference_batch(reference, sampler, stored, view, None, vectors)
        ranking.rank(stored, view, None)
        assert [tuple(row) for row in ranking.pending_state()] == expected
        ranking.restore_pending([], 0)


@pytest.mark.parametrize("max_pairs", [None, 1, 5, 60])
def test_rated_items_hold_what_the_per_event_history_holds(max_pairs: int | None) -> None:
    stream = _stream(20 + (max_pairs or 0), 3_000)
    history, reference = RatedItems(max_pairs), _ReferenceHistory(max_pairs)
    for part in _batches(len(stream), 5):
        users = [e.user_id for e in stream[part]]
        items = [e.item_id for e in stream[part]]
        before = history.snapshot
        grouped: dict[str, list[str]] = {}
        for user, item in zip(users, items, strict=True):
            grouped.setdefault(user, []).append(item)
        grown = history.add_by_user(grouped)
        reference.add(users, items)
        assert dict(history.snapshot) == reference.sets
        assert history.users() == list(reference.recency) and history.pairs == reference.pairs
        for user, fresh in grown.items():  # what it reports is exactly what was added
            assert history.items(user) == before.get(user, _EMPTY) | set(fresh)
            assert len(fresh) == len(set(fresh)) and not set(fresh) & before.get(user, _EMPTY)
