"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures."""

from collections.abc import Callable
from typing import Any

from benchmarks.bench.archive import run_archive
from benchmarks.bench.cluster import run_cluster
from benchmarks.bench.configurator import run_configurator
from benchmarks.bench.drift import run_drift
from benchmarks.bench.gpu import run_gpu
from benchmarks.bench.ingest import run_ingest
from benchmarks.bench.memory import run_memory
from benchmarks.bench.policies import run_policies
from benchmarks.bench.prequential import run_prequential
from benchmarks.bench.serve import run_serve
from benchmarks.bench.soak import run_soak
from benchmarks.bench.stages import run_stages
from benchmarks.bench.store import run_store
from benchmarks.bench.sync import run_sync
from benchmarks.streams.compare import run_generator

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "prequential": run_prequential,
    "stages": run_stages,
    "store": run_store,
    "ingest": run_ingest,
    "sync": run_sync,
    "memory": run_memory,
    "configurator": run_configurator,
    "drift": run_drift,
    "serve": run_serve,
    "policies": run_policies,
    "cluster": run_cluster,
    "generator": run_generator,
    "soak": run_soak,
    "gpu": run_gpu,
    "archive": run_archive,
}

__all__ = ["BENCHMARKS"]
