"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures.

``BENCHMARKS`` maps each name to its function, importing a benchmark's module only
when it is looked up: importing them all (torch, gpytorch, the broker, the cluster's
tooling) costs seconds that every ``driftline bench`` and ``demo`` run would pay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib import import_module
from typing import Any

Benchmark = Callable[..., dict[str, Any]]


class _Registry(Mapping[str, Benchmark]):
    """Benchmark name -> its function, from ``module:function`` paths."""

    def __init__(self, paths: dict[str, str]) -> None:
        self._paths = paths

    def __getitem__(self, name: str) -> Benchmark:
        module, function = self._paths[name].split(":")
        run: Benchmark = getattr(import_module(module), function)
        return run

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


BENCHMARKS: Mapping[str, Benchmark] = _Registry(
    {
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
)

__all__ = ["BENCHMARKS"]
