"""MovieLens over a trace's two-hour shape, with sudden drifts at known times, and the
ladder of models a job can swap in.

Every dataset event stands for ``weight`` true arrivals (the trace's arrivals over the
horizon divided by the dataset's events), so a job over a window of n events trains on
n · weight samples. Training a model per job of every run would take hours, so the
models come from a ladder: the bootstrap model, then every ``step`` events a copy of
the rung before warm-started on those events plus an equal uniform sample of history
(a job's window, as the service forms it). A job whose window ends at event e swaps in
the rung of the last checkpoint at or before e; what differs between policies is when
that happens, which is what a trigger policy decides. The prequential error of every
rung on every event is computed once per seed, so a run is a lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchmarks.datasets import RatingStream, load_ratings
from benchmarks.scenarios import sudden
from benchmarks.traces import Trace
from functions.mf import BiasedMF

#: Drift onsets as fractions of the horizon (40 and 80 of 120 minutes).
DRIFT_FRACTIONS = (1 / 3, 2 / 3)
RATING_CLIP = (0.5, 5.0)
#: The service's default ``ITEM_BIAS_SUPPORT``, applied before ranking.
ITEM_BIAS_SUPPORT = 20.0


@dataclass(frozen=True)
class Ladder:
    """``errors[k, i]``: squared error of rung k on event i (rung 0: the bootstrap
    model, trained on the first ``bootstrap`` events; rung k ≥ 1 has seen the events
    before ``bootstrap + k · step``)."""

    errors: np.ndarray
    bootstrap: int
    step: int
    #: ``hits[k, j]``: whether rung k ranks the item of sampled liked event
    #: ``hit_events[j]`` in its user's top 10 (only for rungs that can serve it).
    hits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    hit_events: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    def rung(self, data_end: int) -> int:
        """The rung a job over the events before ``data_end`` swaps in."""
        return max(0, (data_end - self.bootstrap) // self.step)


@dataclass(frozen=True)
class DriftedStream:
    """The drifted ratings and the onsets (event indices) of its drifts."""

    stream: RatingStream
    onsets: tuple[int, ...]


def drifted_stream(stream: RatingStream, onsets: tuple[int, ...], seed: int) -> DriftedStream:
    """``stream`` with the drift benchmark's sudden scenario planted at each onset (a
    different 30 % of users inverts its taste each time)."""
    for number, onset in enumerate(onsets):
        stream = sudden(stream, onset, seed * 100 + number).stream
    return DriftedStream(stream, onsets)


def arrival_times(trace: Trace, n_events: int) -> np.ndarray:
    """Virtual second at which each of ``n_events`` evenly weighted events arrives."""
    total = trace.cumulative(trace.period_s)
    marks = (np.arange(n_events) + 0.5) * total / n_events
    return np.array([trace.time_until(m) for m in marks])


def build_ladder(
    stream: RatingStream,
    *,
    bootstrap: int,
    rungs: int,
    factors: int = 16,
    epochs: int = 3,
    seed: int = 0,
    hit_samples: int = 2_000,
) -> Ladder:
    """Train the ladder over ``stream``, every rung's error on every event and its
    top-10 hits on ``hit_samples`` liked events."""
    n = len(stream)
    step = max(1, (n - bootstrap) // rungs)
    rng = np.random.default_rng(seed)
    users, items, ratings = np.array(stream.user_ids), np.array(stream.item_ids), stream.ratings
    model = BiasedMF(factors=factors, seed=seed)
    model.fit(
        stream.user_ids[:bootstrap], stream.item_ids[:bootstrap], ratings[:bootstrap], 2 * epochs
    )
    models = [model.copy()]
    for start in range(bootstrap, n - step + 1, step):
        history = rng.integers(0, start, size=min(step, start))
        rows = np.r_[np.arange(start, start + step), history]
        model.fit(users[rows].tolist(), items[rows].tolist(), ratings[rows], epochs=epochs)
        models.append(model.copy())
    u, i = model.encode_users(list(users)), model.encode_items(list(items))
    errors = np.empty((len(models), n), dtype=np.float32)
    for k, rung in enumerate(models):
        known_u = np.where(u < rung.n_users, u, -1)
        known_i = np.where(i < rung.n_items, i, -1)
        errors[k] = (rung.predict_encoded(known_u, known_i, RATING_CLIP) - ratings) ** 2
    hit_events = _liked_sample(ratings, bootstrap, hit_samples, seed)
    hits = np.zeros((len(models), hit_events.size), dtype=bool)
    for k, rung in enumerate(models):
        seen = bootstrap + k * step
        servable = hit_events >= seen  # a later rung never serves earlier events
        support = np.bincount(i[:seen], minlength=rung.n_items)[: rung.n_items]
        chosen = hit_events[servable]
        hits[k, servable] = top_k_hits(rung, u[chosen], i[chosen], support)
    return Ladder(errors, bootstrap, step, hits, hit_events)


def _liked_sample(ratings: np.ndarray, bootstrap: int, size: int, seed: int) -> np.ndarray:
    """Up to ``size`` events after the bootstrap rated 4 stars or more, in order."""
    liked = np.flatnonzero((ratings >= 4.0) & (np.arange(ratings.size) >= bootstrap))
    rng = np.random.default_rng([seed, 10])  # apart from the ladder's own draws
    return np.sort(rng.choice(liked, size=min(size, liked.size), replace=False))


def top_k_hits(
    model: BiasedMF,
    users: np.ndarray,
    items: np.ndarray,
    support: np.ndarray,
    k: int = 10,
    item_support: float = ITEM_BIAS_SUPPORT,
) -> np.ndarray:
    """Whether each (user row, item row) pair's item is in the user's top ``k`` by
    predicted rating over the model's items, each item's bias and factors damped by
    n / (n + ``item_support``) with n its ratings so far (``support``), as a served
    version is (``ITEM_BIAS_SUPPORT``): undamped, items rated once at 5 stars fill every
    list. A user the model has not seen gets the items by damped bias alone (the
    service's popular items for an unknown user); an item it has not seen is a miss.
    Rated items are not excluded.
    """
    known = (items >= 0) & (items < model.n_items)
    out = np.zeros(users.size, dtype=bool)
    if not known.any():
        return out
    damp = support / (support + item_support)
    factors = model.item_factors * damp[:, None]
    rows = users[known]
    vectors = np.where(
        ((rows >= 0) & (rows < model.n_users))[:, None],
        model.user_factors[np.clip(rows, 0, model.n_users - 1)],
        0.0,
    )
    scores = vectors @ factors.T + model.item_bias * damp
    target = scores[np.arange(scores.shape[0]), items[known]]
    out[known] = (scores > target[:, None]).sum(axis=1) < k
    return out


def movielens(limit: int | None = None) -> RatingStream:
    from benchmarks.datasets import MOVIELENS_SMALL

    return load_ratings(MOVIELENS_SMALL, limit=limit)
