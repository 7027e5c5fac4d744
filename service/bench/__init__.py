"""Benchmarks behind ``driftline bench NAME``; each returns a dict of measured figures."""

from collections.abc import Callable
from typing import Any

from service.bench.prequential import run_prequential

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {"prequential": run_prequential}

__all__ = ["BENCHMARKS"]
