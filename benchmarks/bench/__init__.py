"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures.

``BENCHMARKS`` names each benchmark's module and function; :func:`benchmark` imports
the one asked for. Importing them all took about six seconds (torch, gpytorch, the
broker, the cluster's tooling), paid by every ``driftline bench`` and ``demo`` run.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

#: Benchmark name -> ``module:function`` returning its figures.
BENCHMARKS: dict[str, str] = {
    "prequential": "benchmarks.bench.prequential:run_prequential",
    "stages": "benchmarks.bench.stages:run_stages",
    "store": "benchmarks.bench.store:run_store",
    "ingest": "benchmarks.bench.ingest:run_ingest",
    "sync": "benchmarks.bench.sync:run_sync",
    "memory": "benchmarks.bench.memory:run_memory",
    "configurator": "benchmarks.bench.configurator:run_configurator",
    "drift": "benchmarks.bench.drift:run_drift",
    "serve": "benchmarks.bench.serve:run_serve",
    "policies": "benchmarks.bench.policies:run_policies",
    "cluster": "benchmarks.bench.cluster:run_cluster",
    "generator": "benchmarks.streams.compare:run_generator",
    "soak": "benchmarks.bench.soak:run_soak",
    "gpu": "benchmarks.bench.gpu:run_gpu",
    "archive": "benchmarks.bench.archive:run_archive",
}


def benchmark(name: str) -> Callable[..., dict[str, Any]]:
    """The function that runs benchmark ``name`` (a key of ``BENCHMARKS``)."""
    module, function = BENCHMARKS[name].split(":")
    run: Callable[..., dict[str, Any]] = getattr(import_module(module), function)
    return run


__all__ = ["BENCHMARKS", "benchmark"]
