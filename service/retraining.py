"""Runs retraining jobs for the service: one at a time, recorded epoch by epoch.

A job reads its window from the event store, trains through a ``retrain`` backend,
publishes the result to the registry and hands it to the pipeline for a hot swap.
Alerts raised while a job runs are attached to it rather than queued: the job already
trains on the newest data, so a second one would retrain on almost the same window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from configurator import EpochConfig, StaticConfigurator
from functions.handler import handler
from functions.mf import BiasedMF
from functions.runtimes import Runtime, open_runtime
from retrain import (
    ConvergenceRule,
    EpochRecord,
    InProcessBackend,
    JobResult,
    RatingsWindow,
    TrainingBackend,
    WindowPolicy,
    run_training,
    starting_model,
)
from retrain.checkpoints import CheckpointError, read_checkpoint
from retrain.coordinator import DistributedBackend, SyncPolicy
from service.metrics import Metrics
from service.registry import LoadedVersion, ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.alerts import attach_alert
from service.store.events import LabelledEvents, labelled_events, max_event_id, sample_labelled
from service.store.jobs import active_jobs, add_epoch, create_job, get_job, update_job

log = logging.getLogger(__name__)

#: In-flight invocations the local runtime allows per worker: selective sync starts a
#: straggler's shard again while the straggler still runs, as Lambda would.
_LOCAL_CONCURRENCY = 2


class JobAlreadyRunning(RuntimeError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"retraining job {job_id} is still running")
        self.job_id = job_id


class NothingToTrain(RuntimeError):
    pass


class StoreWindowSource:
    """``retrain.WindowSource`` over the event store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def since(self, after_id: int, up_to_id: int) -> RatingsWindow:
        with self.db.connect() as conn:
            return _window(labelled_events(conn, after_id, up_to_id))

    def history_sample(self, up_to_id: int, size: int) -> RatingsWindow:
        with self.db.connect() as conn:
            return _window(sample_labelled(conn, up_to_id, size))


def _window(events: LabelledEvents) -> RatingsWindow:
    return RatingsWindow(events.user_ids, events.item_ids, events.ratings)


class Retrainer:
    """Starts, runs and records retraining jobs.

    Parameters
    ----------
    current
        Returns the version serving now: the warm start and the window's lower bound.
    on_published
        Receives each newly published version (the pipeline swaps it in).
    background
        Run jobs on a thread (the service) or inline in ``request`` (the benchmark,
        where reproducibility matters more than ingestion never waiting).
    """

    def __init__(
        self,
        settings: Settings,
        db: Database,
        registry: ModelRegistry,
        metrics: Metrics,
        current: Callable[[], LoadedVersion | None],
        on_published: Callable[[LoadedVersion], None],
        background: bool = True,
    ) -> None:
        self.settings = settings
        self.db = db
        self.registry = registry
        self.metrics = metrics
        self._current = current
        self._on_published = on_published
        self._background = background
        self._lock = threading.Lock()
        self._active: int | None = None
        self._thread: threading.Thread | None = None
        self.training_seconds = 0.0
        self._runtime: Runtime | None = None

    @property
    def active_job_id(self) -> int | None:
        return self._active

    def request(self, trigger: str, alert_id: int | None = None, *, exclusive: bool = False) -> int:
        """Start a job (or attach ``alert_id`` to the running one); returns its id.

        With ``exclusive`` a running job is an error (``JobAlreadyRunning``), which is
        what a person asking for a retrain by hand wants to hear.
        """
        with self._lock:
            if self._active is not None:
                if exclusive:
                    raise JobAlreadyRunning(self._active)
                if alert_id is not None:
                    with self.db.begin() as conn:
                        attach_alert(conn, alert_id, self._active)
                return self._active
            with self.db.connect() as conn:
                if max_event_id(conn) == 0:
                    raise NothingToTrain("no events stored yet: nothing to train on")
            job_id = self._create(trigger, alert_id)
            self._active = job_id
        self._start(job_id, self._train)
        return job_id

    def _start(self, job_id: int, train: Callable[[int], None]) -> None:
        if self._background:
            self._thread = threading.Thread(target=self._run, args=(job_id, train), daemon=True)
            self._thread.start()
        else:
            self._run(job_id, train)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running job (if any) has finished."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _create(self, trigger: str, alert_id: int | None) -> int:
        s = self.settings
        params = {
            "factors": s.factors,
            "learning_rate": s.learning_rate,
            "regularization": s.regularization,
            "batch_size": s.batch_size,
            "max_epochs": s.max_epochs,
            "target_loss": s.target_loss,
            "latency_cap_s": s.latency_cap_seconds,
            "budget_usd": s.retrain_budget_usd,
            "history_sample": s.history_sample,
            "workers": s.retrain_workers,
            "sync_ratio": s.retrain_sync_ratio,
            "memory_mb": s.retrain_memory_mb,
        }
        with self.db.begin() as conn:
            job_id = create_job(
                conn, policy="adwin", trigger=trigger, runtime=s.retrain_runtime, params=params
            )
            if alert_id is not None:
                attach_alert(conn, alert_id, job_id)
        return job_id

    def _run(self, job_id: int, train: Callable[[int], None]) -> None:
        started = time.perf_counter()
        try:
            train(job_id)
        except Exception as exc:  # a failed job must be recorded, never kill the service
            log.exception("retraining job %s failed", job_id)
            with self.db.begin() as conn:
                update_job(conn, job_id, status="failed", error=str(exc), finished_at=time.time())
            self.metrics.retrain_jobs.labels(status="failed").inc()
        finally:
            self.training_seconds += time.perf_counter() - started
            with self._lock:
                self._active = None

    def _train(self, job_id: int) -> None:
        s = self.settings
        base = self._current()
        since = base.last_event_id if base else 0
        with self.db.connect() as conn:
            up_to = max_event_id(conn)
        window = WindowPolicy(s.history_sample).build(StoreWindowSource(self.db), since, up_to)
        with self.db.begin() as conn:
            update_job(
                conn,
                job_id,
                status="running",
                started_at=time.time(),
                base_version=base.version if base else None,
                window_events=len(window),
                last_event_id=up_to,
            )
        template = BiasedMF(s.factors, s.learning_rate, s.regularization, seed=s.seed)
        model = starting_model(base.model if base else None, template, window)
        backend = self._backend(job_id)
        result = run_training(
            model,
            window,
            backend,
            StaticConfigurator(self._epoch_config()),
            self._rule(),
            on_epoch=lambda record: self._record_epoch(job_id, record),
        )
        self._publish(job_id, result, backend, up_to)

    def _epoch_config(self) -> EpochConfig:
        s = self.settings
        return EpochConfig(
            s.batch_size,
            s.learning_rate,
            workers=s.retrain_workers,
            sync_ratio=s.retrain_sync_ratio,
            memory_mb=s.retrain_memory_mb,
        )

    def _rule(self) -> ConvergenceRule:
        s = self.settings
        return ConvergenceRule(
            target_loss=s.target_loss,
            max_epochs=s.max_epochs,
            latency_cap_s=s.latency_cap_seconds,
            budget_usd=s.retrain_budget_usd,
        )

    def _publish(
        self, job_id: int, result: JobResult, backend: TrainingBackend, up_to: int
    ) -> None:
        """Publish a finished job's model, swap it in and close the job record."""
        invocations = _invocations(backend)  # stragglers finished after the last epoch count
        published = self.registry.publish(
            result.model, last_event_id=up_to, job_id=job_id, rmse=result.holdout_rmse
        )
        self._on_published(published)
        with self.db.begin() as conn:
            update_job(
                conn,
                job_id,
                status="succeeded",
                finished_at=time.time(),
                model_version=published.version,
                stop_reason=str(result.stop_reason),
                cost_usd=sum(i["cost_usd"] for i in invocations) if invocations else 0.0,
                invocations=invocations,
            )
        self.metrics.retrain_jobs.labels(status="succeeded").inc()
        log.info(
            "job %s: %s after %d epochs, holdout rmse %s -> %s",
            job_id,
            result.stop_reason,
            len(result.epochs),
            result.holdout_rmse,
            published.version,
        )

    # -- restarts -------------------------------------------------------------------
    def resume_interrupted(self) -> int | None:
        """Carry on the job a previous process left running; returns its id, if any.

        A distributed job checkpoints its coordinator after every epoch, so a restart
        loses at most the epoch in flight: the newest running job with a checkpoint
        resumes from it (in the background, like any job), its stragglers' updates
        still used. Jobs that cannot resume (in-process training, no checkpoint yet, a
        damaged one) are marked failed, saying why, rather than shown running forever.
        """
        with self.db.connect() as conn:
            jobs = active_jobs(conn)
        resumable: int | None = None
        reasons: dict[int, str] = {}
        for job in sorted(jobs, key=lambda j: int(j["id"]), reverse=True):
            if resumable is None:
                reason = self._why_not_resumable(job)
            else:
                reason = f"interrupted by a restart; job {resumable}, newer, resumed instead"
            if reason is None:
                resumable = int(job["id"])
            else:
                reasons[int(job["id"])] = reason
        with self.db.begin() as conn:
            for job_id, reason in reasons.items():
                update_job(conn, job_id, status="failed", error=reason, finished_at=time.time())
        for job_id, reason in reasons.items():
            log.warning("retraining job %s: %s", job_id, reason)
        if resumable is None:
            return None
        with self._lock:
            self._active = resumable
        log.info("retraining job %s: resuming from its checkpoint", resumable)
        self._start(resumable, self._resume)
        return resumable

    def _why_not_resumable(self, job: dict[str, Any]) -> str | None:
        if job["runtime"] == "inprocess" or self.settings.retrain_runtime == "inprocess":
            return "interrupted by a restart (in-process training keeps no checkpoint)"
        if job["status"] != "running" or job["last_event_id"] is None:
            return "interrupted by a restart before it started"
        try:
            found = read_checkpoint(self.registry.store, _coordinator_job(int(job["id"])))
        except CheckpointError as exc:
            return f"interrupted by a restart; its checkpoint is unusable: {exc}"
        if found is None:
            return "interrupted by a restart before its first checkpoint"
        return None

    def _resume(self, job_id: int) -> None:
        with self.db.connect() as conn:
            job = get_job(conn, job_id)
        assert job is not None
        since = 0
        if job["base_version"] is not None:
            since = self.registry.load(job["base_version"]).last_event_id
        up_to = int(job["last_event_id"])
        # The same window as before the restart: events (since, up_to] and the same
        # evenly spaced history sample; only its holdout is used, the coordinator's
        # checkpoint holds the training part.
        window = WindowPolicy(self.settings.history_sample).build(
            StoreWindowSource(self.db), since, up_to
        )
        backend = DistributedBackend.resume(
            self._function_runtime(),
            self.registry.store,
            self.settings.resolved_object_store_url,
            _coordinator_job(job_id),
        )
        if backend is None:
            raise RuntimeError(f"the checkpoint of job {job_id} disappeared")
        recorded = {int(e["epoch"]) for e in job["epochs"]}
        for record in backend.epochs:  # an epoch checkpointed just before the crash
            if record.epoch not in recorded:
                self._record_epoch(job_id, record)
        result = run_training(
            None,
            window,
            backend,
            StaticConfigurator(self._epoch_config()),
            self._rule(),
            on_epoch=lambda record: self._record_epoch(job_id, record),
            history=backend.epochs,
            prepare=False,
        )
        self._publish(job_id, result, backend, up_to)

    def _function_runtime(self) -> Runtime:
        """The runtime the settings name, opened once and kept (warm containers)."""
        if self._runtime is None:
            s = self.settings
            options: dict[str, dict[str, Any]] = {
                "local": {"concurrency": _LOCAL_CONCURRENCY * s.retrain_workers},
                "lambda": {"function_name": s.lambda_function},
                "sim": {"execute": handler},
            }
            self._runtime = open_runtime(s.retrain_runtime, **options.get(s.retrain_runtime, {}))
        return self._runtime

    def _backend(self, job_id: int) -> TrainingBackend:
        """Where this job's epochs run, as the settings say."""
        s = self.settings
        if s.retrain_runtime == "inprocess":
            return InProcessBackend(seed=s.seed)
        ratio = s.retrain_sync_ratio
        policy = SyncPolicy.bsp() if ratio >= 1 else SyncPolicy.selective(ratio)
        return DistributedBackend(
            self._function_runtime(),
            self.registry.store,
            s.resolved_object_store_url,
            _coordinator_job(job_id),
            policy,
            seed=s.seed or 0,
        )

    def close(self) -> None:
        """Stop the worker processes of the function runtime, if any were started."""
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def _record_epoch(self, job_id: int, record: EpochRecord) -> None:
        with self.db.begin() as conn:
            add_epoch(
                conn,
                job_id,
                epoch=record.epoch,
                loss=record.loss,
                duration_s=record.duration_s,
                config=record.config,
            )


def _coordinator_job(job_id: int) -> str:
    """The coordinator's name for a job: its snapshots, deltas and checkpoint keys."""
    return f"job-{job_id}"


def _invocations(backend: TrainingBackend) -> list[dict[str, Any]] | None:
    """The job record's view of its worker invocations (distributed backends only):
    timings, outcome and cost, and for each update the epoch it was folded into
    (``applied_in``, None if it never was) with the share of its step (``weight``)."""
    if not isinstance(backend, DistributedBackend):
        return None
    keep = ("request_id", "status", "cold_start", "memory_mb", "queued_s", "duration_s")
    keep += ("init_duration_s", "billed_ms", "cost_usd", "error")
    used = {u.request_id: u for u in backend.stats.used}
    rows = []
    for r in backend.stats.invocations:
        update = used.get(r.request_id)
        rows.append(
            {
                **{k: getattr(r, k) for k in keep},
                **{k: r.labels.get(k) for k in ("worker", "epoch")},
                "applied_in": update.applied_in if update else None,
                "weight": update.weight if update else None,
            }
        )
    return rows
