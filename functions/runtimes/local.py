"""The ``local`` runtime: worker processes that behave and bill like AWS Lambda.

* Containers are processes (started with ``spawn``, like a fresh sandbox) that stay warm
  between invocations of the same memory size; a new one is a cold start, counted.
* At most ``concurrency`` invocations run at once (default: the number of cores); the
  rest queue, and queued time is not billed, as on Lambda.
* The memory size is enforced: a container whose resident memory passes it is killed
  and the invocation fails with ``out_of_memory``, as Lambda's does.
* The time limit is enforced (default and maximum 900 s): the container is killed and
  the invocation fails with ``timeout``.
* Containers run at a lower CPU priority (``niceness``, default 10): on a machine that
  also serves, a retrain's workers take the cores only when requests and ingestion
  leave them idle, as they would on Lambda, where they run on other machines.
* The meter bills exactly as Lambda: GB-seconds per started millisecond of the
  duration plus, for a cold start, the container's initialisation (``init_duration_s``,
  Lambda's ``Init Duration``, billed since August 2025), plus the request price, from
  ``functions/prices.json``. Provisioned containers (:meth:`LocalRuntime.provision`)
  start warm.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from functions.pricing import Meter, lambda_prices
from functions.runtimes.base import (
    ERROR,
    OK,
    OUT_OF_MEMORY,
    TIMEOUT,
    InvocationRecord,
    Runtime,
    WorkerContext,
    register_runtime,
)

DEFAULT_HANDLER = "functions.handler:handler"
_POLL_S = 0.005


#: How much lower than the service's the containers' CPU priority is (``os.nice``).
DEFAULT_NICENESS = 10


def _container_main(conn: Connection, handler_path: str, niceness: int = 0) -> None:
    """A container's loop: import the handler once (the cold start), then serve."""
    if niceness and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(niceness)
    module_name, _, attribute = handler_path.partition(":")
    handler: Callable[[dict, Any], dict] = getattr(importlib.import_module(module_name), attribute)
    conn.send(("ready", None))
    while True:
        message = conn.recv()
        if message is None:
            return
        request_id, payload, memory_mb, deadline, slowdown = message
        try:
            started = time.perf_counter()
            result = handler(payload, WorkerContext(request_id, memory_mb, deadline))
            if slowdown > 1.0:  # an injected straggler: a slow instance, billed as such
                time.sleep((slowdown - 1.0) * (time.perf_counter() - started))
            conn.send((OK, result))
        except MemoryError as exc:
            conn.send((OUT_OF_MEMORY, f"MemoryError: {exc}"))
        except Exception as exc:  # the invocation fails, the container lives on
            conn.send((ERROR, f"{type(exc).__name__}: {exc}"))


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class _Container:
    def __init__(self, handler_path: str, memory_mb: int, niceness: int = 0) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.memory_mb = memory_mb
        self.process = context.Process(
            target=_container_main, args=(child, handler_path, niceness), daemon=True
        )
        self.process.start()
        child.close()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.conn.poll(timeout_s):
            raise TimeoutError("container did not start in time")
        self.conn.recv()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=5)
        self.kill()


class LocalRuntime(Runtime):
    """Lambda's behaviour on this machine's cores; see the module docstring.

    Parameters
    ----------
    concurrency
        Invocations running at once (Lambda's reserved concurrency).
    handler
        ``module:function`` each container imports.
    prices
        The meter; Lambda's x86 prices by default (a GPU type's for the torch workers of
        a GPU kind: :class:`~functions.pricing.GpuMeter`).
    slowdown
        Straggler injection for experiments: called once per invocation, returns the
        factor by which that invocation runs slower (1.0: normal speed).
    niceness
        How much the containers lower their CPU priority (0: the service's own).
    """

    name = "local"

    def __init__(
        self,
        concurrency: int | None = None,
        handler: str = DEFAULT_HANDLER,
        prices: Meter | None = None,
        slowdown: Callable[[], float] | None = None,
        niceness: int = DEFAULT_NICENESS,
    ) -> None:
        self.concurrency = concurrency or os.cpu_count() or 1
        self.niceness = niceness
        self.slowdown = slowdown
        self.handler = handler
        self.prices: Meter = prices or lambda_prices()
        self.records: list[InvocationRecord] = []
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="local-runtime")
        self._warm: dict[int, queue.SimpleQueue[_Container]] = {}
        self._lock = threading.Lock()
        self._all: list[_Container] = []

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        self.prices.check_memory(memory_mb)
        if not 0 < timeout_s <= self.prices.timeout_s_max:
            raise ValueError(f"timeout_s must be in (0, {self.prices.timeout_s_max}]")
        record = InvocationRecord(uuid.uuid4().hex, memory_mb=memory_mb, labels=dict(labels))
        submitted = time.perf_counter()
        return self._pool.submit(self._invoke, record, payload, timeout_s, submitted)

    def _invoke(
        self, record: InvocationRecord, payload: dict, timeout_s: float, submitted: float
    ) -> InvocationRecord:
        record.queued_s = time.perf_counter() - submitted
        initialising = time.perf_counter()
        try:
            container, record.cold_start = self._container(record.memory_mb)
        except (OSError, EOFError, TimeoutError) as exc:  # the sandbox never came up
            record.status, record.error = ERROR, f"container failed to start: {exc!r}"
            with self._lock:
                self.records.append(record)
            return record
        if record.cold_start:
            record.init_duration_s = time.perf_counter() - initialising
        started = time.perf_counter()
        deadline = time.time() + timeout_s
        factor = self.slowdown() if self.slowdown is not None else 1.0
        record.labels["slowdown"] = factor
        message = (record.request_id, payload, record.memory_mb, deadline, factor)
        container.conn.send(message)
        status, detail, peak = self._wait(container, record.memory_mb, started + timeout_s)
        record.duration_s = time.perf_counter() - started
        record.peak_rss_mb = peak
        record.status = status
        if status == OK:
            record.result = detail
            self._warm[record.memory_mb].put(container)
        else:
            record.error = detail
            if status == ERROR:
                self._warm[record.memory_mb].put(container)
            else:
                container.kill()  # Lambda discards a container that ran out of time or memory
        billed_s = record.duration_s + record.init_duration_s
        record.billed_ms = self.prices.billed_ms(billed_s * 1000)
        record.cost_usd = self.prices.invocation_cost(billed_s * 1000, record.memory_mb)
        with self._lock:
            self.records.append(record)
        return record

    def _wait(
        self, container: _Container, memory_mb: int, give_up_at: float
    ) -> tuple[str, Any, float]:
        peak = 0.0
        while not container.conn.poll(_POLL_S):
            peak = max(peak, _rss_mb(container.process.pid or 0))
            if peak > memory_mb:
                return OUT_OF_MEMORY, f"used {peak:.0f} MB of {memory_mb} MB", peak
            if time.perf_counter() > give_up_at:
                return TIMEOUT, "task timed out", peak
            if not container.process.is_alive():
                return ERROR, "worker process exited", peak
        status, detail = container.conn.recv()
        return status, detail, max(peak, _rss_mb(container.process.pid or 0))

    def _container(self, memory_mb: int) -> tuple[_Container, bool]:
        with self._lock:
            warm = self._warm.setdefault(memory_mb, queue.SimpleQueue())
        try:
            container = warm.get_nowait()
            if container.process.is_alive():
                return container, False
        except queue.Empty:
            pass
        container = _Container(self.handler, memory_mb, self.niceness)
        container.wait_ready(timeout_s=120)
        with self._lock:
            self._all.append(container)
        return container, True

    def provision(self, memory_mb: int, count: int) -> int:
        """Start ``count`` warm containers of ``memory_mb`` now; returns how many started.

        Lambda's provisioned concurrency: containers initialised ahead of the
        invocations, so that the first ones are not cold starts. They start in parallel
        and join the warm pool of their memory size.
        """
        self.prices.check_memory(memory_mb)
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        containers = [_Container(self.handler, memory_mb, self.niceness) for _ in range(count)]
        with self._lock:
            self._all.extend(containers)
            warm = self._warm.setdefault(memory_mb, queue.SimpleQueue())
        for container in containers:
            container.wait_ready(timeout_s=120)
            warm.put(container)
        return len(containers)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for container in self._all:
            container.stop()


register_runtime("local", LocalRuntime)


def gpu_runtime(concurrency: int = 1, **options: Any) -> LocalRuntime:
    """The ``gpu`` runtime: worker processes running the torch worker, one per GPU.

    The containers import ``functions.gpu`` (torch, CUDA when present) instead of the
    numpy handler; everything else, including the Lambda-style meter, is the local
    runtime's.
    """
    return LocalRuntime(concurrency=concurrency, handler="functions.gpu:handler", **options)


register_runtime("gpu", gpu_runtime)
