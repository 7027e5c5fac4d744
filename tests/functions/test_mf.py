"""BiasedMF: learning, growth, unknown ids, serialisation and top-K."""

from __future__ import annotations

import numpy as np
import pytest

from functions.mf import BiasedMF, top_k


def low_rank_ratings(
    n_users: int = 120, n_items: int = 80, rank: int = 3, density: float = 0.5, seed: int = 0
) -> tuple[list[str], list[str], np.ndarray]:
    """A noisy rank-`rank` rating matrix with user and item offsets, observed at `density`."""
    rng = np.random.default_rng(seed)
    p = rng.normal(0.0, 0.7, (n_users, rank))
    q = rng.normal(0.0, 0.7, (n_items, rank))
    full = 3.0 + rng.normal(0, 0.4, (n_users, 1)) + rng.normal(0, 0.4, (1, n_items)) + p @ q.T
    users, items = np.nonzero(rng.random((n_users, n_items)) < density)
    ratings = full[users, items] + rng.normal(0.0, 0.1, len(users))
    return [f"u{u}" for u in users], [f"i{i}" for i in items], ratings


def split(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    cut = int(0.8 * n)
    return order[:cut], order[cut:]


def take(values: list[str], rows: np.ndarray) -> list[str]:
    return [values[r] for r in rows]


def test_learns_low_rank_matrix_better_than_global_mean() -> None:
    users, items, ratings = low_rank_ratings()
    train, test = split(len(ratings))
    model = BiasedMF(factors=8, seed=0)
    # ~15 minibatches per epoch: each row needs enough (averaged) steps to leave the
    # plateau that small initial factors start on.
    losses = model.fit(
        take(users, train), take(items, train), ratings[train], epochs=30, batch_size=256
    )

    assert all(later < earlier for earlier, later in zip(losses, losses[1:], strict=False))
    pred = model.predict(take(users, test), take(items, test))
    rmse = np.sqrt(np.mean((pred - ratings[test]) ** 2))
    baseline = np.sqrt(np.mean((ratings[train].mean() - ratings[test]) ** 2))
    assert rmse < 0.4 * baseline


def test_fit_sets_global_mean_only_when_new() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.fit(["a", "b"], ["x", "y"], [4.0, 2.0], epochs=1)
    assert model.global_mean == 3.0
    model.fit(["c"], ["z"], [5.0], epochs=1)
    assert model.global_mean == 3.0


def test_fit_epoch_loss_is_mse_before_update() -> None:
    users, items, ratings = low_rank_ratings(n_users=20, n_items=10)
    model = BiasedMF(factors=4, seed=0)
    model.fit(users, items, ratings, epochs=2)
    u, i = model.encode_users(users), model.encode_items(items)
    before = model.mse_encoded(u, i, ratings)
    # One batch holding every sample: the epoch loss is the error of the model before it.
    assert model.fit_epoch(u, i, ratings, batch_size=len(ratings)) == pytest.approx(before)
    assert model.mse_encoded(u, i, ratings) < before


def test_repeated_rows_in_a_batch_accumulate() -> None:
    model = BiasedMF(factors=2, learning_rate=0.1, regularization=0.0, init_scale=0.0, seed=0)
    model.fit(["a"], ["x"], [3.0], epochs=0)  # mu = 3, one user, one item
    u, i = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    model.fit_epoch(u, i, np.array([4.0, 5.0]), batch_size=2)
    # Both samples count: the step follows their mean error (1.5), not the last one.
    assert model.user_bias[0] == pytest.approx(0.15)
    assert model.item_bias[0] == pytest.approx(0.15)


def test_growth_keeps_existing_predictions() -> None:
    users, items, ratings = low_rank_ratings(n_users=30, n_items=20)
    model = BiasedMF(factors=4, seed=0)
    model.fit(users, items, ratings, epochs=3)
    before = model.predict(users, items)

    for step in range(5):  # several grows, enough to reallocate storage
        new_users = [f"new-user-{step}-{j}" for j in range(40)]
        model.grow(new_users + users[:3], [f"new-item-{step}-{j}" for j in range(25)])

    np.testing.assert_array_equal(model.predict(users, items), before)
    assert model.n_users == 30 + 5 * 40 and model.n_items == 20 + 5 * 25
    assert model.user_factors.shape == (model.n_users, 4)
    assert model.item_bias.shape == (model.n_items,)
    assert model.user_ids[model.user_index["new-user-4-0"]] == "new-user-4-0"


def test_new_rows_have_zero_bias_and_scaled_factors() -> None:
    model = BiasedMF(factors=16, init_scale=0.1, seed=0)
    model.grow([f"u{j}" for j in range(500)], ["x"])
    assert not model.user_bias.any()
    assert model.user_factors.std() == pytest.approx(0.1, rel=0.1)


def test_unknown_ids_contribute_nothing() -> None:
    model = BiasedMF(factors=4, seed=0)
    model.fit(["a", "a", "b"], ["x", "y", "x"], [5.0, 1.0, 4.0], epochs=5)
    mu = model.global_mean
    a, x = model.user_index["a"], model.item_index["x"]

    pred = model.predict(["zz", "a", "zz"], ["x", "qq", "qq"])
    np.testing.assert_allclose(
        pred, [mu + model.item_bias[x], mu + model.user_bias[a], mu], rtol=0, atol=1e-12
    )
    assert model.encode_users(["a", "zz"]).tolist() == [a, -1]
    assert BiasedMF().predict(["a"], ["b"]).tolist() == [0.0]  # empty model: mu = 0


def test_predict_clips_to_rating_scale() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.fit(["a", "b"], ["x", "y"], [5.0, 5.0], epochs=1)
    model.user_bias[:] = 10.0
    assert model.predict(["a"], ["x"], clip=(0.5, 5.0)).tolist() == [5.0]
    with pytest.raises(ValueError, match="clip"):
        model.predict(["a"], ["x"], clip=(5.0, 0.5))


def test_item_scores_match_predict() -> None:
    users, items, ratings = low_rank_ratings(n_users=15, n_items=12)
    model = BiasedMF(factors=4, seed=0)
    model.fit(users, items, ratings, epochs=3)
    row = model.user_index[users[0]]
    scores = model.item_scores(model.user_factors[row], float(model.user_bias[row]))
    expected = model.predict([users[0]] * model.n_items, model.item_ids)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="user_vector"):
        model.item_scores(np.zeros(3), 0.0)


def test_copy_is_independent() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.fit(["a"], ["x"], [4.0], epochs=1)
    twin = model.copy()
    twin.fit(["a", "b"], ["x", "y"], [1.0, 1.0], epochs=3)
    assert model.n_users == 1 and twin.n_users == 2
    assert model.predict(["a"], ["x"]) != twin.predict(["a"], ["x"])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"factors": 0}, "factors"),
        ({"factors": 2.5}, "factors"),
        ({"factors": True}, "factors"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"regularization": -0.1}, "regularization"),
        ({"init_scale": float("inf")}, "init_scale"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_invalid_parameters_are_named(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        BiasedMF(**kwargs)  # type: ignore[arg-type]


def test_invalid_training_input_is_rejected() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.fit(["a"], ["x"], [4.0], epochs=0)
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="u holds rows"):
        model.fit_epoch(np.array([-1]), one, np.ones(1))
    with pytest.raises(ValueError, match="i holds rows"):
        model.fit_epoch(one, np.array([1]), np.ones(1))
    with pytest.raises(ValueError, match="same length"):
        model.fit_epoch(one, one, np.ones(2))
    with pytest.raises(ValueError, match="batch_size"):
        model.fit_epoch(one, one, np.ones(1), batch_size=0)
    with pytest.raises(ValueError, match="finite"):
        model.fit(["a"], ["x"], [float("nan")])
    with pytest.raises(ValueError, match="same length"):
        model.fit(["a", "b"], ["x"], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least one"):
        model.fit([], [], [])


def test_from_arrays_rejects_inconsistent_state() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.fit(["a", "b"], ["x", "x"], [4.0, 3.0], epochs=1)
    arrays = model.to_arrays()
    with pytest.raises(ValueError, match="user arrays disagree"):
        BiasedMF.from_arrays({**arrays, "user_bias": np.zeros(3)})
    with pytest.raises(ValueError, match="lack"):
        BiasedMF.from_arrays({k: v for k, v in arrays.items() if k != "item_ids"})
    with pytest.raises(ValueError, match="duplicate"):
        BiasedMF.from_arrays({**arrays, "user_ids": np.array(["a", "a"])})
    with pytest.raises(ValueError, match="format_version"):
        BiasedMF.from_arrays({**arrays, "format_version": np.array(99)})


def test_to_arrays_uses_plain_dtypes() -> None:
    model = BiasedMF(factors=2, seed=None)
    model.fit(["user-1", "ü"], ["x", "x"], [4.0, 3.0], epochs=1)
    arrays = model.to_arrays()
    assert arrays["user_ids"].dtype.kind == "U" and arrays["item_ids"].dtype.kind == "U"
    assert all(not a.dtype.hasobject for a in arrays.values())
    assert arrays["factors"].shape == () and int(arrays["seed"]) == -1
    assert BiasedMF.from_arrays(arrays).seed is None
    empty = BiasedMF().to_arrays()
    assert empty["user_ids"].dtype.kind == "U" and empty["user_factors"].shape == (0, 32)
    assert BiasedMF.from_arrays(empty).n_users == 0


def test_top_k_orders_descending_and_excludes() -> None:
    scores = np.array([0.3, 0.9, 0.1, 0.9, 0.5, 0.7])
    rows, best = top_k(scores, 3)
    assert rows.tolist() == [1, 3, 5] and best.tolist() == [0.9, 0.9, 0.7]

    rows, best = top_k(scores, 3, exclude=np.array([1, 5, 5]))
    assert rows.tolist() == [3, 4, 0] and best.tolist() == [0.9, 0.5, 0.3]

    assert top_k(scores, 10, exclude=np.array([0, 1])).__getitem__(0).tolist() == [3, 5, 4, 2]
    assert top_k(scores, 0)[0].size == 0
    assert top_k(np.zeros(0), 5)[0].size == 0


def test_top_k_breaks_ties_by_lower_index() -> None:
    scores = np.zeros(1000)
    scores[[7, 500, 900]] = 1.0
    assert top_k(scores, 5)[0].tolist() == [7, 500, 900, 0, 1]


def test_top_k_matches_full_sort() -> None:
    scores = np.random.default_rng(3).normal(size=2000)
    exclude = np.arange(0, 2000, 7)
    rows, best = top_k(scores, 25, exclude=exclude)
    masked = scores.copy()
    masked[exclude] = -np.inf
    np.testing.assert_array_equal(rows, np.argsort(-masked, kind="stable")[:25])
    np.testing.assert_array_equal(best, scores[rows])


def test_items_are_damped_by_their_support_in_the_window() -> None:
    model = BiasedMF(factors=2, seed=0)
    model.grow(["u"], ["rare", "common", "absent"])
    model.item_bias[:] = [1.5, 1.5, 1.5]
    model.item_factors[:] = 1.0
    window = ["rare"] + ["common"] * 60
    model.damp_items(window, support=20.0)
    rare, common, absent = model.item_bias
    assert rare == pytest.approx(1.5 * 1 / 21)
    assert common == pytest.approx(1.5 * 60 / 80)
    assert absent == 1.5  # not in the window: what earlier versions learnt stays
    assert model.item_factors[:, 0].tolist() == pytest.approx([1 / 21, 60 / 80, 1.0])
    model.damp_items(window, support=0.0)
    assert model.item_bias[0] == pytest.approx(1.5 / 21)
    with pytest.raises(ValueError, match="support"):
        model.damp_items(window, support=-1.0)
