"""Conformance: what every model in ``functions`` guarantees, one parametrised test.

Clone is repeatable and untrained, seeded runs reproduce exactly, and the state
round-trips through arrays and artifact bytes with identical predictions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from functions.artifacts import model_from_bytes, model_to_bytes, sha256_hex
from functions.mf import BiasedMF

MODELS: dict[str, Callable[[], BiasedMF]] = {
    "default": lambda: BiasedMF(seed=42),
    "small": lambda: BiasedMF(factors=3, learning_rate=0.1, regularization=0.0, seed=7),
    "biases-only": lambda: BiasedMF(factors=1, init_scale=0.0, seed=1),
}


def stream(seed: int) -> tuple[list[str], list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    users = [f"u{x}" for x in rng.integers(0, 40, 600)]
    items = [f"i{x}" for x in rng.integers(0, 25, 600)]
    return users, items, rng.uniform(0.5, 5.0, 600).round(1)


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_model_conformance(make: Callable[[], BiasedMF]) -> None:
    users, items, ratings = stream(0)
    model = make()
    losses = model.fit(users, items, ratings, epochs=3, batch_size=64)

    fresh = model.clone()
    assert type(fresh) is type(model) and fresh.get_params() == model.get_params()
    assert fresh.n_users == fresh.n_items == 0 and fresh.global_mean == 0.0
    assert fresh.clone().get_params() == fresh.get_params()

    # Same seed, same data: bit-identical losses and state.
    assert fresh.fit(users, items, ratings, epochs=3, batch_size=64) == losses
    np.testing.assert_array_equal(fresh.user_factors, model.user_factors)

    # Warm-start copies continue identically to the original.
    more_users, more_items, more = stream(1)
    twin = model.copy()
    assert twin.fit(more_users, more_items, more, epochs=1) == model.fit(
        more_users, more_items, more, epochs=1
    )

    probe_users = users[:50] + ["never-seen"] * 3 + more_users[:10]
    probe_items = items[:50] + ["nope", items[0], "nope"] + more_items[:10]
    expected = model.predict(probe_users, probe_items)
    restored = BiasedMF.from_arrays(model.to_arrays())
    np.testing.assert_array_equal(restored.predict(probe_users, probe_items), expected)
    assert restored.get_params() == model.get_params()
    assert restored.user_ids == model.user_ids and restored.item_ids == model.item_ids

    data = model_to_bytes(model)
    assert model_to_bytes(restored) == data  # deterministic bytes, stable checksum
    loaded = model_from_bytes(data, expected_sha256=sha256_hex(data))
    np.testing.assert_array_equal(loaded.predict(probe_users, probe_items), expected)
