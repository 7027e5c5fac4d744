"""Function runtimes: where workers run (``local`` now; Lambda, GPU, simulation next)."""

from functions.runtimes.aws import LambdaRuntime, parse_report
from functions.runtimes.base import (
    ERROR,
    OK,
    OUT_OF_MEMORY,
    RUNTIMES,
    TIMEOUT,
    InvocationRecord,
    Runtime,
    open_runtime,
    register_runtime,
)
from functions.runtimes.local import LocalRuntime
from functions.runtimes.sim import PerformanceModel, SimRuntime

__all__ = [
    "ERROR",
    "OK",
    "OUT_OF_MEMORY",
    "PerformanceModel",
    "RUNTIMES",
    "TIMEOUT",
    "InvocationRecord",
    "LambdaRuntime",
    "LocalRuntime",
    "Runtime",
    "SimRuntime",
    "open_runtime",
    "parse_report",
    "register_runtime",
]
