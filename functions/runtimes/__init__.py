"""Function runtimes: where workers run (``local``, ``lambda``, ``gpu``, ``ray``, ``sim``,
``thread``)."""

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
from functions.runtimes.ray import RayRuntime
from functions.runtimes.sim import PerformanceModel, SimRuntime
from functions.runtimes.thread import ThreadRuntime

__all__ = [
    "ERROR",
    "OK",
    "OUT_OF_MEMORY",
    "PerformanceModel",
    "RUNTIMES",
    "RayRuntime",
    "TIMEOUT",
    "InvocationRecord",
    "LambdaRuntime",
    "LocalRuntime",
    "Runtime",
    "SimRuntime",
    "ThreadRuntime",
    "open_runtime",
    "parse_report",
    "register_runtime",
]
