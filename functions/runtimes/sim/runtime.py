"""The ``sim`` runtime itself: invocations started, queued and completed in virtual time."""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from functions.performance import (
    DEFAULT_MODEL,
    DEFAULT_TIME_MARGIN_S,
    PerformanceModel,
    Work,
    check_number,
)
from functions.pricing import LambdaPrices, lambda_prices
from functions.runtimes.base import ERROR, OK, TIMEOUT, InvocationRecord, Runtime
from functions.runtimes.sim.clock import SimFuture, VirtualClock
from functions.runtimes.sim.work import StoreWork, UncostablePayload
from functions.shards import DELTA_FORMAT_VERSION, write_delta


@dataclass
class _Invocation:
    record: InvocationRecord
    future: SimFuture
    payload: dict[str, Any]
    work: Work | None
    failure: str | None
    timeout_s: float
    submitted: float
    status: str = OK


class _SimContext:
    """The part of Lambda's context object a worker uses, for an executed invocation."""

    function_name = "driftline-worker"

    def __init__(self, request_id: str, memory_mb: int, timeout_s: float) -> None:
        self.aws_request_id = request_id
        self.memory_limit_in_mb = memory_mb
        self._remaining_ms = int(timeout_s * 1000)

    def get_remaining_time_in_millis(self) -> int:
        return self._remaining_ms


def _label_int(labels: dict[str, Any], name: str) -> int | None:
    value = labels.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"label {name}= must be an integer >= 0, got {value!r}")
    return int(value)


class SimRuntime(Runtime):
    """Lambda in virtual time; see the module docstring.

    Parameters
    ----------
    model
        Durations; :data:`DEFAULT_MODEL` (measured on the local runtime) if None.
    clock
        The virtual clock (a new one at 0 if None); read ``clock.now``.
    concurrency
        Invocations running at once; Lambda's default account limit is 1,000.
    samples_of
        ``payload -> int | Work``: the shard samples (or the full :class:`Work`) of an
        invocation; :class:`StoreWork` by default. A ``samples=`` label wins (with
        optional ``bytes_read=`` and ``bytes_written=`` labels).
    prices
        The meter; Lambda's x86 prices by default.
    seed
        Seeds stragglers and jitter: the same seed and submissions give the same run.
    keep_warm_s
        How long an idle container stays warm.
    stop_early
        Overrunning workers stop ``time_margin_s`` before the limit, as the worker
        does, instead of timing out.
    write_deltas
        Write an empty delta to each successful worker event's ``delta_key``.
    execute
        A worker handler (``functions.handler.handler``) run in this process when an
        invocation completes in virtual time: the result and the delta are the real
        ones, only the duration is simulated. So the coordinator's losses are real
        while λ = 256 workers take no real cores. The handler is told it has its whole
        time limit left (whether it overran is the model's call, ``stop_early``); if it
        raises, the invocation fails with ``error``.
    charge_caller
        Add the caller's own real seconds between its calls into the runtime (a
        coordinator averaging updates and writing snapshots) to virtual time, so that
        time spent outside the workers is not free. The runtime's own work (reading a
        shard's size, running ``execute``) is not charged.
    """

    name = "sim"

    def __init__(
        self,
        model: PerformanceModel | None = None,
        clock: VirtualClock | None = None,
        concurrency: int = 1000,
        samples_of: Callable[[dict[str, Any]], int | Work] | None = None,
        prices: LambdaPrices | None = None,
        seed: int = 0,
        keep_warm_s: float = 600.0,
        stop_early: bool = True,
        write_deltas: bool = False,
        execute: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
        charge_caller: bool = False,
    ) -> None:
        if write_deltas and execute is not None:
            raise ValueError("write_deltas and execute exclude each other: execute writes deltas")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        check_number("keep_warm_s", keep_warm_s, allow_inf=True)
        self.model = model or DEFAULT_MODEL
        self.clock = clock or VirtualClock()
        self.concurrency = concurrency
        self._store_work = StoreWork()
        self.samples_of = samples_of or self._store_work
        self.prices = prices or lambda_prices()
        self.keep_warm_s = keep_warm_s
        self.stop_early = stop_early
        self.write_deltas = write_deltas
        self.execute = execute
        self.charge_caller = charge_caller
        self._left_at: float | None = None  # when control last went back to the caller
        self.records: list[InvocationRecord] = []
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self._events: list[tuple[float, int, _Invocation]] = []
        self._queue: deque[_Invocation] = deque()
        self._running = 0
        self._idle: dict[int, list[float]] = {}  # memory size -> times containers went idle
        self._ids = itertools.count()
        self._order = itertools.count()
        self._closed = False

    # -- submitting --------------------------------------------------------------------
    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> SimFuture:
        self.prices.check_memory(memory_mb)
        if not 0 < timeout_s <= self.prices.timeout_s_max:
            raise ValueError(f"timeout_s must be in (0, {self.prices.timeout_s_max}]")
        if self._closed:
            raise RuntimeError("cannot submit to a closed runtime")
        self._charge_caller_time()
        try:
            return self._enqueue(payload, memory_mb, float(timeout_s), labels)
        finally:
            self._left_at = time.perf_counter()

    def _enqueue(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float, labels: dict[str, Any]
    ) -> SimFuture:
        work, failure = self._work(payload, labels)
        with self._lock:
            record = InvocationRecord(
                f"sim-{next(self._ids):08d}", memory_mb=memory_mb, labels=dict(labels)
            )
            future = SimFuture(self, record)
            invocation = _Invocation(
                record, future, payload, work, failure, timeout_s, self.clock.now
            )
            if self._running < self.concurrency:
                self._start(invocation)
            else:
                self._queue.append(invocation)
        return future

    def _charge_caller_time(self) -> None:
        """Move virtual time on by the real seconds the caller spent since its last call."""
        if self.charge_caller and self._left_at is not None:
            spent = time.perf_counter() - self._left_at
            self.clock.advance_to(self.clock.now + spent)
        self._left_at = None  # inside the runtime until a call returns

    def _work(
        self, payload: dict[str, Any], labels: dict[str, Any]
    ) -> tuple[Work | None, str | None]:
        samples = _label_int(labels, "samples")
        if samples is not None:
            batch_size = payload.get("batch_size") if isinstance(payload, dict) else None
            epochs = int(payload.get("local_epochs", 1)) if isinstance(payload, dict) else 1
            work = Work.for_shard(
                samples,
                batch_size,
                epochs,
                _label_int(labels, "bytes_read") or 0,
                _label_int(labels, "bytes_written") or 0,
            )
            return work, None
        try:
            found = self.samples_of(payload)
        except UncostablePayload:
            raise  # nothing says how much work this is: the caller's mistake
        except Exception as exc:  # e.g. the shard is missing: the worker would fail too
            return None, f"{type(exc).__name__}: {exc}"
        if isinstance(found, Work):
            return found, None
        epochs = int(payload.get("local_epochs", 1))
        return Work.for_shard(int(found), payload.get("batch_size"), epochs), None

    def _start(self, invocation: _Invocation) -> None:
        now = self.clock.now
        record = invocation.record
        record.queued_s = now - invocation.submitted
        record.cold_start = not self._take_warm(record.memory_mb, now)
        slowdown = self.model.draw_slowdown(self._rng)
        record.labels["slowdown"] = slowdown
        record.labels["stopped_early"] = False
        record.labels["samples_trained"] = invocation.work.samples if invocation.work else 0
        model, limit = self.model, invocation.timeout_s
        if invocation.work is None:  # the worker fails while reading its inputs
            duration = model.fixed_s(Work(0), record.cold_start, slowdown)
            invocation.status, record.error = ERROR, invocation.failure
        else:
            work = invocation.work
            duration = model.duration_s(work, record.memory_mb, record.cold_start, slowdown)
            fixed = model.fixed_s(work, record.cold_start, slowdown)
            if duration > limit and self.stop_early and fixed < limit:
                margin = invocation.payload.get("time_margin_s", DEFAULT_TIME_MARGIN_S)
                stopped = max(limit - float(margin), fixed)
                share = (stopped - fixed) / (duration - fixed) if duration > fixed else 1.0
                record.labels["stopped_early"] = True
                record.labels["samples_trained"] = int(work.samples * min(share, 1.0))
                duration = stopped
        if duration > limit:
            duration, invocation.status, record.error = limit, TIMEOUT, "task timed out"
        record.duration_s = duration
        record.billed_ms = self.prices.billed_ms(duration * 1000)
        record.cost_usd = self.prices.invocation_cost(duration * 1000, record.memory_mb)
        heapq.heappush(self._events, (now + duration, next(self._order), invocation))
        self._running += 1

    def _take_warm(self, memory_mb: int, now: float) -> bool:
        idle = self._idle.get(memory_mb)
        if not idle:
            return False
        del idle[: bisect.bisect_left(idle, now - self.keep_warm_s)]  # reclaimed containers
        if not idle:
            return False
        idle.pop()  # the most recently used container
        return True

    # -- advancing -----------------------------------------------------------------------
    def _next_time(self) -> float | None:
        events = self._events
        return events[0][0] if events else None

    @property
    def pending(self) -> int:
        """Invocations submitted and not yet complete (running or queued)."""
        return len(self._events) + len(self._queue)

    def step(self) -> SimFuture | None:
        """Complete the next invocation in virtual time; its future, or None if idle."""
        with self._lock:
            self._charge_caller_time()
            try:
                return self._complete_next()
            finally:
                self._left_at = time.perf_counter()

    def _complete_next(self) -> SimFuture | None:
        if not self._events:
            return None
        finish, _, invocation = heapq.heappop(self._events)
        self.clock.advance_to(max(finish, self.clock.now))
        self._running -= 1
        record = invocation.record
        record.status = invocation.status
        if invocation.status != TIMEOUT:  # Lambda discards a timed-out container
            bisect.insort(self._idle.setdefault(record.memory_mb, []), finish)
        while self._queue and self._running < self.concurrency:
            self._start(self._queue.popleft())
        if self.write_deltas and record.ok:
            self._write_empty_delta(invocation.payload)
        if self.execute is not None and record.ok:
            self._execute(invocation)
        self.records.append(record)
        invocation.future.completed = True
        invocation.future.set_result(record)
        return invocation.future

    def _execute(self, invocation: _Invocation) -> None:
        record = invocation.record
        assert self.execute is not None
        context = _SimContext(record.request_id, record.memory_mb, invocation.timeout_s)
        try:
            record.result = self.execute(invocation.payload, context)
        except Exception as exc:  # as the local runtime: the invocation fails, nothing else
            record.status, record.error = ERROR, f"{type(exc).__name__}: {exc}"

    def wait_any(self, futures: Collection[Future[InvocationRecord]]) -> None:
        """Advance until one of `futures` is done (or nothing is left to complete).

        What ``concurrent.futures.wait(..., FIRST_COMPLETED)`` does on this runtime, but
        without installing a waiter on every future at every call, which costs a
        coordinator with hundreds of workers in flight more than its own work.
        """
        self._charge_caller_time()
        if not any(getattr(f, "completed", True) for f in futures):  # non-sim ones: done
            targets = set(futures)
            while (future := self.step()) is not None and future not in targets:
                pass
        self._left_at = time.perf_counter()

    def run_until(self, future: Future) -> None:
        """Advance until `future` is done (or nothing is left to complete)."""
        while not future.done() and self.step() is not None:
            pass

    def advance_to(self, t: float) -> list[SimFuture]:
        """Complete every invocation that ends by virtual time `t`, then set the clock to `t`."""
        done: list[SimFuture] = []
        with self._lock:
            while self._events and self._events[0][0] <= t:
                future = self.step()
                if future is not None:
                    done.append(future)
            self.clock.advance_to(max(t, self.clock.now))
        return done

    def run(self) -> list[SimFuture]:
        """Complete everything submitted; the futures in completion order."""
        done: list[SimFuture] = []
        while (future := self.step()) is not None:
            done.append(future)
        return done

    def close(self) -> None:
        """Pending invocations finish (in virtual time) first."""
        self.run()
        self._closed = True

    def _write_empty_delta(self, payload: dict[str, Any]) -> None:
        if not all(k in payload for k in ("store_url", "delta_key", "snapshot_key")):
            return
        url = payload["store_url"]
        factors = self._store_work.factors(url, payload["snapshot_key"])
        empty: dict[str, np.ndarray] = {
            "format_version": np.array(DELTA_FORMAT_VERSION, dtype=np.int64)
        }
        for side in ("user", "item"):
            empty[f"{side}_rows"] = np.zeros(0, dtype=np.int64)
            empty[f"{side}_bias"] = np.zeros(0)
            empty[f"{side}_factors"] = np.zeros((0, factors))
            empty[f"{side}_count"] = np.zeros(0, dtype=np.int64)
        write_delta(self._store_work._open(url), payload["delta_key"], empty)
