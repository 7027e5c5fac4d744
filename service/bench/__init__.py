"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures."""

from collections.abc import Callable
from typing import Any

from service.bench.ingest import run_ingest
from service.bench.prequential import run_prequential

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "prequential": run_prequential,
    "ingest": run_ingest,
}

__all__ = ["BENCHMARKS"]
