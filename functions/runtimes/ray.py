"""The ``ray`` runtime: each worker invocation a task of a Ray cluster.

The task calls the same ``handler(event, context)`` as every runtime, in a Ray worker
process, and the worker exchanges snapshots and deltas through the object store the
event names (so on a cluster of several machines that is ``s3://``, not ``file://``).
Each invocation is reported as the other runtimes report it:

* **Resources** come from the epoch's config. ``memory_mb`` is the task's ``memory``
  reservation; its CPUs are Lambda's share of that memory (one vCPU per 1,769 MB,
  ``functions/prices.json``) unless ``num_cpus`` is fixed; ``num_gpus`` GPUs each,
  which run the torch worker (:mod:`functions.gpu`) unless another handler is named.
  Ray places a task only where its reservation fits, and queues it until then.
* **Cold start**: the first task to import its handler in a worker process. The import
  is its ``init_duration_s``; a worker process Ray had to start first shows in
  ``queued_s``.
* **Queueing**: from submit until the task started (its handler loaded), so the wait for
  a free reservation and for a worker process, unbilled. A task still not started after
  ``max_queue_s`` is cancelled and fails with ``error``, naming what it asked for.
* **Time limit**: counted from the task's start; the handler's context gives it the
  remaining time, and a task that overruns it is cancelled (its process killed, as
  Lambda discards a container) and reported ``timeout``.
* **Failures**: an exception of the handler is ``error`` with its message, as is a
  worker process that died; ``MemoryError``, or Ray's memory monitor killing the task
  when its node runs out of memory, is ``out_of_memory``. Ray retries nothing itself:
  the coordinator decides (``max_retries=0``). Ray does not cap a task's memory at its
  reservation; ``peak_rss_mb`` reports what the invocation used.
* **Bill**: the CPUs reserved, per started millisecond of initialisation and duration,
  at an on-demand c5 vCPU's price (``vm_sets.c5`` in ``functions/prices.json``: a
  c5.large, 2 vCPU and 4 GiB, so memory up to 2 GiB per vCPU is included); GPU seconds
  at ``gpu_hour_usd`` if given, else unpriced and labelled so
  (``labels["unpriced"] == "gpu"``).

``address`` picks the cluster (``ray://head:10001`` or ``auto``); None lets Ray read
``RAY_ADDRESS`` and, without it, start a local instance of this machine's cores for the
life of the runtime. A process already connected to Ray keeps its connection.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from functions.pricing import lambda_prices, vm_prices
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

__all__ = ["DEFAULT_HANDLER", "GPU_HANDLER", "RayPrices", "RayRuntime", "ray_prices"]

DEFAULT_HANDLER = "functions.handler:handler"
#: What a task with GPUs runs unless told: the torch worker.
GPU_HANDLER = "functions.gpu:handler"
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]

#: How often the watcher looks at deadlines and takes in new tasks while none finishes.
_POLL_S = 0.02
_MIB = 1024 * 1024


# -- in the Ray worker process ----------------------------------------------------------

#: The handlers this worker process has imported, by ``module:function``.
_LOADED: dict[str, Handler] = {}


def _load(handler_path: str) -> tuple[Handler, float | None]:
    """The handler, and the seconds its import took if this process had not had it."""
    handler = _LOADED.get(handler_path)
    if handler is not None:
        return handler, None
    started = time.perf_counter()
    module_name, _, attribute = handler_path.partition(":")
    handler = getattr(importlib.import_module(module_name), attribute)
    _LOADED[handler_path] = handler
    return handler, time.perf_counter() - started


def _status_kib(name: str) -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name):
                return int(line.split()[1])
    return None


def _reset_peak_rss() -> None:
    """Start the process's peak resident memory (``VmHWM``) afresh, where Linux can."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _worker_task(
    handler_path: str,
    payload: dict[str, Any],
    request_id: str,
    memory_mb: int,
    timeout_s: float,
    slowdown: float,
) -> Iterator[dict[str, Any]]:
    """One invocation, as a Ray streaming task: yields once started, once with the outcome."""
    try:
        handler, init_s = _load(handler_path)
    except Exception as exc:  # the handler never loaded: the invocation fails, not the job
        yield {"cold_start": True, "init_s": 0.0}
        yield {"status": ERROR, "error": f"handler failed to load: {exc!r}", "duration_s": 0.0}
        return
    yield {"cold_start": init_s is not None, "init_s": init_s or 0.0, "pid": os.getpid()}
    _reset_peak_rss()
    started = time.perf_counter()
    outcome: dict[str, Any]
    try:
        result = handler(payload, WorkerContext(request_id, memory_mb, time.time() + timeout_s))
        if slowdown > 1.0:  # an injected straggler: a slow instance, billed as such
            time.sleep((slowdown - 1.0) * (time.perf_counter() - started))
        outcome = {"status": OK, "result": result}
    except MemoryError as exc:
        outcome = {"status": OUT_OF_MEMORY, "error": f"MemoryError: {exc}"}
    except Exception as exc:  # the handler's failure is the invocation's outcome
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        outcome = {"status": ERROR, "error": message}
    outcome["duration_s"] = time.perf_counter() - started
    outcome["peak_rss_mb"] = (_status_kib("VmHWM:") or 0) / 1024.0
    yield outcome


# -- in the coordinator's process -------------------------------------------------------


@dataclass(frozen=True)
class RayPrices:
    """What a task's reservation costs per second; see the module docstring.

    >>> prices = ray_prices()
    >>> round(prices.task_cost(3600.0, cpus=1.0, gpus=0.0), 4)
    0.0425
    """

    vcpu_hour_usd: float
    mb_per_vcpu: int
    gpu_hour_usd: float | None = None

    def cpus(self, memory_mb: int) -> float:
        """Lambda's CPU share of ``memory_mb``, in amounts Ray accepts (whole above one)."""
        share = memory_mb / self.mb_per_vcpu
        return round(share, 4) if share <= 1 else float(math.ceil(share))

    def task_cost(self, seconds: float, cpus: float, gpus: float) -> float:
        gpu_hour = self.gpu_hour_usd or 0.0
        return seconds * (cpus * self.vcpu_hour_usd + gpus * gpu_hour) / 3600.0


def ray_prices(gpu_hour_usd: float | None = None) -> RayPrices:
    """c5's vCPU-hour from the price file, Lambda's memory per vCPU, and a GPU price."""
    return RayPrices(vm_prices("c5").vcpu_hour_usd, lambda_prices().mb_per_vcpu, gpu_hour_usd)


@dataclass
class _InFlight:
    record: InvocationRecord
    stream: Any  # ray.ObjectRefGenerator
    future: Future[InvocationRecord]
    submitted: float
    timeout_s: float
    cpus: float
    gpus: float
    started: float | None = None
    resources: dict[str, Any] = field(default_factory=dict)


class RayRuntime(Runtime):
    """Worker invocations as Ray tasks; see the module docstring.

    Parameters
    ----------
    address
        The cluster to connect to (None: ``RAY_ADDRESS``, else a local instance).
    handler
        ``module:function`` each task calls; it must be importable on the cluster's
        workers (the worker image installs it). Default: the numpy worker, or the torch
        worker where tasks have GPUs.
    num_cpus
        CPUs per task (None: Lambda's share of the task's memory).
    num_gpus
        GPUs per task (the torch worker wants one).
    prices
        The meter (default: :func:`ray_prices`).
    max_queue_s
        How long a task may wait to be placed before it is cancelled as an error.
    slowdown
        Straggler injection for experiments, as on the ``local`` runtime.
    runtime_env
        Ray's ``runtime_env`` for a connection this runtime opens (e.g. a
        ``working_dir``); the worker image makes it unnecessary.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        handler: str | None = None,
        num_cpus: float | None = None,
        num_gpus: float = 0.0,
        prices: RayPrices | None = None,
        max_queue_s: float = 900.0,
        slowdown: Callable[[], float] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        import ray

        if (num_cpus is not None and num_cpus < 0) or num_gpus < 0 or max_queue_s <= 0:
            raise ValueError("num_cpus and num_gpus must be >= 0, max_queue_s > 0")
        self.handler = handler or (GPU_HANDLER if num_gpus else DEFAULT_HANDLER)
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.prices = prices or ray_prices()
        self.max_queue_s = max_queue_s
        self.slowdown = slowdown
        self.records: list[InvocationRecord] = []
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        self._task = ray.remote(num_returns="streaming", max_retries=0)(_worker_task)
        self._lock = threading.Lock()
        self._new: list[_InFlight] = []
        self._wake = threading.Event()
        self._closing = False
        self._watcher = threading.Thread(target=self._watch, name="ray-runtime", daemon=True)
        self._watcher.start()

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        if memory_mb < 1 or not timeout_s > 0:
            raise ValueError(
                f"memory_mb must be >= 1 and timeout_s > 0, got {memory_mb}, {timeout_s}"
            )
        record = InvocationRecord(uuid.uuid4().hex, memory_mb=memory_mb, labels=dict(labels))
        factor = self.slowdown() if self.slowdown is not None else 1.0
        record.labels["slowdown"] = factor
        cpus = self.prices.cpus(memory_mb) if self.num_cpus is None else self.num_cpus
        gpus = self.num_gpus
        if gpus and self.prices.gpu_hour_usd is None:
            record.labels["unpriced"] = "gpu"
        resources = {"num_cpus": cpus, "num_gpus": gpus, "memory": memory_mb * _MIB}
        future: Future[InvocationRecord] = Future()
        submitted = time.perf_counter()
        stream = self._task.options(name="driftline-worker", **resources).remote(
            self.handler, payload, record.request_id, memory_mb, timeout_s, factor
        )
        flight = _InFlight(record, stream, future, submitted, timeout_s, cpus, gpus)
        flight.resources = resources
        with self._lock:
            if self._closing:
                raise RuntimeError("the ray runtime is closed")
            self._new.append(flight)
        self._wake.set()
        return future

    # -- the watcher: one thread follows every task in flight ---------------------------

    def _watch(self) -> None:
        flights: list[_InFlight] = []
        while True:
            with self._lock:
                flights.extend(self._new)
                self._new.clear()
                if self._closing and not flights:
                    return
            if not flights:
                self._wake.wait(_POLL_S * 10)
                self._wake.clear()
                continue
            streams = [f.stream for f in flights]
            try:
                ready, _ = self._ray.wait(streams, num_returns=1, timeout=_POLL_S)
                if ready:  # and whatever else is ready by now
                    ready, _ = self._ray.wait(streams, num_returns=len(streams), timeout=0)
            except Exception as exc:  # the connection is gone: no task can report any more
                for flight in flights:
                    self._finish(flight, ERROR, f"lost the Ray cluster: {exc!r}")
                flights = []
                continue
            done = {id(s) for s in ready}
            flights = [f for f in flights if not self._advance(f, id(f.stream) in done)]

    def _advance(self, flight: _InFlight, ready: bool) -> bool:
        """Take in what the task yielded, or enforce its deadline; True once it is over."""
        now = time.perf_counter()
        if ready:
            try:
                message = self._ray.get(next(flight.stream))
            except StopIteration:
                return self._finish(flight, ERROR, "the worker ended without an outcome")
            except Exception as exc:  # Ray's own failures: killed, crashed, lost
                return self._finish(flight, *_ray_failure(self._ray, exc))
            if flight.started is None:
                flight.started = now
                record = flight.record
                record.cold_start = bool(message["cold_start"])
                record.init_duration_s = float(message["init_s"])
                record.queued_s = max(0.0, now - flight.submitted - record.init_duration_s)
                return False
            flight.record.peak_rss_mb = float(message.get("peak_rss_mb", 0.0))
            flight.record.result = message.get("result")
            return self._finish(
                flight, message["status"], message.get("error"), message["duration_s"]
            )
        if flight.started is None and now - flight.submitted > self.max_queue_s:
            self._ray.cancel(flight.stream, force=True)
            asked = ", ".join(f"{k}={v}" for k, v in flight.resources.items())
            return self._finish(
                flight, ERROR, f"not started within {self.max_queue_s} s; it asked for {asked}"
            )
        if flight.started is not None and now - flight.started > flight.timeout_s:
            self._ray.cancel(flight.stream, force=True)
            flight.record.labels["cancelled"] = True
            return self._finish(flight, TIMEOUT, "task timed out", now - flight.started)
        return False

    def _finish(
        self, flight: _InFlight, status: str, error: str | None, duration_s: float | None = None
    ) -> bool:
        record = flight.record
        if duration_s is None:  # a failure seen from here: since the start, if it started
            started = flight.started
            duration_s = 0.0 if started is None else time.perf_counter() - started
        record.status, record.error, record.duration_s = status, error, duration_s
        if status != OK:
            record.result = None
        billed_s = record.duration_s + record.init_duration_s
        record.billed_ms = math.ceil(billed_s * 1000)
        record.cost_usd = self.prices.task_cost(record.billed_ms / 1000, flight.cpus, flight.gpus)
        with self._lock:
            self.records.append(record)
        flight.future.set_result(record)
        return True

    def accelerator_types(self) -> tuple[str, ...]:
        """The GPU types the cluster's nodes name, lower-cased (Ray's
        ``accelerator_type:<type>`` resources: ``l4``, ``a10g``, ``h100``, ...); empty
        where the cluster has no GPU."""
        resources = self._ray.cluster_resources()
        if not resources.get("GPU"):
            return ()
        prefix = "accelerator_type:"
        return tuple(sorted(k[len(prefix) :].lower() for k in resources if k.startswith(prefix)))

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._wake.set()
        self._watcher.join()
        if self._owns_ray:
            self._ray.shutdown()


def _ray_failure(ray: Any, exc: Exception) -> tuple[str, str]:
    """The status and message of a task that Ray, not the handler, ended."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return OUT_OF_MEMORY, message
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return ERROR, f"cancelled: {message}"
    return ERROR, message


register_runtime("ray", RayRuntime)
