"""The ``thread`` runtime: the worker handler on a thread pool of this process.

No containers, no cold starts and no enforced memory limit: what it keeps from Lambda is
the handler's signature and event, a deadline the handler can read from its context,
and the bill (duration × memory, per Lambda's prices), so the coordinator runs the same
code path as on ``local`` or ``lambda`` at the cost of a function call. Unit tests and
small deployments use it; ``local`` is the one that behaves like Lambda.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from functions.pricing import LambdaPrices, lambda_prices
from functions.runtimes.base import (
    ERROR,
    OK,
    TIMEOUT,
    InvocationRecord,
    Runtime,
    WorkerContext,
    register_runtime,
)

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]

#: How far past its deadline an injected straggler's sleep may run: enough that the
#: invocation is seen to overrun and is reported as a timeout.
_PAST_DEADLINE_S = 0.01


class ThreadRuntime(Runtime):
    """Runs ``handler(event, context)`` on up to ``concurrency`` threads.

    A handler that returns after its deadline is reported as a timeout (its result
    dropped), as Lambda would have stopped it; it cannot be stopped earlier in-process.

    Parameters
    ----------
    slowdown
        Called once per invocation; the factor by which that invocation runs slower
        (1.0: normal speed), as with the ``local`` runtime: injected stragglers.
    """

    name = "thread"

    def __init__(
        self,
        handler: Handler | None = None,
        concurrency: int = 4,
        prices: LambdaPrices | None = None,
        slowdown: Callable[[], float] | None = None,
    ) -> None:
        if handler is None:
            from functions.handler import handler as worker

            handler = worker
        self.handler = handler
        self.prices = prices or lambda_prices()
        self.slowdown = slowdown
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="worker")
        self._lock = threading.Lock()
        self.records: list[InvocationRecord] = []

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        self.prices.check_memory(memory_mb)
        if not 0 < timeout_s <= self.prices.timeout_s_max:
            raise ValueError(f"timeout_s must be in (0, {self.prices.timeout_s_max}]")
        record = InvocationRecord(uuid.uuid4().hex, memory_mb=memory_mb, labels=dict(labels))
        record.labels["slowdown"] = self.slowdown() if self.slowdown is not None else 1.0
        return self._pool.submit(self._invoke, record, payload, timeout_s, time.perf_counter())

    def _invoke(
        self, record: InvocationRecord, payload: dict[str, Any], timeout_s: float, submitted: float
    ) -> InvocationRecord:
        record.queued_s = time.perf_counter() - submitted
        started = time.perf_counter()
        context = WorkerContext(record.request_id, record.memory_mb, time.time() + timeout_s)
        try:
            result = self.handler(payload, context)
            factor = float(record.labels["slowdown"])
            if factor > 1.0:  # an injected straggler: a slow instance, billed as such
                extra = (factor - 1.0) * (time.perf_counter() - started)
                limit = started + timeout_s + _PAST_DEADLINE_S - time.perf_counter()
                time.sleep(max(0.0, min(extra, limit)))  # stopped at its deadline
            record.status, record.result = OK, result
        except Exception as exc:  # the handler's failure is the invocation's outcome
            record.status = ERROR
            record.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        record.duration_s = time.perf_counter() - started
        if record.duration_s > timeout_s:
            record.status, record.result = TIMEOUT, None
            record.error = f"ran {record.duration_s:.3f} s, past its {timeout_s} s limit"
        record.billed_ms = self.prices.billed_ms(record.duration_s * 1000)
        record.cost_usd = self.prices.invocation_cost(record.duration_s * 1000, record.memory_mb)
        with self._lock:
            self.records.append(record)
        return record

    def close(self) -> None:
        self._pool.shutdown(wait=True)


register_runtime("thread", ThreadRuntime)
