"""The model in service: a published version plus live fold-in of what happened since.

Retraining takes minutes; users should not wait for it. A version contributes the
slow-moving part of a prediction, μ and the factor vectors; the fast-moving part, the
user and item biases, is learned online from the stream:

* every labelled event updates a per-user ridge regression of [p_u; b_u] against the
  version's item factors (a (k+1)x(k+1) Gram matrix and a (k+1) vector per user), with
  the version's p_u as the prior for the factors and zero for the bias, so a user who
  rated items since the version was trained is scored with a vector that already
  reflects those ratings;
* every item keeps a shrunk mean of its residuals as its bias;
* both forget: each new event of a user or item discounts what came before, so the
  newest ratings weigh most. On MovieLens this beats the version's own biases, which
  average a user's whole history (see BENCHMARKS.md).

References
----------
Hu, Koren & Volinsky (2008) and Koren, Bell & Volinsky (2009) use the same closed-form
fold-in to place users in a trained factor space without retraining; recursive least
squares with a forgetting factor (Haykin, Adaptive Filter Theory) gives the discount.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from functions.mf import BiasedMF, top_k
from service.foldin import OnlineBiases, chunk_limit, decayed_group_sums


class _Rows:
    """Growable per-key row storage for the fold-in statistics."""

    def __init__(self, dim: int) -> None:
        self.index: dict[str, int] = {}
        self.gram = np.zeros((0, dim, dim))
        self.rhs = np.zeros((0, dim))
        self.prior = np.zeros((0, dim))
        self.vector = np.zeros((0, dim))

    def rows_for(
        self, keys: Sequence[str], priors_of: Callable[[list[str]], np.ndarray]
    ) -> np.ndarray:
        """Row of each key, allocating rows for new keys with ``priors_of(new keys)``."""
        index = self.index
        known = len(index)
        rows = np.fromiter(
            (index.setdefault(k, len(index)) for k in keys), dtype=np.int64, count=len(keys)
        )
        if len(index) > known:
            self._grow(priors_of(list(index)[known:]))
        return rows

    def _grow(self, priors: np.ndarray) -> None:
        """Give the newest ``len(priors)`` rows their priors; storage doubles when full."""
        used = len(self.index)
        if used > len(self.rhs):
            capacity = max(used, 2 * len(self.rhs), 64)
            for name in ("gram", "rhs", "prior", "vector"):
                old = getattr(self, name)
                grown = np.zeros((capacity, *old.shape[1:]))
                grown[: len(old)] = old
                setattr(self, name, grown)
        self.prior[used - len(priors) : used] = priors
        self.vector[used - len(priors) : used] = priors


class ServingModel:
    """Predictions and top-K for one model version, kept current by fold-in.

    Parameters
    ----------
    model
        The published version, or None before the first version exists (then
        predictions are a running mean plus folded-in user and item biases).
    version
        Its registry name.
    regularization
        λ of the fold-in ridge on the factors: how many ratings' worth of weight the
        version's vector carries against new evidence.
    bias_regularization
        The same for user and item biases, which need far less evidence to move
        than a factor vector does, so they get their own, smaller λ.
    rating_range
        Predictions are clipped to it.
    forgetting
        Each new event of a user or item first multiplies what that user or item has
        folded in so far by this factor (1.0: never forget). Tastes and popularity
        move, and an old residual was computed against biases that have moved since:
        with 0.95 about the last 20 events dominate, which on MovieLens beats keeping
        everything (DESIGN.md §6 measurement, BENCHMARKS.md).
    """

    def __init__(
        self,
        model: BiasedMF | None,
        version: str | None,
        regularization: float = 10.0,
        bias_regularization: float = 3.0,
        rating_range: tuple[float, float] = (0.5, 5.0),
        forgetting: float = 0.95,
    ) -> None:
        self.model = model
        self.version = version
        self.regularization = regularization
        self.bias_regularization = bias_regularization
        self.forgetting = forgetting
        self._chunk = chunk_limit(forgetting)
        self.rating_range = rating_range
        self._dim = (model.factors if model is not None else 0) + 1
        self._ridge = np.full(self._dim, float(regularization))
        self._ridge[-1] = bias_regularization
        self._users = _Rows(self._dim)
        self._items = OnlineBiases(bias_regularization, forgetting)
        self._rating_sum = 0.0
        self._rating_count = 0

    @property
    def global_mean(self) -> float:
        if self.model is not None:
            return float(self.model.global_mean)
        if self._rating_count:
            return self._rating_sum / self._rating_count
        return float(np.mean(self.rating_range))

    def predict(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> np.ndarray:
        """Predicted ratings (n,) with the statistics as they are now."""
        features = self._item_features(item_ids)
        item_bias = self._items.values(item_ids)
        vectors = self._user_vectors(user_ids)
        raw = self.global_mean + item_bias + np.einsum("nd,nd->n", features, vectors)
        return np.clip(raw, *self.rating_range)

    def learn(self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray) -> None:
        """Fold labelled events (n,) into the user vectors and new-item biases.

        Long replays go through in chunks, so the per-event (k+1)x(k+1) work arrays
        stay small.
        """
        self.predict_then_learn(user_ids, item_ids, ratings)

    def predict_then_learn(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> np.ndarray:
        """Prequential at event granularity, vectorised over a batch.

        Event j is predicted with everything before it, including the earlier events of
        the same batch, then folded in: for users, a batch of 500 behaves exactly like
        500 single events, which matters because users rate in bursts. Item biases are
        sequential too, but their residuals use each user's vector from before the
        batch (an approximation that keeps the computation vectorised). Per-user running
        sums inside the batch come from one cumulative sum over events grouped by user;
        event j's vector is one small ridge solve, batched over the whole batch.
        Returns the predictions (n,).
        """
        ratings = np.asarray(ratings, dtype=np.float64)
        parts = [
            self._predict_then_learn_chunk(
                user_ids[start : start + self._chunk],
                item_ids[start : start + self._chunk],
                ratings[start : start + self._chunk],
            )
            for start in range(0, len(user_ids), self._chunk)
        ]
        return np.concatenate(parts) if parts else np.empty(0)

    def _predict_then_learn_chunk(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> np.ndarray:
        n = len(user_ids)
        mean = self._means_before(ratings)
        rows = self._users.rows_for(user_ids, self._model_priors)
        features = self._item_features(item_ids)
        current = self._users.vector[rows]
        residuals = ratings - mean - np.einsum("nd,nd->n", features[:, :-1], current[:, :-1])
        item_bias = self._items.learn_sequential(item_ids, residuals - current[:, -1])
        target = ratings - mean - item_bias
        outer = features[:, :, None] * features[:, None, :]
        sums = decayed_group_sums(rows, [outer, features * target[:, None]], self.forgetting)
        users, weight = self._users, sums.stored_weight
        system = weight[:, None, None] * users.gram[rows] + sums.before[0]
        system += np.diag(self._ridge)
        right = weight[:, None] * users.rhs[rows] + sums.before[1]
        right += self._ridge * users.prior[rows]
        vectors = np.linalg.solve(system, right[..., None])[..., 0]
        predictions = np.clip(
            mean + item_bias + np.einsum("nd,nd->n", features, vectors), *self.rating_range
        )
        unique, final = sums.unique_rows, sums.final_weight
        users.gram[unique] = final[:, None, None] * users.gram[unique] + sums.totals[0]
        users.rhs[unique] = final[:, None] * users.rhs[unique] + sums.totals[1]
        self._solve(unique)
        self._rating_sum += float(ratings.sum())
        self._rating_count += n
        return predictions

    def _means_before(self, ratings: np.ndarray) -> np.ndarray | float:
        """The global mean each event is predicted with (n,), or the version's μ.

        Without a version μ is the running mean of the ratings, which moves with every
        event, inside a batch too.
        """
        if self.model is not None:
            return float(self.model.global_mean)
        earlier = np.cumsum(ratings) - ratings + self._rating_sum
        counts = self._rating_count + np.arange(len(ratings))
        midpoint = float(np.mean(self.rating_range))
        return np.where(counts > 0, earlier / np.maximum(counts, 1), midpoint)

    def user_vector(self, user_id: str) -> np.ndarray | None:
        """[p_u; b_u] (k+1,) for a user with a model row or folded-in ratings, else None."""
        row = self._users.index.get(user_id)
        if row is not None:
            return self._users.vector[row].copy()
        if self.model is not None and user_id in self.model.user_index:
            return self._model_priors([user_id])[0]
        return None

    def recommend(
        self, user_id: str, k: int, exclude_items: Sequence[str] = ()
    ) -> list[tuple[str, float]] | None:
        """Top-``k`` (item, score) for a user the model can place, else None."""
        vector = self.user_vector(user_id)
        if self.model is None or vector is None:
            return None
        scores = self.global_mean + vector[-1] + self.model.item_factors @ vector[:-1]
        scores += self._item_bias_by_model_row()
        excluded = self.model.encode_items(list(exclude_items))
        rows, top = top_k(scores, k, exclude=excluded[excluded >= 0])
        return [(self.model.item_ids[r], float(s)) for r, s in zip(rows, top, strict=True)]

    def _solve(self, rows: np.ndarray) -> None:
        users = self._users
        system = users.gram[rows] + np.diag(self._ridge)
        rhs = users.rhs[rows] + self._ridge * users.prior[rows]
        users.vector[rows] = np.linalg.solve(system, rhs[..., None])[..., 0]

    def _user_vectors(self, user_ids: Sequence[str]) -> np.ndarray:
        vectors = self._model_priors(user_ids)
        index = self._users.index
        for position, user in enumerate(user_ids):
            row = index.get(user)
            if row is not None:
                vectors[position] = self._users.vector[row]
        return vectors

    def _model_priors(self, user_ids: Sequence[str]) -> np.ndarray:
        priors = np.zeros((len(user_ids), self._dim))
        if self.model is None:
            return priors
        users = self.model.encode_users(list(user_ids))
        known = users >= 0
        priors[known, :-1] = self.model.user_factors[users[known]]
        return priors  # biases start from zero: see the class docstring

    def _item_features(self, item_ids: Sequence[str]) -> np.ndarray:
        """[q_i; 1] (n x k+1); items the version lacks have no factors."""
        features = np.zeros((len(item_ids), self._dim))
        features[:, -1] = 1.0
        if self.model is not None:
            items = self.model.encode_items(list(item_ids))
            known = items >= 0
            features[known, :-1] = self.model.item_factors[items[known]]
        return features

    def _item_bias_by_model_row(self) -> np.ndarray:
        """Online biases aligned with the version's item rows (n_items,), for scoring."""
        assert self.model is not None
        dense = np.zeros(self.model.n_items)
        rows = self.model.encode_items(self._items.keys())
        known = rows >= 0
        dense[rows[known]] = self._items.all_values()[known]
        return dense
