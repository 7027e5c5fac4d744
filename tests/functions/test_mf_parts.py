"""The model's collaborators on their own: id tables, the SGD step and the array form."""

from __future__ import annotations

import numpy as np
import pytest

from functions.mf import BiasedMF
from functions.mf_arrays import read_params, read_side, write_arrays
from functions.mf_rows import IdRows
from functions.mf_sgd import Tables, sgd_epoch, sgd_step


def test_id_rows_grow_past_their_capacity_and_keep_rows() -> None:
    rows = IdRows(factors=2)
    rows.append(["a", "b"], np.ones((2, 2)))
    rows.bias[:] = [0.5, -0.5]
    new = rows.new_ids([f"x{n}" for n in range(40)] + ["a", "x0"])
    assert new == [f"x{n}" for n in range(40)]
    rows.append(new, np.zeros((40, 2)))
    assert rows.size == 42 and rows.bias[:2].tolist() == [0.5, -0.5]
    assert rows.factors[:2].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert rows.encode(["b", "nope", "x39"]).tolist() == [1, -1, 41]


def test_a_step_moves_each_side_from_the_same_values() -> None:
    ub, ib = np.zeros(1), np.zeros(1)
    pu, qi = np.full((1, 1), 0.5), np.full((1, 1), 0.5)
    tables = Tables(ub, ib, pu, qi)
    sse = sgd_step(np.array([0]), np.array([0]), np.array([3.25]), tables, 2.0, 0.1, 0.0)
    assert sse == pytest.approx(1.0)  # error 3.25 - (2 + 0.25) = 1
    assert pu[0, 0] == qi[0, 0] == pytest.approx(0.55)  # both from 0.5, not one from 0.55
    assert ub[0] == ib[0] == pytest.approx(0.1)


def test_an_epoch_is_the_model_fit_epoch() -> None:
    model = BiasedMF(factors=3, seed=4)
    model.fit(["a", "b", "a"], ["x", "x", "y"], [4.0, 2.0, 5.0], epochs=0)
    twin = model.copy()
    u, i, r = np.array([0, 1, 0]), np.array([0, 0, 1]), np.array([4.0, 2.0, 5.0])
    loss = model.fit_epoch(u, i, r, batch_size=2, rng=np.random.default_rng(1))
    order = np.random.default_rng(1).permutation(3)
    tables = Tables(twin.user_bias, twin.item_bias, twin.user_factors, twin.item_factors)
    assert sgd_epoch(u, i, r, order, 2, tables, twin.global_mean, 0.05, 0.02) == loss
    np.testing.assert_array_equal(twin.user_factors, model.user_factors)


def test_arrays_round_trip_params_and_rows() -> None:
    model = BiasedMF(factors=2, seed=None)
    model.fit(["a", "b"], ["x", "y"], [1.0, 2.0], epochs=1)
    arrays = write_arrays(model.get_params(), model.global_mean, model._users, model._items)
    assert arrays["seed"] == -1
    assert read_params(arrays) == model.get_params()
    ids, bias, factors = read_side(arrays, "item", 2)
    assert ids == ["x", "y"] and bias.tolist() == model.item_bias.tolist()
    with pytest.raises(ValueError, match="disagree"):
        read_side(arrays, "item", 3)
