"""Distributed retraining: SandPiper's selective-synchronous DSGD through the object store.

Each epoch the coordinator writes the model snapshot φ_t, launches λ workers (one per
shard of the window) on a function runtime, waits for the first κ of them, averages
their updates into φ_{t+1} and goes on (SandPiper Eq. 2). The λ−κ stragglers keep
running while the next epoch starts fresh workers on every shard; their updates,
computed against an older snapshot, are folded in whenever they arrive, as a step of
their own damped by their staleness. κ = λ is BSP, fully synchronous; ASP applies every
update the moment it arrives and relaunches that worker at once. A worker that fails or
times out is retried up to ``max_retries`` times, then dropped for the epoch.

Why stragglers are handled so, and what the alternatives measured:
``docs/decisions/0002-selective-sync-and-stragglers.md``. Checkpoints: see
:mod:`retrain.checkpoints`.

References
----------
SandPiper (Ali et al.), §III-B, Eq. 2; W. Zhang, S. Gupta, X. Lian, J. Liu,
"Staleness-aware async-SGD for distributed deep learning" (IJCAI 2016) for damping a
stale update by its staleness; G. Joshi et al., "Slow and stale gradients can
win the race" (2019) for κ-of-λ synchronisation.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from configurator.base import WorkerRun
from configurator.space import EpochConfig
from functions.artifacts import (
    ArtifactError,
    dump_arrays,
    load_arrays,
    model_from_bytes,
    pack_arrays,
    sha256_hex,
)
from functions.handler import WorkerTask
from functions.mf import BiasedMF
from functions.objectstore import ObjectNotFound, ObjectStore
from functions.runtimes import InvocationRecord, Runtime
from functions.shards import (
    apply_delta,
    average_deltas,
    delta_key,
    job_prefixes,
    read_delta,
    shard_key,
    snapshot_key,
    write_shard,
)
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
from retrain.job import EpochRecord
from retrain.stats import CoordinatorStats, UsedUpdate
from retrain.sync import SyncPolicy
from retrain.window import RatingsWindow

log = logging.getLogger(__name__)


@dataclass(eq=False)  # compared by identity: it holds the delta's arrays
class _Running:
    """An invocation in flight: which shard, against which snapshot, which try."""

    worker: int
    epoch: int
    attempt: int
    task: WorkerTask
    future: Future[InvocationRecord]
    memory_mb: int
    #: The worker's update, read from the store as soon as it arrives.
    delta: dict[str, np.ndarray] | None = None


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
        self.stats = CoordinatorStats()
        self._recorded: set[str] = set()  # request ids in stats.invocations
        #: The epochs run so far, as the job record keeps them (checkpointed).
        self.epochs: list[EpochRecord] = []
        self._model: BiasedMF | None = None
        self._epoch = 0
        # Invocations in flight, by future, in launch order.
        self._running: dict[Future[InvocationRecord], _Running] = {}
        # Futures in the order they completed, appended by their done callbacks.
        self._arrivals: deque[Future[InvocationRecord]] = deque()
        self._sharded_for = 0
        self._snapshots = 0
        # The snapshot holding the model as it is now, until an update changes it.
        self._current: tuple[str, str] | None = None
        self._window: tuple[str, str] | None = None
        self._shares: dict[str, np.ndarray] = {}
        self._shares_for = 0

    # -- TrainingBackend ---------------------------------------------------------------
    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        self._model = model
        self._users = model.encode_users(train.user_ids)
        self._items = model.encode_items(train.item_ids)
        self._ratings = np.asarray(train.ratings, dtype=np.float64)
        self._order = np.random.default_rng(self.seed).permutation(len(self._ratings))
        self._current = self._window = None
        self._shares_for = 0  # new data: shares recomputed

    @property
    def model(self) -> BiasedMF:
        """The model being trained (updated in place each epoch)."""
        return self._require_model()

    @property
    def in_flight(self) -> list[tuple[int, int]]:
        """``(worker, epoch)`` of every invocation still running or not yet collected."""
        return [(r.worker, r.epoch) for r in self._running.values()]

    @property
    def epoch(self) -> int:
        """Epochs finished so far: the number of the next epoch."""
        return self._epoch

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
        return [r.future for r in self._running.values() if not r.future.done()]

    def finish_stragglers(self) -> None:
        """Wait for the invocations still running, so their bills are in ``stats``."""
        self._drain()

    def cleanup(self, *, keep_checkpoint: bool = False) -> int:
        """Delete the job's objects from the store; returns how many were deleted.

        Snapshots, shards and deltas are only needed while the job runs; its checkpoint
        and the window archive beside it only while it can still resume, so
        ``keep_checkpoint=True`` (a job that failed and may be resumed) keeps both. Call
        once no worker of the job runs any more (after ``finish_stragglers``), or a late
        worker writes its delta after the cleanup.
        """
        prefixes = list(job_prefixes(self.job_id))
        if not keep_checkpoint:
            prefixes.append(checkpoint_prefix(self.job_id))
        return sum(self.store.delete_prefix(prefix) for prefix in prefixes)

    def _require_model(self) -> BiasedMF:
        if self._model is None:
            raise RuntimeError("prepare() must be called before training")
        return self._model

    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        model = self._require_model()
        started = self._now()
        spent_before = sum(r.cost_usd for r in self.stats.invocations)
        recorded_before = len(self.stats.invocations)
        self._shard(config.workers)
        snapshot = self._snapshot()
        for worker in self._workers_to_launch(config.workers):
            self._launch(worker, snapshot, config, attempt=0)
        if self.policy.applies_on_arrival:
            self._run_asp(config)
        else:
            self._run_selective(config)
        self._epoch += 1
        cost = sum(r.cost_usd for r in self.stats.invocations) - spent_before
        loss = model.mse_encoded(self._users, self._items, self._ratings)
        duration = self._now() - started
        self.epochs.append(EpochRecord(self._epoch - 1, loss, duration, config.as_dict(), cost))
        details: dict[str, Any] = {
            "policy": self.policy.name,
            "kappa": self.policy.kappa(config.workers, config.sync_ratio),
            "in_flight": len(self._running),
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
        model_ref = self._snapshot()
        window_ref = self._window or self._write_window()
        state = CheckpointState(
            job_id=self.job_id,
            written_at=time.time(),
            next_epoch=self._epoch,
            snapshot_seq=self._snapshots,
            model=ObjectRef(*model_ref),
            window=ObjectRef(*window_ref),
            split=self._sharded_for,
            seed=self.seed,
            policy_name=self.policy.name,
            policy_ratio=self.policy.ratio,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            in_flight=tuple(
                InFlight(r.worker, r.epoch, r.attempt, r.memory_mb, r.task)
                for r in self._running.values()
            ),
            epochs=tuple(dataclasses.asdict(e) for e in self.epochs),
            stats=self.stats.as_dict(),
        )
        key = checkpoint_key(self.job_id)
        self.store.put(key, state.to_json())
        return key

    def _write_window(self) -> tuple[str, str]:
        key = window_key(self.job_id)
        arrays = {
            "users": self._users,
            "items": self._items,
            "ratings": self._ratings,
            "order": self._order,
        }
        data = dump_arrays(arrays)
        self.store.put(key, data)
        self._window = key, sha256_hex(data)
        return self._window

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
        model_ref, window_ref = state.model, state.window
        try:
            model = model_from_bytes(get_verified(self.store, model_ref, "model snapshot"))
        except CheckpointError:
            raise
        except ArtifactError as exc:
            raise CheckpointError(f"model snapshot {model_ref.key!r}: {exc}") from exc
        try:
            arrays = load_arrays(get_verified(self.store, window_ref, "window"))
        except CheckpointError:
            raise
        except ArtifactError as exc:
            raise CheckpointError(f"window {window_ref.key!r}: {exc}") from exc
        missing = sorted({"users", "items", "ratings", "order"} - set(arrays))
        if missing:
            raise CheckpointError(f"window {window_ref.key!r} lacks arrays {missing}")
        users, items = arrays["users"].astype(np.int64), arrays["items"].astype(np.int64)
        ratings, order = arrays["ratings"].astype(np.float64), arrays["order"].astype(np.int64)
        n = len(ratings)
        if not (len(users) == len(items) == n and np.array_equal(np.sort(order), np.arange(n))):
            raise CheckpointError(f"window {window_ref.key!r} arrays disagree in length")
        if n and (users.max() >= model.n_users or items.max() >= model.n_items):
            raise CheckpointError(
                f"window {window_ref.key!r} does not fit snapshot {model_ref.key!r}"
            )
        self._model = model
        self._users, self._items, self._ratings, self._order = users, items, ratings, order
        self._shares_for = 0
        self._current = (model_ref.key, model_ref.sha256)
        self._window = (window_ref.key, window_ref.sha256)
        self._epoch = state.next_epoch
        self._snapshots = max(state.snapshot_seq, self._next_snapshot_in_store())
        split = state.split
        shards = [shard_key(self.job_id, w, split) for w in range(split)]
        self._sharded_for = split if all(self.store.exists(k) for k in shards) else 0
        self.epochs = [EpochRecord(**e) for e in state.epochs]
        self.stats = CoordinatorStats.from_dict(state.stats)
        self._recorded = {r.request_id for r in self.stats.invocations}
        for entry in state.in_flight:
            self._requeue(entry.worker, entry.epoch, entry.attempt, entry.memory_mb, entry.task)

    def _next_snapshot_in_store(self) -> int:
        """One past the highest snapshot in the store: a crashed coordinator may have
        written snapshots after its checkpoint, and snapshots are never overwritten."""
        prefix = snapshot_key(self.job_id, 0).rsplit("/", 1)[0] + "/"
        stems = (k[len(prefix) :].split(".", 1)[0] for k in self.store.list(prefix))
        numbers = [int(stem) for stem in stems if stem.isdigit()]
        return max(numbers, default=-1) + 1

    def _requeue(
        self, worker: int, epoch: int, attempt: int, memory_mb: int, task: WorkerTask
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
            future = self._submit(task, memory_mb)
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
        self._running[future] = _Running(worker, epoch, attempt, task, future, memory_mb, delta)

    def _usable_delta(self, key: str) -> dict[str, np.ndarray] | None:
        """The delta under `key`, or None if it is missing or damaged."""
        if not self.store.exists(key):
            return None
        try:
            return read_delta(self.store, key)
        except (ArtifactError, ObjectNotFound) as exc:
            log.warning("job %s: relaunching the worker of a damaged delta: %s", self.job_id, exc)
            return None

    def _drain(self) -> None:
        """Wait for invocations still running so nothing is left behind the job."""
        for running in self._running.values():
            self._record(running.future.result())
        self._running = {}
        self._arrivals.clear()

    # -- epochs --------------------------------------------------------------------------
    def _run_selective(self, config: EpochConfig) -> None:
        """Wait for κ updates of this epoch; fold in every update that has arrived."""
        kappa = self.policy.kappa(config.workers, config.sync_ratio)
        fresh, arrived = 0, []
        while fresh < kappa and self._running:
            for running in self._completed():
                if self._accept(running, config):
                    arrived.append(running)
                    fresh += running.epoch == self._epoch
        self._apply(arrived, weight=1.0)

    def _run_asp(self, config: EpochConfig) -> None:
        """Apply each update on arrival and relaunch its worker: λ arrivals per epoch.

        Each row of an update is scaled by 1 / (shards holding the row), so that the λ
        updates of an epoch add up to one averaged step per row, as BSP's average
        does; ASP differs from BSP only in applying them one by one, stale.
        """
        shares = self._row_shares(config.workers)
        for _ in range(config.workers):
            done = self._completed(first_only=True)
            for running in done:
                if self._accept(running, config):
                    _scale_rows(running.delta, shares)
                    self._apply([running], weight=1.0)
                if running.worker not in {r.worker for r in self._running.values()}:  # not retrying
                    self._launch(running.worker, self._snapshot(), config, attempt=0)

    def _completed(self, first_only: bool = False) -> list[_Running]:
        """The invocations that completed since the last call (the first one only, with
        ``first_only``), waiting for one if none has. Done callbacks queue them as they
        complete, so that a wait costs nothing when arrivals are already there, which
        they are when λ is large."""
        while not self._arrivals and self._running:
            self.runtime.wait_any(list(self._running))
        count = min(1 if first_only else len(self._arrivals), len(self._arrivals))
        done = [self._arrivals.popleft() for _ in range(count)]
        return [self._running.pop(f) for f in done if f in self._running]

    def _accept(self, running: _Running, config: EpochConfig) -> bool:
        """True if the update is usable, its delta read from the store now, while the
        other workers still run. A failed worker, or one that said ok but whose delta
        is missing or damaged, is retried or dropped."""
        record = running.future.result()
        self._record(record)
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
            retry = self._submit(running.task, config.memory_mb)
            self._running[retry] = _Running(
                running.worker,
                running.epoch,
                running.attempt + 1,
                running.task,
                retry,
                config.memory_mb,
            )
        return False

    def _apply(self, updates: list[_Running], weight: float) -> None:
        """Fold arrived updates into the model: the fresh ones averaged (Eq. 2), then the
        stale ones, averaged by staleness τ and damped to ``weight / (1 + τ)``.

        Damping by staleness follows the staleness-aware rule of Zhang et al. (2016):
        an update computed τ epochs ago gets a step shrunk in proportion. Applied as its
        own step after the fresh average, rather than averaged with it, a straggler's
        update adds its shard's progress instead of diluting the fresh ones'.
        """
        by_staleness: dict[int, list[_Running]] = {}
        for r in updates:
            if r.delta is not None:
                by_staleness.setdefault(self._epoch - r.epoch, []).append(r)
        for staleness, group in sorted(by_staleness.items()):
            group.sort(key=lambda r: (r.epoch, r.worker))  # the same sum whatever the order
            damped = weight / (1 + staleness)
            deltas = [r.delta for r in group if r.delta is not None]
            apply_delta(self._require_model(), average_deltas(deltas), weight=damped)
            self._current = None  # the model moved on from its last snapshot
            for r in group:
                record = r.future.result()
                self.stats.used.append(
                    UsedUpdate(
                        r.worker,
                        r.epoch,
                        self._epoch,
                        record.duration_s,
                        record.cold_start,
                        record.cost_usd,
                        damped,
                        record.request_id,
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

    def _row_shares(self, workers: int) -> dict[str, np.ndarray]:
        """Per user and item row, 1 / (number of the ``workers`` shards holding it)."""
        if self._shares_for != workers:
            model = self._require_model()
            shard_of = np.empty(len(self._order), dtype=np.int64)
            for worker, rows in enumerate(np.array_split(self._order, workers)):
                shard_of[rows] = worker
            self._shares = {}
            for side, codes, size in (
                ("user", self._users, model.n_users),
                ("item", self._items, model.n_items),
            ):
                pairs = np.unique(codes * workers + shard_of)  # distinct (row, shard)
                holding = np.bincount(pairs // workers, minlength=size)
                self._shares[side] = 1.0 / np.maximum(holding, 1)
            self._shares_for = workers
        return self._shares

    def _snapshot(self) -> tuple[str, str]:
        """The snapshot of the model as it is now, written if there is none yet.

        Each is new and never overwritten: in-flight workers may still be reading older
        ones (ASP writes one per update, not per epoch). The one a checkpoint writes is
        the one the next epoch's workers pull.
        """
        if self._current is None:
            data = pack_arrays(self._require_model().to_arrays())
            key = snapshot_key(self.job_id, self._snapshots)
            self._snapshots += 1
            self.store.put(key, data)
            self._current = key, sha256_hex(data)
        return self._current

    def _workers_to_launch(self, workers: int) -> list[int]:
        """The shards an epoch starts workers on.

        Selective sync starts every shard on the new snapshot, also those whose
        straggler from an earlier epoch is still running: waiting for a straggler to
        be free would make the next epoch wait for it after all, and its late update
        is folded in when it comes (SandPiper: the system "continues to launch worker
        functions for subsequent epochs with partial updates"; see
        ``docs/decisions/0002-selective-sync-and-stragglers.md``). BSP has no stragglers
        left between epochs; ASP keeps each shard's one worker busy and relaunches it
        on arrival, so it starts only the idle ones.
        """
        if self.policy.restarts_busy_shards:
            return list(range(workers))
        busy = {r.worker for r in self._running.values()}
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
        future = self._submit(task, config.memory_mb)
        self._running[future] = _Running(
            worker, self._epoch, attempt, task, future, config.memory_mb
        )

    def _submit(self, task: WorkerTask, memory_mb: int) -> Future[InvocationRecord]:
        future = self.runtime.submit(
            task.as_event(),
            memory_mb=memory_mb,
            timeout_s=self.timeout_s,
            worker=task.worker,
            epoch=task.epoch,
        )
        future.add_done_callback(self._arrivals.append)
        return future

    def _record(self, record: InvocationRecord) -> None:
        # A recovered update was billed to the crashed coordinator, which kept no record.
        if record.labels.get("recovered"):
            return
        if record.request_id not in self._recorded:
            self._recorded.add(record.request_id)
            self.stats.invocations.append(record)


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
            )
        )
    return tuple(runs)


def _scale_rows(delta: dict[str, np.ndarray] | None, shares: dict[str, np.ndarray]) -> None:
    """Scale each row of `delta` by its side's share, in place."""
    if delta is None:
        return
    for side, share in shares.items():
        weights = share[delta[f"{side}_rows"]]
        delta[f"{side}_bias"] = delta[f"{side}_bias"] * weights
        delta[f"{side}_factors"] = delta[f"{side}_factors"] * weights[:, None]
