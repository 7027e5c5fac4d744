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

from dataclasses import dataclass

import numpy as np

from benchmarks.datasets import RatingStream, load_ratings
from benchmarks.scenarios import sudden
from benchmarks.traces import Trace
from functions.mf import BiasedMF

#: Drift onsets as fractions of the horizon (40 and 80 of 120 minutes).
DRIFT_FRACTIONS = (1 / 3, 2 / 3)
RATING_CLIP = (0.5, 5.0)


@dataclass(frozen=True)
class Ladder:
    """``errors[k, i]``: squared error of rung k on event i (rung 0: the bootstrap
    model, trained on the first ``bootstrap`` events; rung k ≥ 1 has seen the events
    before ``bootstrap + k · step``)."""

    errors: np.ndarray
    bootstrap: int
    step: int

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
) -> Ladder:
    """Train the ladder over ``stream`` and every rung's error on every event."""
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
    return Ladder(errors, bootstrap, step)


def movielens(limit: int | None = None) -> RatingStream:
    from benchmarks.datasets import MOVIELENS_SMALL

    return load_ratings(MOVIELENS_SMALL, limit=limit)
