"""A distributed job's worker invocations: submitted to the function runtime, collected
in the order they complete, retried or dropped when they fail, each billed once."""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from configurator.space import LAMBDA
from functions.artifacts import ArtifactError
from functions.handler import WorkerTask
from functions.objectstore import ObjectNotFound, ObjectStore
from functions.runtimes import InvocationRecord, Runtime
from functions.shards import read_delta
from retrain.stats import CoordinatorStats

log = logging.getLogger(__name__)


@dataclass(eq=False)  # compared by identity: it holds the delta's arrays
class Running:
    """An invocation in flight: which shard, against which snapshot, which try."""

    worker: int
    epoch: int
    attempt: int
    task: WorkerTask
    future: Future[InvocationRecord]
    memory_mb: int
    #: The worker's update, read from the store as soon as it arrives.
    delta: dict[str, np.ndarray] | None = None
    #: The worker kind it runs on (``configurator.space.KINDS``).
    kind: str = LAMBDA


class Invocations:
    """The invocations of one job still running or not yet collected.

    Every invocation's bill goes into ``stats.invocations`` once, when it is collected;
    failures go into ``stats.failures``. A worker that fails, or says ok without a
    readable delta, is retried up to ``max_retries`` times, then dropped.
    """

    def __init__(
        self,
        runtime: Runtime,
        store: ObjectStore,
        job_id: str,
        *,
        timeout_s: float,
        max_retries: int,
        stats: CoordinatorStats,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.stats = stats
        self._recorded = {r.request_id for r in stats.invocations}  # billed already
        #: Invocations in flight, by future, in launch order.
        self.running: dict[Future[InvocationRecord], Running] = {}
        # Futures in the order they completed, appended by their done callbacks.
        self._arrivals: deque[Future[InvocationRecord]] = deque()

    def adopt(self, stats: CoordinatorStats) -> None:
        """Carry on from ``stats``, a checkpointed coordinator's: its invocations are
        billed already."""
        self.stats = stats
        self._recorded = {r.request_id for r in stats.invocations}

    def __len__(self) -> int:
        return len(self.running)

    def busy_workers(self) -> set[int]:
        """The shards with an invocation in flight."""
        return {r.worker for r in self.running.values()}

    def pending(self) -> list[Future[InvocationRecord]]:
        """Futures of the invocations still running, without waiting for them."""
        return [r.future for r in self.running.values() if not r.future.done()]

    def launch(self, task: WorkerTask, memory_mb: int, attempt: int, kind: str = LAMBDA) -> None:
        """Start a worker of ``kind`` on ``task``'s shard and snapshot."""
        future = self._submit(task, memory_mb, kind)
        self.running[future] = Running(
            task.worker, task.epoch, attempt, task, future, memory_mb, kind=kind
        )

    def _submit(self, task: WorkerTask, memory_mb: int, kind: str) -> Future[InvocationRecord]:
        labels: dict[str, object] = {"worker": task.worker, "epoch": task.epoch}
        if kind != LAMBDA:  # a runtime of Lambda's kind need not know kinds
            labels["kind"] = kind
        future = self.runtime.submit(
            task.as_event(), memory_mb=memory_mb, timeout_s=self.timeout_s, **labels
        )
        future.add_done_callback(self._arrivals.append)
        return future

    def requeue(
        self,
        worker: int,
        epoch: int,
        attempt: int,
        memory_mb: int,
        task: WorkerTask,
        kind: str = LAMBDA,
    ) -> None:
        """Take back an invocation a crashed coordinator left running.

        If its delta is in the store (and readable), the invocation is taken as finished:
        the next epoch collects it like any other arrival, as a stale update. Otherwise
        its task runs again.
        """
        delta = self._usable_delta(task.delta_key)
        if delta is not None:
            record = InvocationRecord(
                f"recovered-{self.job_id}-{epoch}-{worker}",
                memory_mb=memory_mb,
                labels={"worker": worker, "epoch": epoch, "recovered": True},
            )
            future: Future[InvocationRecord] = Future()
            future.set_result(record)
            future.add_done_callback(self._arrivals.append)
        elif self.store.exists(task.snapshot_key):
            future = self._submit(task, memory_mb, kind)
        else:
            self.stats.failures.append(
                {
                    "worker": worker,
                    "epoch": epoch,
                    "attempt": attempt,
                    "status": "lost",
                    "error": f"snapshot {task.snapshot_key!r} is gone; not relaunched",
                }
            )
            return
        self.running[future] = Running(worker, epoch, attempt, task, future, memory_mb, delta, kind)

    def _usable_delta(self, key: str) -> dict[str, np.ndarray] | None:
        """The delta under `key`, or None if it is missing or damaged."""
        if not self.store.exists(key):
            return None
        try:
            return read_delta(self.store, key)
        except (ArtifactError, ObjectNotFound) as exc:
            log.warning("job %s: relaunching the worker of a damaged delta: %s", self.job_id, exc)
            return None

    def completed(self, first_only: bool = False) -> list[Running]:
        """The invocations that completed since the last call (the first one only, with
        ``first_only``), waiting for one if none has. Done callbacks queue them as they
        complete, so that a wait costs nothing when arrivals are already there, which
        they are when λ is large."""
        while not self._arrivals and self.running:
            self.runtime.wait_any(list(self.running))
        count = min(1 if first_only else len(self._arrivals), len(self._arrivals))
        done = [self._arrivals.popleft() for _ in range(count)]
        return [self.running.pop(f) for f in done if f in self.running]

    def accept(self, running: Running, memory_mb: int) -> bool:
        """True if the update is usable, its delta read from the store now, while the
        other workers still run. A failed worker, or one that said ok but whose delta
        is missing or damaged, is retried (with ``memory_mb``) or dropped."""
        record = running.future.result()
        self.record(record)
        status, error = record.status, record.error
        if record.ok and running.delta is not None:  # recovered: read at resume already
            return True
        if record.ok:
            try:
                running.delta = read_delta(self.store, running.task.delta_key)
                return True
            except (ArtifactError, ObjectNotFound, ValueError) as exc:
                status, error = "bad_delta", str(exc)
        self.stats.failures.append(
            {
                "worker": running.worker,
                "epoch": running.epoch,
                "attempt": running.attempt,
                "status": status,
                "error": error,
            }
        )
        if running.attempt < self.max_retries:
            retry = self._submit(running.task, memory_mb, running.kind)
            self.running[retry] = Running(
                running.worker,
                running.epoch,
                running.attempt + 1,
                running.task,
                retry,
                memory_mb,
                kind=running.kind,
            )
        return False

    def drain(self) -> None:
        """Wait for invocations still running so nothing is left behind the job."""
        for running in self.running.values():
            self.record(running.future.result())
        self.running = {}
        self._arrivals.clear()

    def record(self, record: InvocationRecord) -> None:
        """Bill an invocation, once."""
        # A recovered update was billed to the crashed coordinator, which kept no record.
        if record.labels.get("recovered"):
            return
        if record.request_id not in self._recorded:
            self._recorded.add(record.request_id)
            self.stats.invocations.append(record)
