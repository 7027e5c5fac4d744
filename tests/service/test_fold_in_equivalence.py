"""The compiled fold-in against a plain per-event reference, on random streams.

``ServingModel`` learns a batch in one compiled pass (``service.serving.sequential``).
The reference below is the fold-in written out one event at a time with numpy and
dicts, as ``service.serving.model`` describes it: the item's shrunk, forgetting mean of
scaled residuals, then the user's ridge solve against the prior, the prediction, and
both learn, the item from the residual of the user's vector from before the batch.
Streams are drawn with skewed users and items (bursts of one user, items the version
lacks, users it lacks), cut into batches of random sizes, some longer than one learnt
chunk; predictions, the vectors ranking scores with, and the state left behind must
agree within 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest

from functions.mf import BiasedMF
from service.serving.foldin import LEARN_CHUNK
from service.serving.model import ServingModel


class ReferenceFoldIn:
    """The fold-in, one event at a time."""

    def __init__(self, model: BiasedMF | None, serving: ServingModel) -> None:
        self.model = model
        self.factors = model.factors if model is not None else 0
        self.ridge = np.array(
            [serving.regularization] * self.factors
            + [serving.bias_regularization, serving.scale_regularization]
        )
        self.item_regularization = serving._items.regularization
        self.forgetting = serving.forgetting
        self.low, self.high = serving.rating_range
        dim = self.factors + 2
        self.gram: dict[str, np.ndarray] = {}
        self.rhs: dict[str, np.ndarray] = {}
        self.item_sum: dict[str, float] = {}
        self.item_count: dict[str, float] = {}
        self.rating_sum, self.rating_count = 0.0, 0
        self.dim = dim

    def mean(self) -> float:
        if self.model is not None:
            return float(self.model.global_mean)
        if self.rating_count:
            return self.rating_sum / self.rating_count
        return (self.low + self.high) / 2

    def prior(self, user: str) -> np.ndarray:
        prior = np.zeros(self.dim)
        prior[-1] = 1.0
        if self.model is not None:
            row = int(self.model.encode_users([user])[0])
            if row >= 0:
                prior[: self.factors] = self.model.user_factors[row]
        return prior

    def item_factors(self, item: str) -> np.ndarray:
        if self.model is None:
            return np.zeros(0)
        row = int(self.model.encode_items([item])[0])
        return self.model.item_factors[row] if row >= 0 else np.zeros(self.factors)

    def vector(self, user: str) -> np.ndarray:
        gram = self.gram.get(user, np.zeros((self.dim, self.dim)))
        rhs = self.rhs.get(user, np.zeros(self.dim))
        return np.linalg.solve(gram + np.diag(self.ridge), rhs + self.ridge * self.prior(user))

    def features(self, item: str) -> np.ndarray:
        bias = self.item_sum.get(item, 0.0) / (
            self.item_regularization + self.item_count.get(item, 0.0)
        )
        return np.concatenate([self.item_factors(item), [1.0, bias]])

    def predict(self, user: str, item: str) -> float:
        score = self.mean() + self.features(item) @ self.vector(user)
        return float(np.clip(score, self.low, self.high))

    def batch(
        self, users: list[str], items: list[str], ratings: np.ndarray
    ) -> list[tuple[float, np.ndarray]]:
        """Each event of a batch in turn; items learn from the users' vectors as the
        batch found them."""
        start = {user: self.vector(user) for user in users}
        return [self.step(u, i, r, start[u]) for u, i, r in zip(users, items, ratings, strict=True)]

    def step(
        self, user: str, item: str, rating: float, start: np.ndarray
    ) -> tuple[float, np.ndarray]:
        mean, features, vector = self.mean(), self.features(item), self.vector(user)
        prediction = float(np.clip(mean + features @ vector, self.low, self.high))
        f = self.forgetting
        residual = rating - mean - features[: self.factors] @ start[: self.factors] - start[-2]
        weight = start[-1]
        self.item_sum[item] = f * self.item_sum.get(item, 0.0) + weight * residual
        self.item_count[item] = f * self.item_count.get(item, 0.0) + weight * weight
        gram = self.gram.get(user, np.zeros((self.dim, self.dim)))
        rhs = self.rhs.get(user, np.zeros(self.dim))
        self.gram[user] = f * gram + np.outer(features, features)
        self.rhs[user] = f * rhs + features * (rating - mean)
        self.rating_sum += rating
        self.rating_count += 1
        return prediction, vector


def _model(seed: int) -> BiasedMF:
    """A version trained on users u0..u59 and items i0..i149 (the stream adds more)."""
    rng = np.random.default_rng(seed)
    users = [f"u{k}" for k in rng.integers(0, 60, 4000)]
    items = [f"i{k}" for k in rng.integers(0, 150, 4000)]
    fitted = BiasedMF(factors=4, seed=seed)
    fitted.fit(users, items, rng.integers(1, 11, 4000) / 2.0, epochs=3)
    return fitted


def _stream(seed: int, n: int) -> tuple[list[str], list[str], np.ndarray]:
    """Zipf-skewed users in bursts, skewed items, some of each unknown to the version."""
    rng = np.random.default_rng(seed)
    users: list[str] = []
    while len(users) < n:
        user = f"u{int(rng.zipf(1.3)) % 90}"
        users.extend([user] * int(rng.integers(1, 30)))
    items = [f"i{int(rng.zipf(1.2)) % 200}" for _ in range(n)]
    return users[:n], items, rng.integers(1, 11, n) / 2.0


def _learnt_chunks(cut: slice) -> list[slice]:
    """The chunks a batch is learnt in: a long one in pieces of ``LEARN_CHUNK``."""
    return [
        slice(start, min(cut.stop, start + LEARN_CHUNK))
        for start in range(cut.start, cut.stop, LEARN_CHUNK)
    ]


def _batches(seed: int, n: int) -> list[slice]:
    rng = np.random.default_rng(seed + 1)
    cuts, start = [], 0
    while start < n:
        size = int(rng.choice([1, 7, 120, 500, LEARN_CHUNK + 300]))
        cuts.append(slice(start, min(n, start + size)))
        start += size
    return cuts


@pytest.mark.parametrize("forgetting", [0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_model", [True, False])
def test_batches_learn_what_the_per_event_reference_learns(
    seed: int, forgetting: float, with_model: bool
) -> None:
    model = _model(seed) if with_model else None
    serving = ServingModel(model, "v", forgetting=forgetting, item_bias_regularization=2.0)
    reference = ReferenceFoldIn(model, serving)
    users, items, ratings = _stream(seed, 6000)
    for cut in _batches(seed, len(users)):
        predictions, vectors = serving.predict_then_learn_vectors(
            users[cut], items[cut], ratings[cut]
        )
        expected = [
            pair
            for chunk in _learnt_chunks(cut)
            for pair in reference.batch(users[chunk], items[chunk], ratings[chunk])
        ]
        np.testing.assert_allclose(predictions, [p for p, _ in expected], rtol=0, atol=1e-9)
        np.testing.assert_allclose(vectors, [v for _, v in expected], rtol=0, atol=1e-9)
    probes_u = [f"u{k}" for k in range(95)]
    probes_i = [f"i{(7 * k) % 210}" for k in range(95)]
    np.testing.assert_allclose(
        serving.predict(probes_u, probes_i),
        [reference.predict(u, i) for u, i in zip(probes_u, probes_i, strict=True)],
        rtol=0,
        atol=1e-9,
    )


def test_the_reference_tells_a_changed_kernel_apart() -> None:
    """The comparison can fail: the reference without forgetting does not match a model
    that forgets."""
    model = _model(3)
    serving = ServingModel(model, "v", forgetting=0.9)
    reference = ReferenceFoldIn(model, serving)
    reference.forgetting = 1.0
    users, items, ratings = _stream(3, 400)
    predictions = serving.predict_then_learn(users, items, ratings)
    expected = [prediction for prediction, _ in reference.batch(users, items, ratings)]
    assert np.abs(predictions - expected).max() > 1e-6


def test_items_learn_from_the_users_vectors_as_the_batch_found_them() -> None:
    """A bursty batch at once and the same events one by one part ways: within a batch
    an item's residuals use each user's vector from before the batch."""
    model = _model(4)
    users, items, ratings = _stream(4, 300)
    at_once = ServingModel(model, "v").predict_then_learn(users, items, ratings)
    single = ServingModel(model, "v")
    one_by_one = np.concatenate(
        [
            single.predict_then_learn(users[j : j + 1], items[j : j + 1], ratings[j : j + 1])
            for j in range(len(users))
        ]
    )
    assert np.abs(at_once - one_by_one).max() > 1e-6
