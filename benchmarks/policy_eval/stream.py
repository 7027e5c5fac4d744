"""The stream a scenario replays, laid over a trace's shape, with sudden drifts at
known times.

Two sources (``STREAMS``):

* ``movielens``: MovieLens (or, where no copy is found, the stream generated like it)
  spread over the horizon, every event standing for ``weight`` true arrivals (the
  trace's arrivals over the horizon divided by the dataset's events), so a job over a
  window of n events trains on n · weight samples; the drift benchmark's sudden
  scenario is planted at each onset (a different 30 % of users each time).
* ``generated``: the stream generator (:mod:`benchmarks.streams`) drawing exactly the
  trace's arrivals over the horizon, one event per true arrival (weight 1), so a
  detector sees every error the service would; 30 % of users invert their taste at
  the first onset and a further 30 % at the second. ``limit`` caps the events: above
  it, each event stands for count / limit arrivals, as in ``movielens``.

Either way event i arrives when the trace makes i + ½ of the events due.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.datasets import RatingStream
from benchmarks.policy_eval.ladder import CodedStream
from benchmarks.scenarios import sudden
from benchmarks.traces import Trace

#: Drift onsets as fractions of the horizon (40 and 80 of 120 minutes).
DRIFT_FRACTIONS = (1 / 3, 2 / 3)


@dataclass(frozen=True)
class LaidStream:
    """A drifted stream over a trace: the events (n), when each arrives (seconds, n),
    the true arrivals each stands for, and the drifts' onsets (event indices)."""

    stream: CodedStream
    times: np.ndarray
    weight: float
    onsets: tuple[int, ...]


#: A stream source: (trace over the horizon, seed, onsets in seconds) → the laid stream.
StreamSource = Callable[[Trace, int, tuple[float, ...]], LaidStream]


def arrival_times(trace: Trace, n_events: int) -> np.ndarray:
    """Virtual second at which each of ``n_events`` evenly weighted events arrives over
    the trace's period (at speed 1): the inverse of its cumulative arrivals.

    >>> from benchmarks.traces import make_trace
    >>> arrival_times(make_trace("constant", rate=2.0, period_s=3), 3).tolist()
    [0.5, 1.5, 2.5]
    """
    total = trace.cumulative(trace.period_s)
    marks = (np.arange(n_events) + 0.5) * (total / n_events)
    due = np.concatenate([[0.0], np.cumsum(trace.rates)])
    return np.interp(marks, due, np.arange(due.size, dtype=float))


def true_arrivals(trace: Trace) -> int:
    """The trace's true arrivals over its period (at speed 1)."""
    return int(round(trace.cumulative(trace.period_s)))


def onsets_at(times: np.ndarray, onsets_s: tuple[float, ...]) -> tuple[int, ...]:
    """The first event arriving at or after each onset."""
    return tuple(int(np.searchsorted(times, t)) for t in onsets_s)


def code(stream: RatingStream) -> CodedStream:
    """``stream``'s ids as integer codes."""
    users = np.unique(np.asarray(stream.user_ids), return_inverse=True)[1]
    items = np.unique(np.asarray(stream.item_ids), return_inverse=True)[1]
    return CodedStream(users.astype(np.int64), items.astype(np.int64), stream.ratings)


def drifted_stream(stream: RatingStream, onsets: tuple[int, ...], seed: int) -> RatingStream:
    """``stream`` with the drift benchmark's sudden scenario planted at each onset (a
    different 30 % of users inverts its taste each time)."""
    for number, onset in enumerate(onsets):
        stream = sudden(stream, onset, seed * 100 + number).stream
    return stream


def spread(stream: RatingStream) -> StreamSource:
    """The ``movielens`` source over ``stream``: see the module docstring."""

    def lay(trace: Trace, seed: int, onsets_s: tuple[float, ...]) -> LaidStream:
        times = arrival_times(trace, len(stream))
        onsets = onsets_at(times, onsets_s)
        weight = trace.cumulative(trace.period_s) / len(stream)
        return LaidStream(code(drifted_stream(stream, onsets, seed)), times, weight, onsets)

    return lay


def generated(limit: int | None = None) -> StreamSource:
    """The ``generated`` source, at most ``limit`` events: see the module docstring."""

    def lay(trace: Trace, seed: int, onsets_s: tuple[float, ...]) -> LaidStream:
        count = true_arrivals(trace)
        events = count if limit is None else min(limit, count)
        times = arrival_times(trace, events)
        onsets = onsets_at(times, onsets_s)
        return LaidStream(generate(events, onsets, seed), times, count / events, onsets)

    return lay


def generate(events: int, onsets: tuple[int, ...], seed: int) -> CodedStream:
    """``events`` of the generator with 30 % of users turning at the first onset and a
    further 30 % at each later one, as codes (user serials, item indices); its arrival
    times are not used."""
    from benchmarks.streams import GeneratorConfig, StreamGenerator

    first, *later = onsets
    config = GeneratorConfig(
        events=events,
        seed=seed,
        poisson=False,
        drift="sudden",
        drift_at=min(1.0, (first + 0.5) / events),
        drift_options={"then": tuple(later)},
    )
    users, items, ratings = [], [], []
    for chunk in StreamGenerator(config):
        users.append(chunk.users)
        items.append(chunk.items)
        ratings.append(chunk.ratings)
    return CodedStream(
        np.concatenate(users).astype(np.int64),
        np.concatenate(items).astype(np.int64),
        np.concatenate(ratings).astype(np.float64),
    )


def movielens(limit: int | None = None) -> RatingStream:
    """MovieLens where one is found, else the stream generated like it."""
    from benchmarks.datasets.registry import open_ratings

    return open_ratings(limit=limit)[0]


def _movielens_source(dataset: Path | None, limit: int | None) -> StreamSource:
    from benchmarks.datasets import load_ratings

    return spread(movielens(limit) if dataset is None else load_ratings(dataset, limit=limit))


def _generated_source(dataset: Path | None, limit: int | None) -> StreamSource:
    if dataset is not None:
        raise ValueError("the generated stream reads no dataset; drop --dataset")
    return generated(limit)


#: Stream sources by name, each built from the ``--dataset`` and ``--limit`` given.
STREAMS: dict[str, Callable[[Path | None, int | None], StreamSource]] = {
    "movielens": _movielens_source,
    "generated": _generated_source,
}
