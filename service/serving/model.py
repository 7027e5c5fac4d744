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
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from immutables import Map

from functions.mf import BiasedMF
from service.serving.answers import KeptAnswers
from service.serving.foldin import OnlineBiases, chunk_limit, decayed_group_sums
from service.serving.index import ItemIndex
from service.serving.rows import LruRows
from service.serving.topk import best_rows
from service.serving.vector import (
    BIAS,
    EXTRA,
    SCALE,
    item_scores,
    version_vector,
    version_vectors,
)

_NO_ROWS = np.empty(0, dtype=np.int64)
#: One request of ``ServingView.recommend_many``: the user, k and their rated items.
Asked = tuple[str, int, Collection[str]]
#: Users whose encoded rated items a version keeps (cleared whole when full).
_ENCODED_USERS = 100_000


@dataclass(frozen=True)
class ServingView:
    """What ``recommend`` reads: one consistent state of a version and its fold-in.

    ``item_bias`` holds the items' online biases as ranking reads them: shrunk by
    ``ranking_item_bias_regularization``, harder than the biases predictions use, so an
    item with a handful of high ratings does not top every list.

    Nothing in it is written after publication: ``item_bias`` is a fresh array per
    view and ``user_vectors`` a persistent map whose arrays are never written in place.
    With an ANN ``index`` (``service.serving.index``), ``risen`` holds the rows whose
    online bias is above the one they were indexed with and ``fallen`` those below it,
    sorted: ``recommend`` scores the ones that gained for the user (``risen`` for a
    user who scales item biases up, ``fallen`` for one who scales them down) beside the
    index's candidates.

    ``answers`` keeps top-K answers for repeated requests (``service.serving.answers``):
    one answer holds while the user's vector and rated items are unchanged, for at
    most its store's ``max_age_s`` beyond the view it came from.
    """

    model: BiasedMF | None
    version: str | None
    global_mean: float
    item_bias: np.ndarray
    user_vectors: Map[str, np.ndarray]
    index: ItemIndex | None = None
    risen: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    fallen: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    #: User → (rated items, their rows), shared by the views of one version.
    encoded: dict[str, tuple[Collection[str], np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )
    answers: KeptAnswers = field(default_factory=lambda: KeptAnswers(0), compare=False, repr=False)
    #: Whether risen (True) or fallen → how far each of those rows' bias moved since
    #: indexing; computed by the first request that needs it, fresh in every view.
    moved_by: dict[bool, np.ndarray] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def user_vector(self, user_id: str) -> np.ndarray | None:
        """[p_u; b_u; s_u] (k+2,) of a folded-in user or a user of the version, else None."""
        vector = self.user_vectors.get(user_id)
        if vector is not None:
            return vector
        model = self.model
        if model is None or user_id not in model.user_index:
            return None
        return version_vector(model, model.user_index[user_id])

    def recommend(
        self, user_id: str, k: int, exclude_items: Collection[str] = ()
    ) -> list[tuple[str, float]] | None:
        """Top-``k`` (item, score) of this version for a user it can place, else None."""
        return self.recommend_many([(user_id, k, exclude_items)])[0]

    def recommend_many(self, asked: Sequence[Asked]) -> list[list[tuple[str, float]] | None]:
        """``recommend`` of each (user, k, rated items), with one index search for all.

        A search of many queries costs about half as much per query as one search each
        (faiss's fast scan reads the lists' codes for several queries at a time), and
        each answer is what ``recommend`` alone gives: every query gets the candidates
        it would alone (``ItemIndex.candidates_many``).
        """
        answers: list[list[tuple[str, float]] | None] = [None] * len(asked)
        searched: list[tuple[int, np.ndarray, np.ndarray]] = []
        model = self.model
        for at, (user_id, k, exclude_items) in enumerate(asked):
            kept = self.answers.get(user_id, k, exclude_items, self.user_vectors.get(user_id))
            if kept is not None:
                answers[at] = list(kept)
                continue
            vector = self.user_vector(user_id)
            if model is None or vector is None:
                continue
            excluded = self._excluded_rows(user_id, exclude_items)
            if self.index is None:
                scores = item_scores(model.item_factors, self.item_bias, self.global_mean, vector)
                answers[at] = self._answer(asked[at], *best_rows(scores, k, excluded))
            else:
                searched.append((at, vector, excluded))
        if searched:
            assert self.index is not None
            vectors = np.stack([vector for _, vector, _ in searched])
            wanted = [2 * asked[at][1] + len(excluded) for at, _, excluded in searched]
            found = self.index.candidates_many(vectors, wanted)
            for (at, vector, excluded), candidates in zip(searched, found, strict=True):
                rows, top = self._indexed_top(vector, asked[at][1], excluded, candidates)
                answers[at] = self._answer(asked[at], rows, top)
        return answers

    def _answer(self, asked: Asked, rows: np.ndarray, top: np.ndarray) -> list[tuple[str, float]]:
        """The (item, score) pairs of ``rows``, kept for the user's next request."""
        assert self.model is not None
        user_id, k, exclude_items = asked
        names = self.model.item_ids
        answer = [(names[r], s) for r, s in zip(rows.tolist(), top.tolist(), strict=True)]
        vector = self.user_vectors.get(user_id)
        self.answers.put(user_id, k, exclude_items, vector, tuple(answer))
        return answer

    def _excluded_rows(self, user_id: str, items: Collection[str]) -> np.ndarray:
        """The version's rows of ``items``, ascending, encoded once per user and history
        snapshot.

        A user's rated items come as a frozenset that ingestion replaces, never changes,
        so the rows encoded for it hold until the user's next event; encoding ~150 ids
        per request cost more than scoring MovieLens' whole catalogue.
        """
        if not items:
            return _NO_ROWS
        cached = self.encoded.get(user_id)
        if cached is not None and cached[0] is items:
            return cached[1]
        assert self.model is not None
        rows = self.model.encode_items(list(items))
        rows = np.sort(rows[rows >= 0])  # ascending, as ``_without`` reads them
        if isinstance(items, frozenset):
            if len(self.encoded) >= _ENCODED_USERS:
                self.encoded.clear()
            self.encoded[user_id] = (items, rows)
        return rows

    def _indexed_top(
        self, vector: np.ndarray, k: int, excluded: np.ndarray, candidates: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows and scores among the index's candidates and the items whose
        bias moved in the user's favour since indexing far enough to matter.

        The index was asked for twice the candidates that fill ``k`` after the excluded
        ones are dropped: the margin between the k-th and the last of them is what
        keeps most moved items from needing a score (``_contenders``). Each candidate
        is scored exactly, with the current biases, and ties go to the lower row, as
        in exact scoring.
        """
        assert self.index is not None and self.model is not None
        pool = _without(np.sort(candidates), excluded)
        item_factors, item_bias = self.model.item_factors, self.item_bias
        # ``np.take`` gathers rows faster than fancy indexing: 300 rows of a million,
        # 33 against 55 µs, a quarter of the search thread's time on the benchmark.
        scores = item_scores(
            np.take(item_factors, pool, axis=0), item_bias[pool], self.global_mean, vector
        )
        extra = _without(_without(self._contenders(vector, pool, scores, k), pool), excluded)
        if len(extra):
            extra_scores = item_scores(
                np.take(item_factors, extra, axis=0), item_bias[extra], self.global_mean, vector
            )
            pool, scores = np.concatenate([pool, extra]), np.concatenate([scores, extra_scores])
            order = np.argsort(pool, kind="stable")
            pool, scores = pool[order], scores[order]
        rows, top = best_rows(scores, k)
        return pool[rows], top

    def _contenders(
        self, vector: np.ndarray, pool: np.ndarray, scores: np.ndarray, k: int
    ) -> np.ndarray:
        """The moved items (``risen`` for a user who scales item biases up, ``fallen``
        for one who scales them down) that could beat the ``k``-th best of ``pool``.

        An item the index did not offer scored at most the lowest of ``pool`` with its
        indexed bias; its bias has since lifted its score by s_u · (b_now − b_indexed).
        Only a lift that closes the gap to the k-th best can put it in the answer, so
        the others are never scored: under ingestion thousands of items move between
        swaps, and scoring them all cost more per request than the search itself.
        """
        assert self.index is not None
        scale = float(vector[SCALE])
        gained = self.risen if scale >= 0 else self.fallen
        if len(gained) == 0 or len(scores) < k:
            return gained
        indexed_bias = self.index.indexed_bias
        lift = scale * self._moved_by(scale >= 0)
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        floor = float(np.min(scores - scale * (self.item_bias[pool] - indexed_bias[pool])))
        return gained[lift >= kth - floor]

    def _moved_by(self, up: bool) -> np.ndarray:
        """b_now − b_indexed of ``risen`` (``up``) or ``fallen`` rows, in their order, once
        per view rather than per request. Two requests racing both store the same array."""
        moved = self.moved_by.get(up)
        if moved is None:
            assert self.index is not None
            gained = self.risen if up else self.fallen
            moved = self.item_bias[gained] - self.index.indexed_bias[gained]
            self.moved_by[up] = moved
        return moved


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
        self._chunk = chunk_limit(forgetting)
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

        Long replays go through in chunks, so the per-event (k+1)x(k+1) work arrays
        stay small; with ``pause_s``, a sleep between chunks. A hot swap replays tens of
        thousands of events beside the request loop, under the same interpreter lock:
        taken at once it held the process for a few hundred milliseconds, paused it
        leaves the loop room (the lock is free while this thread sleeps). The chunks,
        and so the result, are the same either way.
        """
        ratings = np.asarray(ratings, dtype=np.float64)
        for chunk in self._chunks(len(user_ids)):
            if chunk.start and pause_s:
                time.sleep(pause_s)
            self._predict_then_learn_chunk(user_ids[chunk], item_ids[chunk], ratings[chunk])

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
            self._predict_then_learn_chunk(user_ids[chunk], item_ids[chunk], ratings[chunk])
            for chunk in self._chunks(len(user_ids))
        ]
        if not parts:
            return np.empty(0), np.empty((0, self._dim))
        return (
            np.concatenate([part[0] for part in parts]),
            np.concatenate([part[1] for part in parts]),
        )

    def _chunks(self, n: int) -> list[slice]:
        """The slices of ``n`` events that one fold-in call groups."""
        return [slice(start, start + self._chunk) for start in range(0, n, self._chunk)]

    def _predict_then_learn_chunk(
        self, user_ids: Sequence[str], item_ids: Sequence[str], ratings: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n = len(user_ids)
        mean = self._means_before(ratings)
        users = self._users
        rows = users.rows_for(user_ids)
        self._give_priors()
        current = users["vector"][rows]
        # What is left for s_u · b_i once μ, the factors and b_u have spoken.
        factors = self._factors_of(item_ids)
        residuals = ratings - mean - np.einsum("nd,nd->n", factors, current[:, :BIAS])
        residuals -= current[:, BIAS]
        item_bias = self._items.learn_sequential(item_ids, residuals, weights=current[:, SCALE])
        features = self._item_features(factors, item_bias)
        target = ratings - mean
        outer = features[:, :, None] * features[:, None, :]
        sums = decayed_group_sums(rows, [outer, features * target[:, None]], self.forgetting)
        weight, gram, rhs = sums.stored_weight, users["gram"], users["rhs"]
        system = weight[:, None, None] * gram[rows] + sums.before[0]
        system += np.diag(self._ridge)
        right = weight[:, None] * rhs[rows] + sums.before[1]
        right += self._ridge * users["prior"][rows]
        vectors = np.linalg.solve(system, right[..., None])[..., 0]
        predictions = np.clip(mean + np.einsum("nd,nd->n", features, vectors), *self.rating_range)
        unique, final = sums.unique_rows, sums.final_weight
        gram[unique] = final[:, None, None] * gram[unique] + sums.totals[0]
        rhs[unique] = final[:, None] * rhs[unique] + sums.totals[1]
        self._solve(unique)
        self._rating_sum += float(ratings.sum())
        self._rating_count += n
        self._publish(unique, item_ids)
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

    def _publish(self, user_rows: np.ndarray, item_ids: Sequence[str]) -> None:
        """Evict over the bounds, then publish the next view (see the module docstring)."""
        users = self._users
        with self._view.user_vectors.mutate() as vectors:
            for row in user_rows.tolist():
                key = users.key_of(row)
                if key is not None:
                    vectors[key] = users["vector"][row].copy()
            for key in users.evict():
                vectors.pop(key, None)
            user_vectors = vectors.finish()
        touched = list(dict.fromkeys(item_ids))
        evicted = self._items.evict()
        view = self._view
        item_bias, risen, fallen = view.item_bias, view.risen, view.fallen
        if self.model is not None:
            item_bias = item_bias.copy()
            rows = self.model.encode_items(touched + evicted)
            known = rows >= 0
            prior = np.where(known, self.model.item_bias[rows], 0.0)
            ranked = self._items.values(
                touched, self.ranking_item_bias_regularization, prior[: len(touched)]
            )
            values = np.concatenate([ranked, prior[len(touched) :]])
            item_bias[rows[known]] = values[known]
            risen, fallen = _moved(view, rows[known], item_bias)
        self._view = replace(
            view,
            global_mean=self.global_mean,
            item_bias=item_bias,
            user_vectors=user_vectors,
            risen=risen,
            fallen=fallen,
            answers=view.answers.for_next_view(),
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

    def _factors_of(self, item_ids: Sequence[str]) -> np.ndarray:
        """q_i (n x k); items the version lacks have zero factors."""
        factors = np.zeros((len(item_ids), self._dim - EXTRA))
        if self.model is not None:
            items = self.model.encode_items(list(item_ids))
            known = items >= 0
            factors[known] = self.model.item_factors[items[known]]
        return factors

    def _item_features(self, factors: np.ndarray, item_bias: np.ndarray) -> np.ndarray:
        """[q_i; 1; b_i] (n x k+2), what a user vector [p_u; b_u; s_u] multiplies."""
        features = np.empty((len(factors), self._dim))
        features[:, :BIAS] = factors
        features[:, BIAS] = 1.0
        features[:, SCALE] = item_bias
        return features


def _without(rows: np.ndarray, sorted_rows: np.ndarray) -> np.ndarray:
    """``rows`` less those in ``sorted_rows`` (ascending), in their order: one binary
    search per row, where ``np.isin`` and ``np.setdiff1d`` sort both arrays again on
    every call.

    >>> _without(np.array([7, 1, 4, 9]), np.array([1, 4, 8])).tolist()
    [7, 9]
    """
    if not len(sorted_rows) or not len(rows):
        return rows
    at = np.minimum(np.searchsorted(sorted_rows, rows), len(sorted_rows) - 1)
    return rows[sorted_rows[at] != rows]


def _moved(
    view: ServingView, rows: np.ndarray, item_bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``view.risen`` and ``view.fallen`` after the biases of ``rows`` changed to
    ``item_bias[rows]``."""
    if view.index is None:
        return view.risen, view.fallen
    indexed = view.index.indexed_bias[rows]
    up, down = item_bias[rows] > indexed, item_bias[rows] < indexed
    risen = np.union1d(np.setdiff1d(view.risen, rows, assume_unique=True), rows[up])
    fallen = np.union1d(np.setdiff1d(view.fallen, rows, assume_unique=True), rows[down])
    return risen, fallen


def _at_least_a_chunk(limit: int | None) -> int | None:
    """A bound no smaller than one learnt chunk: the keys just learnt are never evicted."""
    return None if limit is None else max(limit, chunk_limit(1.0))
