"""The model in service: a published version plus live fold-in of what happened since.

Retraining takes minutes; users should not wait for it. A version contributes the
slow-moving part of a prediction, μ and the factor vectors; the fast-moving part, the
user and item biases, is learned online from the stream:

* every labelled event updates a per-user ridge regression of [p_u; b_u; s_u] against
  [q_i; 1; b_i] (a (k+2)x(k+2) Gram matrix and a (k+2) vector per user), with the
  version's p_u as the prior for the factors, zero for the bias and one for s_u, so a
  user who rated items since the version was trained is scored with a vector that
  already reflects those ratings. s_u is the user's scale on the item biases (the
  c_u of Koren's timeSVD++): a user who turns against the crowd, rating low what most
  rate high, takes s_u below zero after a few ratings, where a plain bias model keeps
  predicting the crowd's taste for them until their factors catch up;
* every item keeps a shrunk mean of its residuals as its bias, each residual weighed
  by its user's scale (a residual of a user with s_u = −1 says the opposite of one
  with s_u = 1);
* both forget: each new event of a user or item discounts what came before, so the
  newest ratings weigh most. On MovieLens this beats the version's own biases, which
  average a user's whole history (see BENCHMARKS.md).

References
----------
Hu, Koren & Volinsky (2008) and Koren, Bell & Volinsky (2009) use the same closed-form
fold-in to place users in a trained factor space without retraining; recursive least
squares with a forgetting factor (Haykin, Adaptive Filter Theory) gives the discount;
Koren (2009), "Collaborative filtering with temporal dynamics", scales the item bias per
user (c_u) because users weigh an item's general appeal differently.

Concurrency: one writer (the learner, under its lock) learns; any number
of readers (``/recommend``) read without a lock. After every learnt chunk the writer
publishes an immutable ``ServingView`` (read-copy-update): the item biases aligned with
the version's rows in a fresh array, and the users' vectors in a persistent map
(``immutables.Map``, a hash array mapped trie: a batch's updates cost O(log n) each and
leave every earlier map intact). A reader takes the view once and scores against the
version it names, so it never sees a half-updated model.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from immutables import Map

from functions.mf import BiasedMF
from service.serving.answers import KeptAnswers
from service.serving.foldin import LEARN_CHUNK, OnlineBiases
from service.serving.index import ItemIndex
from service.serving.rows import LruRows
from service.serving.sequential import fold_in_events, solve_rows
from service.serving.vector import (
    BIAS,
    EXTRA,
    SCALE,
    version_vectors,
)
from service.serving.view import ServingView, moved_after


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
        The same for user biases, which need far less evidence to move than a factor
        vector does, so they get their own, smaller λ.
    scale_regularization
        The same for the user's scale on item biases (prior 1): small, since one
        coefficient is quickly learnt, and a user whose taste turned needs it to move
        within a few ratings.
    item_bias_regularization
        The same for item biases, in ratings: an item's bias is the sum of its
        residuals over this plus their count (None: ``bias_regularization``).
    ranking_item_bias_regularization
        The same sums as ranking (top-K and the prequential hit-rate) reads them, shrunk
        towards the version's item bias rather than zero: (Σ residuals + this · b_i) /
        (this + count). The rating an item gets next is best predicted with little
        shrinkage; which items to put first is not: a bias from three ratings is mostly
        noise, and ranking by it fills every list with items a few users loved, while
        the version's bias stands on the whole training window. Predictions never read
        it, so it costs no RMSE (None: ``item_bias_regularization``; BENCHMARKS.md
        "prequential").
    rating_range
        Predictions are clipped to it.
    forgetting
        Each new event of a user or item first multiplies what that user or item has
        folded in so far by this factor (1.0: never forget). Tastes and popularity
        move, and an old residual was computed against biases that have moved since:
        with 0.95 about the last 20 events dominate (BENCHMARKS.md "prequential").
    max_users, max_items
        Most users and items whose fold-in is kept (None: unbounded); the least
        recently seen are evicted and fall back to the version's vector and a zero
        online bias.
    cached_answers
        Most top-K answers kept for repeated requests (0: none); see ``ServingView``.
    answer_max_age_s
        How long a kept answer may go on serving after other users' events changed the
        item biases it was ranked with (0: only within the view it came from).
    """

    def __init__(
        self,
        model: BiasedMF | None,
        version: str | None,
        regularization: float = 10.0,
        bias_regularization: float = 3.0,
        rating_range: tuple[float, float] = (0.5, 5.0),
        forgetting: float = 0.95,
        max_users: int | None = None,
        max_items: int | None = None,
        cached_answers: int = 0,
        item_bias_regularization: float | None = None,
        ranking_item_bias_regularization: float | None = None,
        scale_regularization: float = 1.0,
        answer_max_age_s: float = 0.0,
    ) -> None:
        self.model = model
        self.version = version
        self.regularization = regularization
        self.bias_regularization = bias_regularization
        self.scale_regularization = scale_regularization
        self.forgetting = forgetting
        self.rating_range = rating_range
        self._dim = (model.factors if model is not None else 0) + EXTRA
        self._ridge = np.full(self._dim, float(regularization))
        self._ridge[BIAS] = bias_regularization
        self._ridge[SCALE] = scale_regularization
        dim = self._dim
        shapes = {"gram": (dim, dim), "rhs": (dim,), "prior": (dim,), "vector": (dim,)}
        self._users = LruRows(shapes, _at_least_a_chunk(max_users))
        self._items = OnlineBiases(
            bias_regularization if item_bias_regularization is None else item_bias_regularization,
            forgetting,
            _at_least_a_chunk(max_items),
        )
        self.ranking_item_bias_regularization = ranking_item_bias_regularization
        self._rating_sum = 0.0
        self._rating_count = 0
        self._view = ServingView(
            model,
            version,
            self.global_mean,
            model.item_bias.copy() if model is not None else np.zeros(0),
            Map(),
            answers=KeptAnswers(cached_answers, answer_max_age_s),
        )

    @property
    def view(self) -> ServingView:
        """The state readers use now; take it once per request."""
        return self._view

    def attach_index(self, index: ItemIndex | None) -> None:
        """Serve top-K from ``index`` (built from this version's items) from now on.

        The items whose bias rose or fell since the index read it are found once here,
        then kept up to date as events are learnt (``_publish``).
        """
        view = self._view
        risen = fallen = np.empty(0, dtype=np.int64)
        if index is not None:
            risen = np.flatnonzero(view.item_bias > index.indexed_bias)
            fallen = np.flatnonzero(view.item_bias < index.indexed_bias)
        self._view = replace(
            view, index=index, risen=risen, fallen=fallen, answers=view.answers.emptied()
        )

    @property
    def online_users(self) -> int:
        return len(self._users)

    @property
    def online_items(self) -> int:
        return len(self._items)

    @property
    def global_mean(self) -> float:
        if self.model is not None:
            return float(self.model.global_mean)
        if self._rating_count:
            return self._rating_sum / self._rating_count
        return float(np.mean(self.rating_range))

    def predict(self, user_ids: Sequence[str], item_ids: Sequence[str]) -> np.ndarray:
        """Predicted ratings (n,) with the statistics as they are now."""
        features = self._item_features(self._factors_of(item_ids), self._items.values(item_ids))
        vectors = self._user_vectors(user_ids)
        raw = self.global_mean + np.einsum("nd,nd->n", features, vectors)
        return np.clip(raw, *self.rating_range)

    def learn(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        ratings: np.ndarray,
        pause_s: float = 0.0,
    ) -> None:
        """Fold labelled events (n,) into the user vectors and new-item biases.

        Long replays go through in chunks; with ``pause_s``, a sleep between chunks. A
        hot swap replays tens of thousands of events beside the request loop, under the
        same interpreter lock: taken at once it held the process for a few hundred
        milliseconds, paused it leaves the loop room (the lock is free while this thread
        sleeps). The chunks, and so the result, are the same either way.
        """
        ratings = np.asarray(ratings, dtype=np.float64)
        for at, chunk in enumerate(self._chunked(user_ids, item_ids, ratings)):
            if at and pause_s:
                time.sleep(pause_s)
            self._predict_then_learn_chunk(*chunk)

    def predict_then_learn(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> np.ndarray:
        """Prequential at event granularity: predict each event, then learn it.

        Event j is predicted with everything before it, including the earlier events of
        the same batch, then folded in: for users, a batch of 500 behaves exactly like
        500 single events, which matters because users rate in bursts. Item biases are
        sequential too, but their residuals use each user's vector from before the
        batch. The batch goes through one compiled pass (``service.serving.sequential``).
        Returns the predictions (n,).
        """
        return self.predict_then_learn_vectors(user_ids, item_ids, ratings)[0]

    def predict_then_learn_vectors(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``predict_then_learn``, also returning each event's user vector [p_u; b_u; s_u].

        Vector j (``n x k+2``) is the one event j was predicted with, learnt from every
        earlier event and not from j: prequential ranking scores the catalogue with it,
        at the same granularity as the rating prediction.
        """
        ratings = np.asarray(ratings, dtype=np.float64)
        parts = [
            self._predict_then_learn_chunk(*chunk)
            for chunk in self._chunked(user_ids, item_ids, ratings)
        ]
        if not parts:
            return np.empty(0), np.empty((0, self._dim))
        return (
            np.concatenate([part[0] for part in parts]),
            np.concatenate([part[1] for part in parts]),
        )

    def _chunked(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> Iterator[tuple[Sequence[str], Sequence[str], np.ndarray]]:
        """The events in the chunks one fold-in call groups; a batch that fits one chunk
        goes down whole, its ids as they came (a batch's ``Ids`` keep their look-ups)."""
        n = len(user_ids)
        if 0 < n <= LEARN_CHUNK:
            yield user_ids, item_ids, ratings
            return
        for start in range(0, n, LEARN_CHUNK):
            chunk = slice(start, start + LEARN_CHUNK)
            yield user_ids[chunk], item_ids[chunk], ratings[chunk]

    def _predict_then_learn_chunk(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n = len(user_ids)
        means = np.empty(n)
        means[:] = self._means_before(ratings)
        users, items = self._users, self._items.rows
        rows = users.rows_for(user_ids)
        self._give_priors()
        item_rows = items.rows_for(item_ids)
        model_rows = self._model_item_rows(item_ids)
        predictions, vectors = np.empty(n), np.empty((n, self._dim))
        fold_in_events(
            rows,
            item_rows,
            self._factors_at(model_rows),
            np.ascontiguousarray(ratings),
            means,
            users["vector"][rows],
            users["gram"],
            users["rhs"],
            users["prior"],
            self._ridge,
            items["sum"],
            items["count"],
            float(self._items.regularization),
            float(self.forgetting),
            float(self.rating_range[0]),
            float(self.rating_range[1]),
            predictions,
            vectors,
        )
        unique = np.unique(rows)
        solve_rows(
            unique, users["gram"], users["rhs"], users["prior"], self._ridge, users["vector"]
        )
        self._rating_sum += float(ratings.sum())
        self._rating_count += n
        self._publish(unique, item_rows, model_rows)
        return predictions, vectors

    def _give_priors(self) -> None:
        """Start the rows of users new to the fold-in from the version's vectors."""
        users = self._users
        if len(users.fresh) == 0:
            return
        keys = [users.key_of(int(row)) or "" for row in users.fresh]
        priors = self._model_priors(keys)
        users["prior"][users.fresh] = priors
        users["vector"][users.fresh] = priors

    def _publish(
        self, user_rows: np.ndarray, item_rows: np.ndarray, model_rows: np.ndarray
    ) -> None:
        """Evict over the bounds, then publish the next view (see the module docstring).

        ``item_rows`` and ``model_rows`` are the batch's items' online and version rows.
        """
        users = self._users
        with self._view.user_vectors.mutate() as vectors:
            for row in user_rows.tolist():
                key = users.key_of(row)
                if key is not None:
                    vectors[key] = users["vector"][row].copy()
            for key in users.evict():
                vectors.pop(key, None)
            user_vectors = vectors.finish()
        evicted = self._items.evict()
        view = self._view
        item_bias, risen, fallen = view.item_bias, view.risen, view.fallen
        if self.model is not None:
            item_bias = item_bias.copy()
            online, first = np.unique(item_rows, return_index=True)
            touched = model_rows[first]
            known = touched >= 0
            ranked = self._items.biases_of_rows(
                online[known],
                self.ranking_item_bias_regularization,
                self.model.item_bias[touched[known]],
            )
            item_bias[touched[known]] = ranked
            gone = self.model.encode_items(evicted)
            gone = gone[gone >= 0]
            item_bias[gone] = self.model.item_bias[gone]
            risen, fallen = moved_after(view, np.concatenate([touched[known], gone]), item_bias)
        self._view = replace(
            view,
            global_mean=self.global_mean,
            item_bias=item_bias,
            user_vectors=user_vectors,
            risen=risen,
            fallen=fallen,
            answers=view.answers.for_next_view(),
        )

    # -- snapshots (``service.stream.snapshot``) ----------------------------------------
    def settings(self) -> dict[str, Any]:
        """What the fold-in's arithmetic depends on besides its state: a state learnt
        under other settings cannot continue under these."""
        return {
            "version": self.version,
            "dim": self._dim,
            "ridge": self._ridge.tolist(),
            "item_bias_regularization": self._items.regularization,
            "ranking_item_bias_regularization": self.ranking_item_bias_regularization,
            "forgetting": self.forgetting,
            "rating_range": list(self.rating_range),
            "max_users": self._users.limit,
            "max_items": self._items.rows.limit,
        }

    def export_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """A copy of the fold-in (arrays, and scalars for a JSON header) from which
        ``load_state`` continues bit for bit; the writer's lock must be held."""
        arrays = {
            **self._users.export_state("users_"),
            **self._items.export_state("items_"),
            "view_item_bias": self._view.item_bias.copy(),
        }
        scalars = {"rating_sum": self._rating_sum, "rating_count": self._rating_count}
        return arrays, scalars

    def load_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        """Continue from ``export_state`` of a model with the same ``settings()``, on a
        model just built; ``ValueError`` if the state does not fit it."""
        item_bias = np.asarray(arrays["view_item_bias"], dtype=np.float64)
        if item_bias.shape != self._view.item_bias.shape:
            raise ValueError(f"item biases of shape {item_bias.shape} for {self.version}")
        self._users.load_state(arrays, "users_")
        self._items.load_state(arrays, "items_")
        self._rating_sum = float(scalars["rating_sum"])
        self._rating_count = int(scalars["rating_count"])
        users, vectors = self._users, self._users["vector"]
        user_vectors = Map({key: vectors[row].copy() for key, row in users.index.items()})
        self._view = replace(
            self._view,
            global_mean=self.global_mean,
            item_bias=item_bias.copy(),
            user_vectors=user_vectors,
            answers=self._view.answers.emptied(),
        )

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
        """[p_u; b_u; s_u] (k+2,) for a user with a model row or folded-in ratings, else None."""
        vector = self._view.user_vector(user_id)
        return None if vector is None else vector.copy()

    def recommend(
        self, user_id: str, k: int, exclude_items: Collection[str] = ()
    ) -> list[tuple[str, float]] | None:
        """Top-``k`` (item, score) for a user the model can place, else None (lock-free)."""
        return self._view.recommend(user_id, k, exclude_items)

    def _solve(self, rows: np.ndarray) -> None:
        users = self._users
        system = users["gram"][rows] + np.diag(self._ridge)
        rhs = users["rhs"][rows] + self._ridge * users["prior"][rows]
        users["vector"][rows] = np.linalg.solve(system, rhs[..., None])[..., 0]

    def _user_vectors(self, user_ids: Sequence[str]) -> np.ndarray:
        vectors = self._model_priors(user_ids)
        users = self._users
        for position, user in enumerate(user_ids):
            row = users.get(user)
            if row is not None:
                vectors[position] = users["vector"][row]
        return vectors

    def _model_priors(self, user_ids: Sequence[str]) -> np.ndarray:
        """[p_u; 0; 1] per user (zero factors for users the version lacks)."""
        if self.model is None:
            return version_vectors(None, np.full(len(user_ids), -1))
        return version_vectors(self.model, self.model.encode_users(list(user_ids)))

    def _model_item_rows(self, item_ids: Sequence[str]) -> np.ndarray:
        """The version's row of each item (-1: the version lacks it, or no version)."""
        if self.model is None:
            return np.full(len(item_ids), -1, dtype=np.int64)
        return self.model.encode_items(item_ids)

    def _factors_at(self, model_rows: np.ndarray) -> np.ndarray:
        """q_i (n x k) of the version's item ``model_rows``; -1 rows get zero factors."""
        factors = np.zeros((len(model_rows), self._dim - EXTRA))
        known = model_rows >= 0
        if self.model is not None:
            factors[known] = self.model.item_factors[model_rows[known]]
        return factors

    def _factors_of(self, item_ids: Sequence[str]) -> np.ndarray:
        """q_i (n x k); items the version lacks have zero factors."""
        return self._factors_at(self._model_item_rows(item_ids))

    def _item_features(self, factors: np.ndarray, item_bias: np.ndarray) -> np.ndarray:
        """[q_i; 1; b_i] (n x k+2), what a user vector [p_u; b_u; s_u] multiplies."""
        features = np.empty((len(factors), self._dim))
        features[:, :BIAS] = factors
        features[:, BIAS] = 1.0
        features[:, SCALE] = item_bias
        return features


def _at_least_a_chunk(limit: int | None) -> int | None:
    """A bound no smaller than one learnt chunk: the keys just learnt are never evicted."""
    return None if limit is None else max(limit, LEARN_CHUNK)
