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

__all__ = [
    "ERROR",
    "OK",
    "OUT_OF_MEMORY",
    "RUNTIMES",
    "TIMEOUT",
    "InvocationRecord",
    "LambdaRuntime",
    "LocalRuntime",
    "Runtime",
    "open_runtime",
    "parse_report",
    "register_runtime",
]
