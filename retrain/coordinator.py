"""Distributed retraining: SandPiper's selective-synchronous DSGD through the object store.

Each epoch the coordinator writes the model snapshot φ_t, launches λ workers (one per
shard of the window) on a function runtime, waits for the first κ of them, averages
their updates into φ_{t+1} and goes on (SandPiper Eq. 2). The λ−κ stragglers keep
running while the next epoch starts fresh workers on every shard; their updates,
computed against an older snapshot, are folded in whenever they arrive, as a step of
their own damped by their staleness. κ = λ is BSP, fully synchronous; ASP applies every
update the moment it arrives and relaunches that worker at once. A worker that fails or
times out is retried up to ``max_retries`` times, then dropped for the epoch.

Each epoch runs on the worker kind its config names: the workers of a runtime of that
kind (the placement gives the coordinator a :class:`~retrain.worker_kinds.KindRouter`),
or, for the in-process kind, the coordinator itself (:func:`retrain.here.train_here`).
One model, one set of objects, one checkpoint and one bill serve every kind.

Why stragglers are handled so, and what the alternatives measured:
``docs/decisions/0002-selective-sync-and-stragglers.md``. Checkpoints: see
:mod:`retrain.checkpoints`.

``DistributedBackend`` runs the epochs; its collaborators keep the invocations in
flight (:mod:`retrain.invocations`), fold updates into the model
(:mod:`retrain.folding`) and keep the job's objects in the store
(:mod:`retrain.job_objects`).

References
----------
SandPiper (Ali et al.), §III-B, Eq. 2; W. Zhang, S. Gupta, X. Lian, J. Liu,
"Staleness-aware async-SGD for distributed deep learning" (IJCAI 2016) for damping a
stale update by its staleness; G. Joshi et al., "Slow and stale gradients can
win the race" (2019) for κ-of-λ synchronisation.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from configurator.base import WorkerRun
from configurator.space import IN_PROCESS, LAMBDA, EpochConfig
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore
from functions.runtimes import InvocationRecord, Runtime
from retrain.backends import EpochOutcome, TrainingBackend
from retrain.checkpoints import (
    CheckpointError,
    CheckpointState,
    InFlight,
    ObjectRef,
    checkpoint_key,
    checkpoint_prefix,
    get_verified,
    read_checkpoint,
    window_key,
)
from retrain.epoch_sync import EpochSync
from retrain.folding import RowShares
from retrain.here import train_here
from retrain.invocations import Invocations
from retrain.job import EpochRecord
from retrain.job_objects import EncodedWindow, JobObjects
from retrain.stats import CoordinatorStats
from retrain.sync import SyncPolicy
from retrain.window import RatingsWindow

# Re-exported: the checkpoint names are imported from here too.
__all__ = [
    "CheckpointError",
    "CheckpointState",
    "DistributedBackend",
    "InFlight",
    "ObjectRef",
    "SyncPolicy",
    "checkpoint_key",
    "checkpoint_prefix",
    "get_verified",
    "read_checkpoint",
    "window_key",
]


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
    checkpoint
        Write a checkpoint after every epoch (see the module docstring), so that
        :meth:`resume` can continue the job after a crash.
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
        checkpoint: bool = True,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.store_url = store_url
        self.job_id = job_id
        self.policy = policy
        self.seed = seed
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.checkpoint = checkpoint
        self._invocations = Invocations(
            runtime,
            store,
            job_id,
            timeout_s=timeout_s,
            max_retries=max_retries,
            stats=CoordinatorStats(),
        )
        self._objects = JobObjects(store, job_id)
        self._shares = RowShares()
        self._sync = EpochSync(
            policy, self._invocations, self._objects, self._shares, store_url=store_url, seed=seed
        )
        #: The epochs run so far, as the job record keeps them (checkpointed).
        self.epochs: list[EpochRecord] = []
        self._model: BiasedMF | None = None
        self._data: EncodedWindow | None = None
        self._epoch = 0

    # -- TrainingBackend ---------------------------------------------------------------
    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        self._model = model
        users = model.encode_users(train.user_ids)
        items = model.encode_items(train.item_ids)
        ratings = np.asarray(train.ratings, dtype=np.float64)
        order = np.random.default_rng(self.seed).permutation(len(ratings))
        self._data = EncodedWindow(users, items, ratings, order)
        self._objects.new_data()
        self._shares.reset()  # new data: shares recomputed

    @property
    def model(self) -> BiasedMF:
        """The model being trained (updated in place each epoch)."""
        return self._require_model()

    @property
    def stats(self) -> CoordinatorStats:
        """The job's invocations, used updates and failures so far."""
        return self._invocations.stats

    @property
    def in_flight(self) -> list[tuple[int, int]]:
        """``(worker, epoch)`` of every invocation still running or not yet collected."""
        return [(r.worker, r.epoch) for r in self._invocations.running.values()]

    @property
    def epoch(self) -> int:
        """Epochs finished so far: the number of the next epoch."""
        return self._epoch

    # The encoded training data (rows of the model), as benchmarks read it.
    @property
    def _users(self) -> np.ndarray:
        return self._require_data().users

    @property
    def _items(self) -> np.ndarray:
        return self._require_data().items

    @property
    def _ratings(self) -> np.ndarray:
        return self._require_data().ratings

    def result(self) -> BiasedMF:
        """The trained model. Stragglers still in flight keep running: a job publishes
        without waiting for them and bills them later (``finish_stragglers``)."""
        return self._require_model()

    def pending_invocations(self) -> list[Future[InvocationRecord]]:
        """Futures of the job's invocations still running, without waiting for them.

        A finished job publishes at once; its stragglers' bills come later. Wait on these
        (or add done callbacks) off the job's thread, then ``finish_stragglers`` returns
        at once and ``stats`` holds every bill.
        """
        return self._invocations.pending()

    def finish_stragglers(self) -> None:
        """Wait for the invocations still running, so their bills are in ``stats``."""
        self._invocations.drain()

    def cleanup(self, *, keep_checkpoint: bool = False) -> int:
        """Delete the job's objects from the store; returns how many were deleted.

        Snapshots, shards and deltas are only needed while the job runs; its checkpoint
        and the window archive beside it only while it can still resume, so
        ``keep_checkpoint=True`` (a job that failed and may be resumed) keeps both. Call
        once no worker of the job runs any more (after ``finish_stragglers``), or a late
        worker writes its delta after the cleanup.
        """
        return self._objects.cleanup(keep_checkpoint=keep_checkpoint)

    def _require_model(self) -> BiasedMF:
        if self._model is None:
            raise RuntimeError("prepare() must be called before training")
        return self._model

    def _require_data(self) -> EncodedWindow:
        if self._data is None:
            raise RuntimeError("prepare() must be called before training")
        return self._data

    @property
    def kinds(self) -> tuple[str, ...]:
        """The worker kinds this coordinator runs epochs of: its runtime's (a
        :class:`~retrain.worker_kinds.KindRouter` names them), else Lambda's and the
        in-process kind's."""
        return tuple(getattr(self.runtime, "kinds", (LAMBDA, IN_PROCESS)))

    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        """One epoch where ``config.kind`` says: workers of that kind on the runtime, or,
        for the in-process kind, this process (:func:`retrain.here.train_here`)."""
        if config.kind not in self.kinds:
            raise ValueError(
                f"worker kind {config.kind!r} is not offered here: this job may run "
                f"{list(self.kinds)} (RETRAIN_WORKER_KINDS)"
            )
        model = self._require_model()
        started = self._now()
        spent_before = sum(r.cost_usd for r in self.stats.invocations)
        recorded_before = len(self.stats.invocations)
        data = self._require_data()
        if config.kind == IN_PROCESS:
            here = train_here(model, data, config, self._epoch, self.seed, self.job_id)
            self._invocations.record(here)
            self._objects.model_moved()
        else:
            self._sync.run(config, self._epoch, model, data)
        self._epoch += 1
        cost = sum(r.cost_usd for r in self.stats.invocations) - spent_before
        loss = model.mse_encoded(data.users, data.items, data.ratings)
        duration = self._now() - started
        self.epochs.append(EpochRecord(self._epoch - 1, loss, duration, config.as_dict(), cost))
        details: dict[str, Any] = {
            "policy": self.policy.name,
            "kappa": self.policy.kappa(config.workers, config.sync_ratio),
            "in_flight": len(self._invocations),
        }
        if self.checkpoint:
            details["checkpoint"] = self.write_checkpoint()
        runs = _worker_runs(self.stats.invocations[recorded_before:], config)
        return EpochOutcome(
            loss=loss, duration_s=duration, cost_usd=cost, details=details, workers=runs
        )

    def _now(self) -> float:
        """Seconds on the runtime's clock: virtual time on the sim runtime (whose
        workers take no real time), real time elsewhere."""
        clock = getattr(self.runtime, "clock", None)
        return float(clock.now) if clock is not None else time.perf_counter()

    # -- checkpoints -----------------------------------------------------------------------
    def write_checkpoint(self) -> str:
        """Checkpoint the coordinator as it stands between epochs; returns the key.

        The model snapshot (and, the first time, the window) is written before the
        checkpoint itself, so a crash at any point leaves the previous checkpoint or a
        complete new one.
        """
        model_ref = self._objects.snapshot(self._require_model())
        window_ref = self._objects.window(self._require_data())
        state = CheckpointState(
            job_id=self.job_id,
            written_at=time.time(),
            next_epoch=self._epoch,
            snapshot_seq=self._objects.snapshots,
            model=ObjectRef(*model_ref),
            window=ObjectRef(*window_ref),
            split=self._objects.sharded_for,
            seed=self.seed,
            policy_name=self.policy.name,
            policy_ratio=self.policy.ratio,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            in_flight=tuple(
                InFlight(r.worker, r.epoch, r.attempt, r.memory_mb, r.task, r.kind)
                for r in self._invocations.running.values()
            ),
            epochs=tuple(dataclasses.asdict(e) for e in self.epochs),
            stats=self.stats.as_dict(),
        )
        return self._objects.write_checkpoint(state)

    @classmethod
    def resume(
        cls,
        runtime: Runtime,
        store: ObjectStore,
        store_url: str,
        job_id: str,
        policy: SyncPolicy | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        checkpoint: bool = True,
    ) -> DistributedBackend | None:
        """A coordinator that carries on job ``job_id`` from its checkpoint; None if none.

        ``policy``, ``timeout_s`` and ``max_retries`` default to the checkpointed ones.
        The model is the checkpointed snapshot and the data the checkpointed window;
        in-flight work is re-queued (see the module docstring). Continue the job with
        ``run_training(..., history=backend.epochs, prepare=False)``.

        Raises
        ------
        CheckpointError
            If the checkpoint, its snapshot or its window is missing, damaged (fails its
            SHA-256) or inconsistent; the message names the key.
        """
        state = read_checkpoint(store, job_id, store_url)
        if state is None:
            return None
        backend = cls(
            runtime,
            store,
            store_url,
            job_id,
            policy or SyncPolicy(state.policy_name, state.policy_ratio),
            seed=state.seed,
            timeout_s=state.timeout_s if timeout_s is None else timeout_s,
            max_retries=state.max_retries if max_retries is None else max_retries,
            checkpoint=checkpoint,
        )
        try:
            backend._restore(state)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            key = checkpoint_key(job_id)
            raise CheckpointError(f"checkpoint {key!r} is malformed: {exc}") from exc
        return backend

    def _restore(self, state: CheckpointState) -> None:
        self._model, self._data = self._objects.restore(state)
        self._shares.reset()
        self._epoch = state.next_epoch
        self.epochs = [EpochRecord(**e) for e in state.epochs]
        self._invocations.adopt(CoordinatorStats.from_dict(state.stats))
        for entry in state.in_flight:
            self._invocations.requeue(
                entry.worker, entry.epoch, entry.attempt, entry.memory_mb, entry.task, entry.kind
            )


def _worker_runs(records: list[InvocationRecord], config: EpochConfig) -> tuple[WorkerRun, ...]:
    """The invocations an epoch recorded, as the configurator sees them: shard samples
    from the worker's result (or the sim runtime's label), duration, cold start."""
    runs = []
    for record in records:
        result = record.result if isinstance(record.result, dict) else {}
        samples = result.get("samples", record.labels.get("samples_trained"))
        if samples is None:
            continue
        runs.append(
            WorkerRun(
                memory_mb=record.memory_mb,
                samples=int(samples),
                duration_s=record.duration_s + record.init_duration_s,
                cold_start=record.cold_start,
                batch_size=config.batch_size,
                ok=record.ok,
                kind=str(record.labels.get("kind", LAMBDA)),
            )
        )
    return tuple(runs)
