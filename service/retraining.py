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

from configurator import EpochConfig, StaticConfigurator
from functions.mf import BiasedMF
from retrain import (
    ConvergenceRule,
    EpochRecord,
    InProcessBackend,
    RatingsWindow,
    WindowPolicy,
    run_training,
    starting_model,
)
from service.metrics import Metrics
from service.registry import LoadedVersion, ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.alerts import attach_alert
from service.store.events import LabelledEvents, labelled_events, max_event_id, sample_labelled
from service.store.jobs import add_epoch, create_job, update_job

log = logging.getLogger(__name__)


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
        if self._background:
            self._thread = threading.Thread(target=self._run, args=(job_id,), daemon=True)
            self._thread.start()
        else:
            self._run(job_id)
        return job_id

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
            "history_sample": s.history_sample,
        }
        with self.db.begin() as conn:
            job_id = create_job(
                conn, policy="adwin", trigger=trigger, runtime="inprocess", params=params
            )
            if alert_id is not None:
                attach_alert(conn, alert_id, job_id)
        return job_id

    def _run(self, job_id: int) -> None:
        started = time.perf_counter()
        try:
            self._train(job_id)
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
        result = run_training(
            model,
            window,
            InProcessBackend(seed=s.seed),
            StaticConfigurator(EpochConfig(s.batch_size, s.learning_rate)),
            ConvergenceRule(
                target_loss=s.target_loss,
                max_epochs=s.max_epochs,
                latency_cap_s=s.latency_cap_seconds,
            ),
            on_epoch=lambda record: self._record_epoch(job_id, record),
        )
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
                cost_usd=result.cost_usd,
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
