"""A rating-stream generator fitted to real data, for benchmarks and the demo.

Users and items with latent factors and biases drawn from distributions fitted to
MovieLens (``movielens_fit.json``: parameters, no data), Zipf-like item popularity,
heavy-tailed user activity in sessions, arrivals at the rate of a trace, and planted
drifts with their ground truth. ``driftline generate`` writes one to a file, Kafka or
``POST /ingest``; ``docs/generator.md`` describes the model and its fit.

Modules: ``params`` (the fit's parameters), ``fit`` (fitting them), ``population``
(catalogue and users), ``sessions``, ``arrivals``, ``drifts``, ``generator`` (the
stream), ``writer`` (its sinks), ``stats`` and ``compare`` (against the real data).
"""

from benchmarks.streams.drifts import DRIFTS, GroundTruth, make_drift
from benchmarks.streams.generator import (
    EventChunk,
    GeneratorConfig,
    StreamGenerator,
    generate_stream,
)
from benchmarks.streams.params import DEFAULT_FIT, StreamFit, load_fit

__all__ = [
    "DEFAULT_FIT",
    "DRIFTS",
    "EventChunk",
    "GeneratorConfig",
    "GroundTruth",
    "StreamFit",
    "StreamGenerator",
    "generate_stream",
    "load_fit",
    "make_drift",
]
