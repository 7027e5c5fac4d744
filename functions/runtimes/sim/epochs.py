"""κ-of-λ epochs replayed without a coordinator, for configuration searches."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from functions.performance import PerformanceModel, check_number
from functions.pricing import LambdaPrices
from functions.runtimes.base import InvocationRecord
from functions.runtimes.sim.clock import SimFuture
from functions.runtimes.sim.runtime import SimRuntime


@dataclass(frozen=True)
class EpochTiming:
    """One simulated epoch.

    ``duration_s`` runs from the epoch's launch to the κ-th fresh update (BSP: the last;
    ASP: the λ-th arrival) plus the coordinator's ``sync_overhead_s``. ``fresh`` and
    ``stale`` count the updates applied in the epoch computed on its own snapshot and on
    older ones; ``cost_usd`` is the bill of the invocations launched in the epoch
    (retries included), whenever they end.
    """

    epoch: int
    started_s: float
    finished_s: float
    launched: int
    fresh: int
    stale: int
    failed: int
    cost_usd: float

    @property
    def duration_s(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class Simulation:
    """What :func:`simulate_epochs` returns: each epoch, every invocation, the totals."""

    epochs: list[EpochTiming]
    records: list[InvocationRecord]
    latency_s: float
    cost_usd: float

    @property
    def epoch_durations(self) -> list[float]:
        return [e.duration_s for e in self.epochs]


def simulate_epochs(
    kappa: int | str,
    workers: int,
    samples_per_worker: int | Sequence[int],
    epochs: int,
    model: PerformanceModel,
    *,
    memory_mb: int = 1769,
    batch_size: int | None = None,
    local_epochs: int = 1,
    bytes_read: int = 0,
    bytes_written: int = 0,
    timeout_s: float = 900.0,
    max_retries: int = 1,
    sync_overhead_s: float = 0.0,
    concurrency: int = 1000,
    seed: int = 0,
    stop_early: bool = True,
    keep_warm_s: float = 600.0,
    prices: LambdaPrices | None = None,
) -> Simulation:
    """Time κ-of-λ epochs the way the coordinator runs them, in virtual time.

    Parameters
    ----------
    kappa
        Updates each epoch waits for: an integer 1..workers (selective; ``workers`` is
        BSP), ``"bsp"``, or ``"asp"`` (every update applied on arrival and its worker
        relaunched at once; an epoch is ``workers`` arrivals).
    workers
        λ, workers per epoch, one shard each.
    samples_per_worker
        Shard size, one for all or one per worker.
    sync_overhead_s
        Coordinator seconds per model update (averaging deltas, writing the snapshot):
        once per epoch, or per arrival under ASP. Workers keep running meanwhile.

    As in :class:`retrain.coordinator.DistributedBackend`: a selective epoch launches a
    worker on every shard, also those whose straggler from an older epoch still runs
    (BSP and ASP launch the idle ones); a straggler's update, arriving later,
    is applied (stale) in the epoch it arrives in; a failed or timed-out invocation is
    retried up to ``max_retries`` times in its epoch, then dropped. Stragglers still
    running after the last epoch are completed and billed, but do not add to
    ``latency_s``. Other parameters are as for :class:`SimRuntime` and :class:`Work`.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    asp = kappa == "asp"
    need = {"bsp": workers, "asp": 1}.get(kappa, kappa) if isinstance(kappa, str) else kappa
    if isinstance(need, str | bool) or not isinstance(need, int):
        raise ValueError(f"kappa must be 'bsp', 'asp' or an integer, got {kappa!r}")
    if not 1 <= need <= workers:
        raise ValueError(f"kappa must be within 1..{workers}, got {need}")
    sizes = (
        [int(samples_per_worker)] * workers
        if isinstance(samples_per_worker, int | np.integer)
        else [int(s) for s in samples_per_worker]
    )
    if len(sizes) != workers:
        raise ValueError(f"samples_per_worker has {len(sizes)} sizes for {workers} workers")
    check_number("sync_overhead_s", sync_overhead_s)

    runtime = SimRuntime(
        model,
        concurrency=concurrency,
        prices=prices,
        seed=seed,
        keep_warm_s=keep_warm_s,
        stop_early=stop_early,
    )
    payload: dict[str, Any] = {"batch_size": batch_size, "local_epochs": local_epochs}
    running: dict[SimFuture, tuple[int, int, int]] = {}  # future -> worker, epoch, attempt
    arrived: deque[SimFuture] = deque()  # completed during the coordinator's own work
    launched: dict[int, list[InvocationRecord]] = {}  # epoch -> invocations it launched

    def launch(worker: int, epoch: int, attempt: int) -> None:
        future = runtime.submit(
            payload,
            memory_mb,
            timeout_s,
            samples=sizes[worker],
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            worker=worker,
            epoch=epoch,
        )
        running[future] = (worker, epoch, attempt)
        launched.setdefault(epoch, []).append(future.record)

    def next_arrival() -> tuple[SimFuture, tuple[int, int, int]] | None:
        while not arrived:
            future = runtime.step()
            if future is None:
                return None
            arrived.append(future)
        future = arrived.popleft()
        return future, running.pop(future)

    def overhead() -> None:
        if sync_overhead_s:
            arrived.extend(runtime.advance_to(runtime.clock.now + sync_overhead_s))

    selective = not asp and need < workers  # starts every shard, busy or not
    timings: list[EpochTiming] = []
    for epoch in range(epochs):
        started = runtime.clock.now
        busy = {worker for worker, _, _ in running.values()}
        starting = [w for w in range(workers) if selective or w not in busy]
        for worker in starting:
            launch(worker, epoch, 0)
        fresh = stale = failed = 0
        arrivals = 0
        while running or arrived:
            if (asp and arrivals >= workers) or (not asp and fresh >= need):
                break
            got = next_arrival()
            if got is None:
                break
            future, (worker, computed_on, attempt) = got
            arrivals += 1
            record = future.result()
            if record.ok:
                fresh += computed_on == epoch
                stale += computed_on != epoch
                if asp:
                    overhead()
                    launch(worker, epoch, 0)
            else:
                failed += 1
                if attempt < max_retries:
                    launch(worker, computed_on, attempt + 1)
                elif asp:
                    launch(worker, epoch, 0)
        if not asp:
            overhead()
        timings.append(
            EpochTiming(epoch, started, runtime.clock.now, len(starting), fresh, stale, failed, 0.0)
        )
    latency = runtime.clock.now
    runtime.close()  # stragglers finish and are billed; only now is every cost known
    timings = [
        replace(t, cost_usd=sum(r.cost_usd for r in launched.get(t.epoch, []))) for t in timings
    ]
    total = sum(r.cost_usd for r in runtime.records)
    return Simulation(timings, list(runtime.records), latency, total)
