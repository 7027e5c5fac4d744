"""The ``lambda`` runtime: workers invoked as a deployed AWS Lambda function.

Each invocation is a synchronous ``Invoke`` with the worker's event as its payload (the
same event the ``local`` runtime hands to the same handler). Lambda's own report (the
``REPORT`` line of the log tail) gives the billed duration, the memory used and whether
the invocation was a cold start (an ``Init Duration``), so the record is what AWS bills.

Memory is a function setting on Lambda, not a per-call one: an invocation asking for a
different size first updates the function's configuration and waits until it is active.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from functions.pricing import LambdaPrices, lambda_prices
from functions.runtimes.base import (
    ERROR,
    OK,
    OUT_OF_MEMORY,
    TIMEOUT,
    InvocationRecord,
    Runtime,
    register_runtime,
)

_REPORT = re.compile(
    r"REPORT RequestId: (?P<id>\S+)\s+Duration: (?P<duration>[\d.]+) ms\s+"
    r"Billed Duration: (?P<billed>\d+) ms\s+Memory Size: (?P<memory>\d+) MB\s+"
    r"Max Memory Used: (?P<used>\d+) MB(?:\s+Init Duration: (?P<init>[\d.]+) ms)?"
)


def parse_report(log_tail: str) -> dict[str, Any] | None:
    """The figures of Lambda's ``REPORT`` line, or None if the tail has none.

    >>> parse_report("REPORT RequestId: r1\\tDuration: 12.5 ms\\tBilled Duration: 13 ms\\t"
    ...              "Memory Size: 1024 MB\\tMax Memory Used: 80 MB\\tInit Duration: 210.0 ms")
    {'request_id': 'r1', 'duration_ms': 12.5, 'billed_ms': 13, 'memory_mb': 1024, 'max_memory_mb': 80, 'init_ms': 210.0}
    """  # noqa: E501
    match = _REPORT.search(log_tail)
    if match is None:
        return None
    return {
        "request_id": match["id"],
        "duration_ms": float(match["duration"]),
        "billed_ms": int(match["billed"]),
        "memory_mb": int(match["memory"]),
        "max_memory_mb": int(match["used"]),
        "init_ms": float(match["init"]) if match["init"] else None,
    }


def _failure_status(error: dict[str, Any] | None, log_tail: str) -> str:
    text = json.dumps(error or {}) + log_tail
    if "Task timed out" in text:
        return TIMEOUT
    if "Runtime.OutOfMemory" in text or "signal: killed" in text or "MemoryError" in text:
        return OUT_OF_MEMORY
    return ERROR


class LambdaRuntime(Runtime):
    """Invokes ``function_name`` on AWS Lambda; see the module docstring.

    Parameters
    ----------
    function_name
        The deployed worker (``driftline deploy-function``).
    client
        A boto3 Lambda client (default: one from the environment's configuration).
    concurrency
        Invocations in flight at once from this coordinator.
    """

    name = "lambda"

    def __init__(
        self,
        function_name: str,
        client: Any = None,
        concurrency: int = 64,
        prices: LambdaPrices | None = None,
    ) -> None:
        if client is None:
            import boto3

            client = boto3.client("lambda")
        self.function_name = function_name
        self.client = client
        self.prices = prices or lambda_prices()
        self.records: list[InvocationRecord] = []
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="lambda-runtime")
        self._memory_lock = threading.Lock()
        self._memory_mb: int | None = None

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        self.prices.check_memory(memory_mb)
        submitted = time.perf_counter()
        return self._pool.submit(self._invoke, payload, memory_mb, dict(labels), submitted)

    def _invoke(
        self, payload: dict, memory_mb: int, labels: dict, submitted: float
    ) -> InvocationRecord:
        record = InvocationRecord("", memory_mb=memory_mb, labels=labels)
        record.queued_s = time.perf_counter() - submitted
        try:
            self._ensure_memory(memory_mb)
            started = time.perf_counter()
            response = self.client.invoke(
                FunctionName=self.function_name,
                InvocationType="RequestResponse",
                LogType="Tail",
                Payload=json.dumps(payload).encode(),
            )
            record.duration_s = time.perf_counter() - started
        except Exception as exc:  # an API failure fails this invocation, not the job
            record.status, record.error = ERROR, f"{type(exc).__name__}: {exc}"
            return self._keep(record)
        self._read_response(record, response)
        return self._keep(record)

    def _read_response(self, record: InvocationRecord, response: dict[str, Any]) -> None:
        log_tail = base64.b64decode(response.get("LogResult", "") or b"").decode(errors="replace")
        body = response["Payload"].read()
        result = json.loads(body) if body else None
        report = parse_report(log_tail)
        if report is not None:
            record.request_id = report["request_id"]
            record.duration_s = report["duration_ms"] / 1000
            record.billed_ms = report["billed_ms"]
            record.peak_rss_mb = float(report["max_memory_mb"])
            record.cold_start = report["init_ms"] is not None
            record.init_duration_s = (report["init_ms"] or 0.0) / 1000.0
        else:
            record.billed_ms = self.prices.billed_ms(record.duration_s * 1000)
        record.cost_usd = self.prices.invocation_cost(record.billed_ms, record.memory_mb)
        if "FunctionError" in response:
            record.status = _failure_status(result, log_tail)
            record.error = (result or {}).get("errorMessage") or response["FunctionError"]
        else:
            record.status, record.result = OK, result

    def _ensure_memory(self, memory_mb: int) -> None:
        """Set the function's memory to ``memory_mb`` (once per change) and wait for it."""
        with self._memory_lock:
            if self._memory_mb is None:
                configuration = self.client.get_function_configuration(
                    FunctionName=self.function_name
                )
                self._memory_mb = int(configuration["MemorySize"])
            if self._memory_mb == memory_mb:
                return
            self.client.update_function_configuration(
                FunctionName=self.function_name, MemorySize=memory_mb
            )
            self.client.get_waiter("function_updated").wait(FunctionName=self.function_name)
            self._memory_mb = memory_mb

    def _keep(self, record: InvocationRecord) -> InvocationRecord:
        self.records.append(record)
        return record

    def close(self) -> None:
        self._pool.shutdown(wait=True)


register_runtime("lambda", LambdaRuntime)
