"""The ANN item index and the serving view that reads it.

The index is approximate by design; what must hold exactly is everything around it: the
view leaves out rated items, scores candidates with the current biases, and never
misses an item whose online bias rose after the index was built.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.bench.catalogue import synthetic_version
from service.serving.index import (
    QUANTIZED_MIN_ITEMS,
    RERANKED_QUANTIZED,
    IndexOptions,
    ItemIndex,
    IvfIndex,
    build_index,
)
from service.serving.model import ServingModel
from service.serving.vector import BIAS, SCALE, item_scores


class StaleExactIndex(ItemIndex):
    """A perfect index over the biases it was built with: whatever it misses, it misses
    because the biases moved since, which is what ``risen`` must make up for."""

    name = "stale-exact"

    def __init__(self, item_factors: np.ndarray, item_bias: np.ndarray) -> None:
        super().__init__(item_factors, item_bias)
        self.item_factors = item_factors

    def candidates(self, vector: np.ndarray, n: int) -> np.ndarray:
        scores = self.item_factors @ vector[:BIAS] + vector[SCALE] * self.indexed_bias
        return np.argsort(-scores, kind="stable")[:n]


def _serving(items: int = 3000, users: int = 200, factors: int = 8) -> ServingModel:
    model = synthetic_version(items, users, factors, seed=3)
    return ServingModel(model, "v1")


@pytest.mark.parametrize("codes", ["flat", "pq4"])
def test_the_ivf_index_finds_the_exact_top_10_on_a_clustered_catalogue(codes: str) -> None:
    """Its candidates, scored exactly as the serving view scores them, hold the exact
    top-10; 4-bit codes return more candidates for that than floats need."""
    model = synthetic_version(20_000, 300, 16, seed=1)
    bias = np.random.default_rng(0).normal(0.0, 0.3, model.n_items)
    index = IvfIndex(model.item_factors, bias, IndexOptions("ann", probes=32, codes=codes))
    recalls = []
    for user in range(300):
        vector = np.append(model.user_factors[user], [0.0, 1.0])  # [p_u; b_u; s_u]
        scores = model.item_factors @ vector[:BIAS] + bias
        exact = np.argsort(-scores)[:10]
        found = index.candidates(vector, 10)
        best = found[np.argsort(-scores[found], kind="stable")[:10]]
        recalls.append(len(set(best) & set(exact)) / 10)
    assert np.mean(recalls) >= 0.95
    assert index.lists == round(np.sqrt(model.n_items))
    assert index.codes == codes
    assert len(found) == (10 if codes == "flat" else RERANKED_QUANTIZED)


def test_a_small_catalogue_keeps_flat_lists_whatever_the_codes_asked() -> None:
    model = synthetic_version(QUANTIZED_MIN_ITEMS - 1, 50, 8, seed=2)
    index = IvfIndex(model.item_factors, model.item_bias, IndexOptions("ann", codes="pq4"))
    assert index.codes == "flat" and index.reranked == 0


def test_unknown_codes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown codes"):
        IndexOptions("ann", codes="pq9")


def test_an_exhaustive_index_answers_exactly_what_scoring_every_item_does() -> None:
    serving = _serving()
    model = serving.model
    assert model is not None
    users = [f"u{i}" for i in range(0, 200, 7)]
    rated = {
        user: frozenset(model.item_ids[j] for j in range(i, 3000, 97))
        for i, user in enumerate(users)
    }
    exact = {user: serving.recommend(user, 10, rated[user]) for user in users}
    # As many probes as lists: the index scans everything, so only the view's own work
    # (exclusion, rescoring, ties) can make a difference.
    serving.attach_index(
        IvfIndex(model.item_factors, serving.view.item_bias, IndexOptions("ann", probes=10_000))
    )
    for user in users:
        assert serving.recommend(user, 10, rated[user]) == exact[user]
        assert not set(item for item, _ in exact[user] or []) & rated[user]


def test_an_item_whose_bias_rose_after_indexing_is_recommended_as_exact_scoring_would() -> None:
    serving = _serving()
    model = serving.model
    assert model is not None
    serving.attach_index(StaleExactIndex(model.item_factors, serving.view.item_bias))
    vector = serving.view.user_vector("u1")
    assert vector is not None
    # The item this user ranks 60th, pushed up by many users rating it 5: a perfect
    # index over the old biases never offers it among the candidates asked for.
    order = np.argsort(-(model.item_factors @ vector[:BIAS]), kind="stable")
    pushed = model.item_ids[int(order[59])]
    assert int(order[59]) not in serving.view.index.candidates(vector, 20).tolist()
    raters = [f"u{i}" for i in range(2, 200)]
    serving.learn(raters, [pushed] * len(raters), np.full(len(raters), 5.0))
    assert model.item_index[pushed] in serving.view.risen.tolist()
    with_index = serving.recommend("u1", 10)
    assert with_index is not None and pushed in [item for item, _ in with_index]
    serving.attach_index(None)
    assert with_index == serving.recommend("u1", 10)


def test_with_thousands_of_moved_items_only_those_that_could_win_are_scored() -> None:
    model = synthetic_version(3000, 200, 8, seed=3)
    # Ranking shrinks online biases as the service does (RANKING_ITEM_BIAS_REGULARIZATION).
    serving = ServingModel(model, "v1", ranking_item_bias_regularization=150.0)
    serving.attach_index(StaleExactIndex(model.item_factors, serving.view.item_bias))
    rng = np.random.default_rng(4)
    # Events on most of the catalogue: thousands of items move a little either way.
    items = [model.item_ids[j] for j in rng.integers(0, 3000, 20_000)]
    users = [f"u{j}" for j in rng.integers(0, 200, 20_000)]
    serving.learn(users, items, rng.choice([2.0, 3.0, 4.0, 5.0], 20_000))
    # The items u0 is offered 21st to 30th, just outside the 20 candidates it gets,
    # each rated 5 a thousand times.
    vector = serving.view.user_vector("u0")
    index = serving.view.index
    assert vector is not None and index is not None
    pushed = [model.item_ids[j] for j in index.candidates(vector, 30)[20:]]
    assert serving.recommend("u0", 10)  # this view's moves are gathered; the next view's not
    raters = [f"new{i % 200}" for i in range(10_000)]  # u0's own vector stays put
    serving.learn(raters, pushed * 1000, np.full(10_000, 5.0))
    view = serving.view
    assert len(view.risen) > 1000
    for user in [f"u{i}" for i in range(0, 200, 9)]:
        vector = view.user_vector(user)  # u0 first
        assert vector is not None
        pool = np.sort(index.candidates(vector, 20))
        scores = item_scores(
            model.item_factors[pool], view.item_bias[pool], view.global_mean, vector
        )
        assert len(view._contenders(vector, pool, scores, 10)) < len(view.risen) / 10
        with_index = view.recommend(user, 10)
        exact = replace(view, index=None).recommend(user, 10)
        assert with_index == exact


def test_a_bias_that_falls_back_leaves_the_risen_items() -> None:
    serving = _serving()
    model = serving.model
    assert model is not None
    serving.attach_index(StaleExactIndex(model.item_factors, serving.view.item_bias))
    item = model.item_ids[5]
    serving.learn(["u1", "u2"], [item, item], np.array([5.0, 5.0]))
    assert 5 in serving.view.risen.tolist()
    serving.learn([f"u{i}" for i in range(3, 60)], [item] * 57, np.full(57, 0.5))
    assert 5 not in serving.view.risen.tolist()


@pytest.mark.parametrize(
    ("kind", "items", "expected"),
    [
        ("exact", 10**6, None),
        ("auto", 100, None),
        ("auto", 2000, IvfIndex),
        ("ann", 100, IvfIndex),
    ],
)
def test_serving_index_chooses_by_setting_and_catalogue_size(
    kind: str, items: int, expected: type | None
) -> None:
    rng = np.random.default_rng(0)
    factors, bias = rng.normal(size=(items, 4)), np.zeros(items)
    options = IndexOptions(kind, min_items=1000)
    if kind == "exact":  # no build at all: only the choice is checked
        assert options.resolve(items) == "exact"
        return
    index = build_index(factors, bias, options)
    assert (index is None) if expected is None else isinstance(index, expected)


def test_an_unknown_index_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown index"):
        IndexOptions("hnsw")


def test_a_view_without_a_version_has_nothing_to_index() -> None:
    serving = ServingModel(None, None)
    serving.attach_index(None)
    assert serving.recommend("anyone", 5) is None


def test_an_item_whose_bias_fell_is_offered_to_a_user_who_scales_biases_down() -> None:
    """A user with a negative scale on item biases gains from an item's fall: the view
    scores the fallen items beside the index's candidates for such a user, as exact
    scoring would rank them."""
    serving = _serving()
    model = serving.model
    assert model is not None
    items = model.item_ids
    crowd = [f"u{i}" for i in range(2, 200)]
    # The crowd's taste first, so the online biases (and the index) have something to
    # turn against; then u1 rates against it until its scale is negative.
    for k in range(0, 40, 2):
        serving.learn(crowd, [items[k]] * len(crowd), np.full(len(crowd), 5.0))
        serving.learn(crowd, [items[k + 1]] * len(crowd), np.full(len(crowd), 0.5))
    serving.learn(["u1"] * 40, list(items[:40]), np.array([0.5, 5.0] * 20))
    vector = serving.view.user_vector("u1")
    assert vector is not None and vector[SCALE] < 0
    serving.attach_index(StaleExactIndex(model.item_factors, serving.view.item_bias))
    rated = frozenset(items[:40])
    exact_order = np.argsort(
        -(model.item_factors @ vector[:BIAS] + vector[SCALE] * serving.view.item_bias),
        kind="stable",
    )
    pushed = next(items[int(row)] for row in exact_order[29:] if items[int(row)] not in rated)
    serving.learn(crowd, [pushed] * len(crowd), np.full(len(crowd), 0.5))
    assert model.item_index[pushed] in serving.view.fallen.tolist()
    with_index = serving.recommend("u1", 10, rated)
    assert with_index is not None and pushed in [item for item, _ in with_index]
    serving.attach_index(None)
    assert with_index == serving.recommend("u1", 10, rated)


def test_a_wide_catalogue_is_searched_in_fewer_dimensions_and_rescored_to_the_same_top_10() -> None:
    """64 factors whose variance decays, as trained factors' does: the index searches the
    leading components only, and the view's exact rescoring keeps recall@10."""
    serving = ServingModel(synthetic_version(30_000, 300, 64, seed=4), "v1")
    model = serving.model
    assert model is not None
    users = [f"u{i}" for i in range(300)]
    exact = {user: serving.recommend(user, 10) for user in users}
    reduced = IvfIndex(model.item_factors, serving.view.item_bias, IndexOptions("ann"))
    whole = IvfIndex(
        model.item_factors, serving.view.item_bias, IndexOptions("ann", kept_variance=1.0)
    )
    assert reduced.dimensions < whole.dimensions == 66
    serving.attach_index(reduced)
    recalls = [
        len({i for i, _ in serving.recommend(u, 10) or []} & {i for i, _ in exact[u] or []}) / 10
        for u in users
    ]
    assert np.mean(recalls) >= 0.95


@pytest.mark.parametrize("items", [1, 5, 100])
def test_a_tiny_wide_catalogue_is_searched_whole(items: int) -> None:
    """Too few items to estimate principal components from: every dimension is kept."""
    rng = np.random.default_rng(items)
    factors, bias = rng.normal(size=(items, 64)), rng.normal(size=items)
    index = IvfIndex(factors, bias, IndexOptions("ann"))
    user = np.append(rng.normal(size=64), [0.0, 1.0])
    exact = np.argsort(-(factors @ user[:BIAS] + bias), kind="stable")[: min(10, items)]
    assert index.dimensions == 66
    assert set(index.candidates(user, 10)) == set(exact)


def test_many_requests_answered_together_get_what_each_gets_alone() -> None:
    """One search for a batch of users (``recommend_many``): cached answers, users the
    version cannot place, a user whose rated items want more candidates than the
    others, and items risen since indexing all come out as ``recommend`` alone gives."""
    serving = ServingModel(synthetic_version(20_000, 300, 16, seed=5), "v1", cached_answers=100)
    model = serving.model
    assert model is not None
    serving.attach_index(IvfIndex(model.item_factors, serving.view.item_bias, IndexOptions("ann")))
    assert serving.view.index is not None and serving.view.index.codes == "pq4"
    serving.learn([f"u{i}" for i in range(40)], list(model.item_ids[:40]), np.full(40, 5.0))
    many_rated = frozenset(model.item_ids[100:500])
    asked = [(f"u{i}", 10, frozenset(model.item_ids[i : i + 3])) for i in range(60)]
    asked += [("stranger", 10, frozenset()), ("u7", 25, many_rated), ("u8", 5, frozenset())]
    view = serving.view
    alone = [view.recommend(user, k, rated) for user, k, rated in asked]
    assert alone[60] is None and all(answer for answer in alone[:60])
    fresh = replace(view, answers=view.answers.emptied())
    assert fresh.recommend_many(asked) == alone
    assert view.recommend_many(asked) == alone  # now from the kept answers
    assert not {item for item, _ in alone[61] or []} & many_rated
