"""What every function runtime offers: invoke a worker, get back a billed record.

Runtimes (``local``, ``lambda``, ...) join through ``RUNTIMES`` by name, so the
coordinator never branches on which one runs its workers.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field
from typing import Any


class WorkerContext:
    """The part of Lambda's context object a worker uses, for a worker run against a
    wall-clock ``deadline`` (``time.time()`` seconds): the thread, local and Ray runtimes."""

    function_name = "driftline-worker"

    def __init__(self, request_id: str, memory_mb: int, deadline: float) -> None:
        self.aws_request_id = request_id
        self.memory_limit_in_mb = memory_mb
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.time()) * 1000))


#: Outcomes an invocation can have, as Lambda reports them.
OK, ERROR, TIMEOUT, OUT_OF_MEMORY = "ok", "error", "timeout", "out_of_memory"


@dataclass
class InvocationRecord:
    """One invocation as the job record keeps it: what ran, how long, what it cost."""

    request_id: str
    status: str = OK
    cold_start: bool = False
    memory_mb: int = 0
    queued_s: float = 0.0
    #: A cold start's initialisation (Lambda's ``Init Duration``), billed since 2025.
    init_duration_s: float = 0.0
    duration_s: float = 0.0
    billed_ms: int = 0
    cost_usd: float = 0.0
    peak_rss_mb: float = 0.0
    result: dict[str, Any] | None = None
    error: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Runtime(ABC):
    """Runs worker invocations with a memory size and a time limit each."""

    name: str

    @abstractmethod
    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float, **labels: Any
    ) -> Future[InvocationRecord]:
        """Start one invocation; the future resolves to its record, never raises."""

    def wait_any(self, futures: Collection[Future[InvocationRecord]]) -> None:
        """Return once at least one of `futures` (of this runtime) is done."""
        wait(futures, return_when=FIRST_COMPLETED)

    @abstractmethod
    def close(self) -> None:
        """Release workers; pending invocations finish first."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RUNTIMES: dict[str, Callable[..., Runtime]] = {}


def register_runtime(name: str, factory: Callable[..., Runtime]) -> None:
    RUNTIMES[name] = factory


def open_runtime(name: str, **options: Any) -> Runtime:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; choose from {sorted(RUNTIMES)}")
    return RUNTIMES[name](**options)
