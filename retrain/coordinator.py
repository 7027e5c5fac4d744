"""Distributed retraining: SandPiper's selective-synchronous DSGD through the object store.

Each epoch the coordinator writes the model snapshot φ_t, launches λ workers (one per
shard of the window) on a function runtime, waits for the first κ of them, averages
their updates into φ_{t+1} and goes on. The λ−κ stragglers keep running; their updates,
computed against an older snapshot, are averaged in whenever they arrive (SandPiper
Eq. 2). κ = λ is BSP, fully synchronous; ASP applies every update the moment it arrives
and relaunches that worker at once. A worker that fails or times out is retried up to
``max_retries`` times, then dropped for the epoch.

References
----------
SandPiper (papers/004) §III-B, Eq. 2; G. Joshi et al., "Slow and stale gradients can
win the race" (2019) for κ-of-λ synchronisation.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from configurator.space import EpochConfig
from functions.artifacts import model_to_bytes, sha256_hex
from functions.handler import WorkerTask
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore
from functions.runtimes import InvocationRecord, Runtime
from functions.shards import (
    apply_delta,
    average_deltas,
    delta_key,
    read_delta,
    shard_key,
    snapshot_key,
    write_shard,
)
from retrain.backends import EpochOutcome, TrainingBackend
from retrain.window import RatingsWindow


@dataclass(frozen=True)
class SyncPolicy:
    """How many of an epoch's λ workers the coordinator waits for.

    Examples
    --------
    >>> SyncPolicy.bsp().kappa(8), SyncPolicy.selective(0.5).kappa(8), SyncPolicy.asp().kappa(8)
    (8, 4, 1)
    """

    name: str
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in ("bsp", "selective", "asp"):
            raise ValueError(f"unknown sync policy {self.name!r}; choose bsp, selective or asp")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"sync ratio must be in (0, 1], got {self.ratio}")

    @classmethod
    def bsp(cls) -> SyncPolicy:
        return cls("bsp", 1.0)

    @classmethod
    def selective(cls, ratio: float) -> SyncPolicy:
        return cls("selective", ratio)

    @classmethod
    def asp(cls) -> SyncPolicy:
        return cls("asp", 1.0)

    def kappa(self, workers: int) -> int:
        if self.name == "asp":
            return 1
        return max(1, math.ceil(self.ratio * workers)) if self.name == "selective" else workers


@dataclass
class _Running:
    """An invocation in flight: which shard, against which snapshot, which try."""

    worker: int
    epoch: int
    attempt: int
    task: WorkerTask
    future: Future[InvocationRecord]


@dataclass
class UsedUpdate:
    """An update that went into a snapshot, for the job record."""

    worker: int
    computed_on: int
    applied_in: int
    duration_s: float
    cold_start: bool
    cost_usd: float

    @property
    def staleness(self) -> int:
        return self.applied_in - self.computed_on


@dataclass
class CoordinatorStats:
    """What the job record keeps beyond losses: every used update and every failure."""

    used: list[UsedUpdate] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[InvocationRecord] = field(default_factory=list)


class DistributedBackend(TrainingBackend):
    """A ``TrainingBackend`` whose epochs run as workers on a function runtime.

    Parameters
    ----------
    runtime
        Where workers run (``local``, ``lambda``, ...).
    store, store_url
        The object store the workers read and write, and its URL as workers see it.
    job_id
        Names the job's snapshots, shards and deltas.
    policy
        BSP, ASP or selective (κ of λ).
    """

    name = "distributed"

    def __init__(
        self,
        runtime: Runtime,
        store: ObjectStore,
        store_url: str,
        job_id: str,
        policy: SyncPolicy,
        seed: int = 0,
        timeout_s: float = 900.0,
        max_retries: int = 1,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.store_url = store_url
        self.job_id = job_id
        self.policy = policy
        self.seed = seed
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.stats = CoordinatorStats()
        self._model: BiasedMF | None = None
        self._epoch = 0
        self._running: list[_Running] = []
        self._sharded_for = 0
        self._snapshots = 0

    # -- TrainingBackend ---------------------------------------------------------------
    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        self._model = model
        self._users = model.encode_users(train.user_ids)
        self._items = model.encode_items(train.item_ids)
        self._ratings = np.asarray(train.ratings, dtype=np.float64)
        self._order = np.random.default_rng(self.seed).permutation(len(self._ratings))

    def result(self) -> BiasedMF:
        """The trained model; stragglers still in flight are waited for (and billed)."""
        self._drain()
        return self._require_model()

    def _require_model(self) -> BiasedMF:
        if self._model is None:
            raise RuntimeError("prepare() must be called before training")
        return self._model

    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        model = self._require_model()
        started = time.perf_counter()
        self._shard(config.workers)
        snapshot = self._write_snapshot(model)
        for worker in self._idle_workers(config.workers):
            self._launch(worker, snapshot, config, attempt=0)
        spent_before = sum(r.cost_usd for r in self.stats.invocations)
        if self.policy.name == "asp":
            self._run_asp(config)
        else:
            self._run_selective(config)
        self._epoch += 1
        cost = sum(r.cost_usd for r in self.stats.invocations) - spent_before
        loss = model.mse_encoded(self._users, self._items, self._ratings)
        return EpochOutcome(
            loss=loss,
            duration_s=time.perf_counter() - started,
            cost_usd=cost,
            details={
                "policy": self.policy.name,
                "kappa": self.policy.kappa(config.workers),
                "in_flight": len(self._running),
            },
        )

    def _drain(self) -> None:
        """Wait for invocations still running so nothing is left behind the job."""
        for running in self._running:
            self._record(running.future.result())
        self._running = []

    # -- epochs --------------------------------------------------------------------------
    def _run_selective(self, config: EpochConfig) -> None:
        """Wait for κ updates of this epoch; fold in every update that has arrived."""
        kappa = self.policy.kappa(config.workers)
        fresh, arrived = 0, []
        while fresh < kappa and self._running:
            for running in self._completed():
                if self._accept(running, config):
                    arrived.append(running)
                    fresh += running.epoch == self._epoch
        self._apply(arrived, weight=1.0)

    def _run_asp(self, config: EpochConfig) -> None:
        """Apply each update on arrival and relaunch its worker: λ arrivals per epoch."""
        model = self._require_model()
        for _ in range(config.workers):
            done = self._completed(first_only=True)
            for running in done:
                if self._accept(running, config):
                    self._apply([running], weight=1.0 / config.workers)
                self._launch(running.worker, self._write_snapshot(model), config, attempt=0)

    def _completed(self, first_only: bool = False) -> list[_Running]:
        futures = [r.future for r in self._running]
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        finished = [r for r in self._running if r.future in done]
        if first_only:
            finished = finished[:1]
        self._running = [r for r in self._running if r not in finished]
        return finished

    def _accept(self, running: _Running, config: EpochConfig) -> bool:
        """True if the update is usable; failed workers are retried or dropped."""
        record = running.future.result()
        self._record(record)
        if record.ok:
            return True
        self.stats.failures.append(
            {
                "worker": running.worker,
                "epoch": running.epoch,
                "attempt": running.attempt,
                "status": record.status,
                "error": record.error,
            }
        )
        if running.attempt < self.max_retries:
            retry = self._submit(running.task, config)
            self._running.append(
                _Running(running.worker, running.epoch, running.attempt + 1, running.task, retry)
            )
        return False

    def _apply(self, updates: list[_Running], weight: float) -> None:
        if not updates:
            return
        deltas = [read_delta(self.store, r.task.delta_key) for r in updates]
        apply_delta(self._require_model(), average_deltas(deltas), weight=weight)
        for r in updates:
            record = r.future.result()
            self.stats.used.append(
                UsedUpdate(
                    r.worker,
                    r.epoch,
                    self._epoch,
                    record.duration_s,
                    record.cold_start,
                    record.cost_usd,
                )
            )

    # -- launching -------------------------------------------------------------------------
    def _shard(self, workers: int) -> None:
        """Split the window into ``workers`` shards (once per distinct worker count)."""
        if self._sharded_for == workers:
            return
        for worker, rows in enumerate(np.array_split(self._order, workers)):
            key = shard_key(self.job_id, worker, workers)
            write_shard(self.store, key, self._users[rows], self._items[rows], self._ratings[rows])
        self._sharded_for = workers

    def _write_snapshot(self, model: BiasedMF) -> tuple[str, str]:
        """A new, never-overwritten snapshot: in-flight workers may still be reading older
        ones (ASP writes one per update, not per epoch)."""
        data = model_to_bytes(model)
        key = snapshot_key(self.job_id, self._snapshots)
        self._snapshots += 1
        self.store.put(key, data)
        return key, sha256_hex(data)

    def _idle_workers(self, workers: int) -> list[int]:
        busy = {r.worker for r in self._running}
        return [w for w in range(workers) if w not in busy]

    def _launch(
        self, worker: int, snapshot: tuple[str, str], config: EpochConfig, attempt: int
    ) -> None:
        key, digest = snapshot
        task = WorkerTask(
            store_url=self.store_url,
            job_id=self.job_id,
            epoch=self._epoch,
            worker=worker,
            snapshot_key=key,
            shard_key=shard_key(self.job_id, worker, config.workers),
            delta_key=delta_key(self.job_id, self._epoch, worker),
            batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            regularization=self._require_model().regularization,
            seed=self.seed,
            snapshot_sha256=digest,
        )
        self._running.append(
            _Running(worker, self._epoch, attempt, task, self._submit(task, config))
        )

    def _submit(self, task: WorkerTask, config: EpochConfig) -> Future[InvocationRecord]:
        return self.runtime.submit(
            task.as_event(),
            memory_mb=config.memory_mb,
            timeout_s=self.timeout_s,
            worker=task.worker,
            epoch=task.epoch,
        )

    def _record(self, record: InvocationRecord) -> None:
        if record not in self.stats.invocations:
            self.stats.invocations.append(record)
