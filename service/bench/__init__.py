"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures."""

from collections.abc import Callable
from typing import Any

from service.bench.ingest import run_ingest
from service.bench.prequential import run_prequential
from service.bench.sync import run_sync

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "prequential": run_prequential,
    "ingest": run_ingest,
    "sync": run_sync,
}

__all__ = ["BENCHMARKS"]
