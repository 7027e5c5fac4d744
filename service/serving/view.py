"""What ``/recommend`` reads: one consistent, immutable state of a version and its fold-in.

``ServingModel`` (the writer) publishes a new ``ServingView`` after every learnt chunk;
readers take one view per request and never see a half-updated model. Top-K is exact
over the catalogue, or searched in the version's item index and corrected for the
items whose online bias moved since the index read it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
from immutables import Map

from functions.mf import BiasedMF
from service.serving.answers import KeptAnswers
from service.serving.index import ItemIndex
from service.serving.topk import best_rows
from service.serving.vector import SCALE, item_scores, version_vector

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


def moved_after(
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
