"""One distributed epoch: launch its workers on the newest snapshot and wait for their
updates as the sync policy says, folding each in as it is accepted.

Selective sync waits for κ fresh updates and folds in every update that has arrived,
stragglers' included; ASP applies each update on arrival and relaunches its worker.
"""

from __future__ import annotations

from configurator.space import EpochConfig
from functions.handler import WorkerTask
from functions.mf import BiasedMF
from functions.shards import delta_key, shard_key
from retrain.folding import RowShares, fold_updates, scale_rows
from retrain.invocations import Invocations, Running
from retrain.job_objects import EncodedWindow, JobObjects
from retrain.sync import SyncPolicy


class EpochSync:
    """Runs a coordinator's epochs: launches, waits and folds, under ``policy``."""

    def __init__(
        self,
        policy: SyncPolicy,
        invocations: Invocations,
        objects: JobObjects,
        shares: RowShares,
        *,
        store_url: str,
        seed: int,
    ) -> None:
        self._policy = policy
        self._invocations = invocations
        self._objects = objects
        self._shares = shares
        self._store_url = store_url
        self._seed = seed

    def run(self, config: EpochConfig, epoch: int, model: BiasedMF, data: EncodedWindow) -> None:
        """Epoch ``epoch`` of ``model`` on ``data``, until the policy stops waiting."""
        self._objects.shard(config.workers, data)
        snapshot = self._objects.snapshot(model)
        for worker in self._workers_to_launch(config.workers):
            self._launch(worker, snapshot, config, epoch, model)
        if self._policy.applies_on_arrival:
            self._run_asp(config, epoch, model, data)
        else:
            self._run_selective(config, epoch, model)

    def _run_selective(self, config: EpochConfig, epoch: int, model: BiasedMF) -> None:
        """Wait for κ updates of this epoch; fold in every update that has arrived."""
        kappa = self._policy.kappa(config.workers, config.sync_ratio)
        fresh, arrived = 0, []
        while fresh < kappa and self._invocations.running:
            for running in self._invocations.completed():
                if self._invocations.accept(running, config.memory_mb):
                    arrived.append(running)
                    fresh += running.epoch == epoch
        self._fold(arrived, epoch, model)

    def _run_asp(
        self, config: EpochConfig, epoch: int, model: BiasedMF, data: EncodedWindow
    ) -> None:
        """Apply each update on arrival and relaunch its worker: λ arrivals per epoch.

        Each row of an update is scaled by 1 / (shards holding the row), so that the λ
        updates of an epoch add up to one averaged step per row, as BSP's average
        does; ASP differs from BSP only in applying them one by one, stale.
        """
        shares = self._shares.shares(config.workers, model, data.users, data.items, data.order)
        for _ in range(config.workers):
            done = self._invocations.completed(first_only=True)
            for running in done:
                if self._invocations.accept(running, config.memory_mb):
                    scale_rows(running.delta, shares)
                    self._fold([running], epoch, model)
                if running.worker not in self._invocations.busy_workers():  # not retrying
                    snapshot = self._objects.snapshot(model)
                    self._launch(running.worker, snapshot, config, epoch, model)

    def _fold(self, updates: list[Running], epoch: int, model: BiasedMF) -> None:
        used = self._invocations.stats.used
        fold_updates(model, updates, epoch, 1.0, used, self._objects.model_moved)

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
        if self._policy.restarts_busy_shards:
            return list(range(workers))
        busy = self._invocations.busy_workers()
        return [w for w in range(workers) if w not in busy]

    def _launch(
        self,
        worker: int,
        snapshot: tuple[str, str],
        config: EpochConfig,
        epoch: int,
        model: BiasedMF,
    ) -> None:
        key, digest = snapshot
        job_id = self._objects.job_id
        task = WorkerTask(
            store_url=self._store_url,
            job_id=job_id,
            epoch=epoch,
            worker=worker,
            snapshot_key=key,
            shard_key=shard_key(job_id, worker, config.workers),
            delta_key=delta_key(job_id, epoch, worker),
            batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            regularization=model.regularization,
            seed=self._seed,
            snapshot_sha256=digest,
        )
        self._invocations.launch(task, config.memory_mb, attempt=0, kind=config.kind)
