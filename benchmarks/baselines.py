"""What Driftline is measured against: river's ``BiasedMF`` learning every event.

It is what a team would build instead of Driftline: one online model updated per event,
no drift handling, no versions. Used by the demo and the benchmark on the same stream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from river import optim, reco

from drift.ranking import DEFAULT_K, NOT_RANKED, RankingSampler, RankingTracker, hits, rank_of


def river_biased_mf(seed: int = 42) -> reco.BiasedMF:
    """river's documented MovieLens configuration of ``reco.BiasedMF``."""
    return reco.BiasedMF(
        n_factors=10,
        bias_optimizer=optim.SGD(0.025),
        latent_optimizer=optim.SGD(0.05),
        latent_initializer=optim.initializers.Normal(mu=0.0, sigma=0.1, seed=seed),
        l2_bias=0.0,
        l2_latent=0.0,
    )


class RiverRanker:
    """Ranks items for river's ``BiasedMF`` by scoring every item it has learnt.

    river keeps its parameters in dicts; copying them all into a matrix for every ranked
    event would cost far more than the ranking. The ranker instead catches up just
    before each ranking: the items learnt since the previous one get their rows
    refreshed and the users' rated items grow by the same events, so the per-event
    learning loop carries no bookkeeping at all.

    Parameters
    ----------
    model
        The river model, read only.
    k
        Length of the list judged.
    """

    def __init__(self, model: reco.BiasedMF, k: int = DEFAULT_K) -> None:
        self.model = model
        self.tracker = RankingTracker(k)
        self.rated: dict[str, set[str]] = {}
        self._rows: dict[str, int] = {}
        self._vectors = np.zeros((0, model.n_factors + 1))  # latent factors, then bias

    def learnt(self, users: Sequence[str], items: Sequence[str]) -> None:
        """Take in events the model has learnt since the previous call, in order."""
        model = self.model
        for user, item in zip(users, items, strict=True):
            self.rated.setdefault(user, set()).add(item)
        for item in dict.fromkeys(items):
            row = self._rows.get(item)
            if row is None:
                row = self._rows[item] = len(self._rows)
                if row >= len(self._vectors):
                    grown = np.zeros((max(64, 2 * len(self._vectors)), self._vectors.shape[1]))
                    grown[: len(self._vectors)] = self._vectors
                    self._vectors = grown
            self._vectors[row, :-1] = model.i_latents[item]
            self._vectors[row, -1] = model.i_biases[item]

    def rank(self, user: str, item: str) -> int:
        """Rank of ``item`` for ``user`` among the items the user has not rated yet;
        ``NOT_RANKED`` for a user or item the model has not learnt."""
        model, rows = self.model, self._rows
        target = rows.get(item, -1)
        if user not in model.u_latents or target < 0:
            return NOT_RANKED
        known = self._vectors[: len(rows)]
        scores = known[:, :-1] @ model.u_latents[user] + known[:, -1]
        scores += model.global_mean.get() + model.u_biases[user]
        excluded = [rows[i] for i in self.rated.get(user, ()) if i in rows]
        return rank_of(scores, target, excluded)


class RiverTrack:
    """Prequential river baseline: predict each event, then learn it.

    Parameters
    ----------
    clip
        Predictions are clipped to the rating range.
    seed
        Seed of river's latent initialiser.
    ranking
        Which events to rank for hit-rate@10 and NDCG@10 (``process`` then needs the
        events' timestamps); None ranks nothing. Pass the pipeline's sampler, so both
        rank the same events. The time spent ranking is left out of ``events_per_s``.
    """

    def __init__(
        self,
        clip: tuple[float, float] = (0.5, 5.0),
        seed: int = 42,
        ranking: RankingSampler | None = None,
    ) -> None:
        self.model = river_biased_mf(seed)
        self.clip = clip
        self.seconds = 0.0
        self.ranking_seconds = 0.0
        self.count = 0
        self._squared_error = 0.0
        self.sampler = ranking
        self.ranker = RiverRanker(self.model)
        #: (index in the stream, rank) of every ranked event, for rates over a segment.
        self.ranked: list[tuple[int, int]] = []

    def process(
        self,
        users: Sequence[str],
        items: Sequence[str],
        ratings: Sequence[float],
        timestamps: Sequence[float | None] | None = None,
    ) -> np.ndarray:
        """Predictions made before learning each event; updates the running RMSE and,
        with a sampler and ``timestamps``, ranks the sampled events before learning them."""
        ranked = self._sampled(users, items, ratings, timestamps)
        started = time.perf_counter()
        ranking, synced = 0.0, 0
        predictions = np.empty(len(users))
        low, high = self.clip
        model = self.model
        for position, (user, item, rating) in enumerate(zip(users, items, ratings, strict=True)):
            if ranked[position]:
                began = time.perf_counter()
                self.ranker.learnt(users[synced:position], items[synced:position])
                rank = self.ranker.rank(user, item)
                self.ranker.tracker.record("river", [rank])
                self.ranked.append((self.count + position, rank))
                synced = position
                ranking += time.perf_counter() - began
            predictions[position] = min(high, max(low, model.predict_one(user, item)))
            model.learn_one(user, item, float(rating))
        self.seconds += time.perf_counter() - started - ranking
        if self.sampler is not None:
            began = time.perf_counter()
            self.ranker.learnt(users[synced:], items[synced:])
            ranking += time.perf_counter() - began
        self.ranking_seconds += ranking
        self.count += len(users)
        self._squared_error += float(np.sum((np.asarray(ratings) - predictions) ** 2))
        return predictions

    def _sampled(
        self,
        users: Sequence[str],
        items: Sequence[str],
        ratings: Sequence[float],
        timestamps: Sequence[float | None] | None,
    ) -> np.ndarray:
        if self.sampler is None:
            return np.zeros(len(users), dtype=bool)
        if timestamps is None:
            raise ValueError("ranking the sampled events needs their timestamps")
        began = time.perf_counter()
        mask = self.sampler.mask(users, items, timestamps, [float(r) for r in ratings])
        self.ranking_seconds += time.perf_counter() - began
        return mask

    @property
    def rmse(self) -> float | None:
        return float(np.sqrt(self._squared_error / self.count)) if self.count else None

    def hit_rate_since(self, index: int) -> float | None:
        """Hit-rate@10 over the ranked events from stream position ``index`` on."""
        ranks = [rank for at, rank in self.ranked if at >= index]
        if not ranks:
            return None
        return float(hits(np.asarray(ranks, dtype=np.int64), self.ranker.tracker.k).mean())

    @property
    def hit_rate(self) -> float | None:
        """Hit-rate@10 over the ranked events, None when none was ranked."""
        return self.ranker.tracker.hit_rate("river")

    @property
    def ndcg(self) -> float | None:
        """NDCG@10 over the ranked events, None when none was ranked."""
        return self.ranker.tracker.ndcg("river")

    @property
    def events_per_s(self) -> float | None:
        return self.count / self.seconds if self.seconds else None
