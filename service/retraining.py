"""The service's side of retraining: its data and its records, for ``retrain.Retrainer``.

``retrain/`` owns the job lifecycle; the service supplies the window of events to train
on (``StoreWindowSource``) and keeps job records in its database (``StoreJobRecorder``),
counting finished jobs in its metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from configurator.process import ConfiguratorHost
from configurator.registry import ISOLATED
from retrain import EpochRecord, RatingsWindow
from retrain.convergence import StopReason
from retrain.lifecycle import JobAlreadyRunning, Retrainer
from retrain.spec import JobSpec
from service.alerting import Notifier, NoWebhook, budget_notice, job_failed_notice
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.serving.registry import ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.alerts import attach_alert
from service.store.eventlog import EventLog
from service.store.events import LabelledEvents, max_event_id
from service.store.jobs import (
    AnotherJobActive,
    active_jobs,
    add_epoch,
    create_fenced_job,
    create_job,
    get_job,
    job_trigger,
    update_job,
)
from service.store.versions import version_of_job

log = logging.getLogger(__name__)


class StoreWindowSource:
    """``retrain.WindowSource`` over the event log: the events table and, for windows
    reaching back past it, the archive (``service.store.eventlog``)."""

    def __init__(self, db: Database, event_log: EventLog) -> None:
        self.db = db
        self.event_log = event_log

    def since(self, after_id: int, up_to_id: int) -> RatingsWindow:
        with self.db.connect() as conn:
            return _window(self.event_log.labelled(conn, after_id, up_to_id))

    def uniform_sample(self, up_to_id: int, size: int, seed: int) -> RatingsWindow:
        with self.db.connect() as conn:
            return _window(self.event_log.uniform_sample(conn, up_to_id, size, seed))


def _window(events: LabelledEvents) -> RatingsWindow:
    return RatingsWindow(events.user_ids, events.item_ids, events.ratings)


class StoreJobRecorder:
    """``retrain.lifecycle.JobRecorder`` over the event store's job tables; a failed
    job and one its budget stopped are also told to ``notifier`` (``ALERT_WEBHOOK_URL``),
    and each job's queued, running, succeeded, failed and preempted records to
    ``events`` (the dashboard's live stream), once they are committed.

    With ``fencing_token`` (the cluster's leadership, ``service.cluster``) a job is
    created only under the current leader's token and while no other job is active
    anywhere: the database refuses anything else (``JobAlreadyRunning``, or
    ``NotLeaseHolder`` for a deposed leader)."""

    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        notifier: Notifier | None = None,
        budget_usd: float | None = None,
        events: EventBuffer | None = None,
        fencing_token: Callable[[], int | None] | None = None,
    ) -> None:
        self.db = db
        self.fencing_token = fencing_token
        self.metrics = metrics
        self.notifier: Notifier = notifier or NoWebhook()
        self.budget_usd = budget_usd
        self.events = events
        #: Job id -> trigger of the jobs created or seen here and not yet ended.
        self._triggers: dict[int, str | None] = {}

    def newest_event_id(self) -> int:
        with self.db.connect() as conn:
            return max_event_id(conn)

    def create(self, trigger: str, spec: JobSpec, alert_id: int | None) -> int:
        record: dict[str, Any] = {
            "policy": spec.policy,
            "trigger": trigger,
            "runtime": spec.runtime,
            "params": spec.as_params(),
        }
        with self.db.begin() as conn:
            if self.fencing_token is None:
                job_id = create_job(conn, **record)
            else:
                try:
                    job_id = create_fenced_job(conn, self.fencing_token(), **record)
                except AnotherJobActive as exc:
                    raise JobAlreadyRunning(exc.job_id) from exc
            if alert_id is not None:
                attach_alert(conn, alert_id, job_id)
        self.metrics.retrain_jobs_started.labels(policy=spec.policy, trigger=trigger).inc()
        self._triggers[job_id] = trigger
        self._publish(job_id, "queued")
        return job_id

    def attach_alert(self, alert_id: int, job_id: int) -> None:
        with self.db.begin() as conn:
            attach_alert(conn, alert_id, job_id)

    def started(
        self, job_id: int, *, base_version: str | None, window_events: int, last_event_id: int
    ) -> None:
        self._update(
            job_id,
            status="running",
            started_at=time.time(),
            base_version=base_version,
            window_events=window_events,
            last_event_id=last_event_id,
        )
        self._publish(job_id, "running")

    def epoch(self, job_id: int, record: EpochRecord) -> None:
        with self.db.begin() as conn:
            add_epoch(
                conn,
                job_id,
                epoch=record.epoch,
                loss=record.loss,
                duration_s=record.duration_s,
                # The configurator's decision rides with the config vector it chose.
                config={**record.config, "decision": record.decision}
                if record.decision
                else record.config,
            )

    def succeeded(
        self,
        job_id: int,
        *,
        version: str,
        stop_reason: str,
        cost_usd: float | None = None,
        invocations: list[dict[str, Any]] | None = None,
    ) -> None:
        bill = {} if cost_usd is None else {"cost_usd": cost_usd, "invocations": invocations}
        self._update(
            job_id,
            status="succeeded",
            finished_at=time.time(),
            model_version=version,
            stop_reason=stop_reason,
            **bill,
        )
        self.metrics.retrain_jobs.labels(status="succeeded").inc()
        self.metrics.retrain_stops.labels(reason=stop_reason).inc()
        self._publish(job_id, "succeeded", ended=True)
        if stop_reason == StopReason.BUDGET:
            self.notifier.notify(budget_notice(job_id, cost_usd, self.budget_usd))

    def failed(self, job_id: int, error: str) -> None:
        self._update(job_id, status="failed", error=error, finished_at=time.time())
        self.metrics.retrain_jobs.labels(status="failed").inc()
        self.notifier.notify(job_failed_notice(job_id, error))
        self._publish(job_id, "failed", ended=True)

    def preempted(
        self,
        job_id: int,
        *,
        reason: str,
        cost_usd: float,
        invocations: list[dict[str, Any]] | None,
    ) -> None:
        """A pre-empted job is no failure (no webhook notice): it ended on purpose, with
        its bill so far and why (in ``error``, the record's field for why a job ended
        without a version)."""
        self._update(
            job_id,
            status="preempted",
            finished_at=time.time(),
            stop_reason=StopReason.PREEMPTED,
            error=reason,
            cost_usd=cost_usd,
            invocations=invocations,
        )
        self.metrics.retrain_jobs.labels(status="preempted").inc()
        self.metrics.retrain_stops.labels(reason=StopReason.PREEMPTED).inc()
        self._publish(job_id, "preempted", ended=True)

    def billed(self, job_id: int, *, cost_usd: float, invocations: list[dict[str, Any]]) -> None:
        self._update(job_id, cost_usd=cost_usd, invocations=invocations)

    def active(self) -> list[dict[str, Any]]:
        with self.db.connect() as conn:
            return active_jobs(conn)

    def get(self, job_id: int) -> dict[str, Any] | None:
        with self.db.connect() as conn:
            return get_job(conn, job_id)

    def published_version(self, job_id: int) -> str | None:
        with self.db.connect() as conn:
            row = version_of_job(conn, job_id)
        return None if row is None else str(row["version"])

    def _update(self, job_id: int, **values: Any) -> None:
        with self.db.begin() as conn:
            update_job(conn, job_id, **values)

    def _publish(self, job_id: int, status: str, *, ended: bool = False) -> None:
        """Tell the dashboard's live stream ``job_id`` is now ``status``."""
        if self.events is None:
            return
        if job_id in self._triggers:
            trigger = self._triggers.pop(job_id, None) if ended else self._triggers[job_id]
        else:  # a job resumed or settled after a restart
            trigger = self._stored_trigger(job_id)
            if not ended:
                self._triggers[job_id] = trigger
        self.events.publish("job", {"id": job_id, "status": status, "trigger": trigger})

    def _stored_trigger(self, job_id: int) -> str | None:
        try:
            with self.db.connect() as conn:
                return job_trigger(conn, job_id)
        except SQLAlchemyError:
            log.exception("reading the trigger of job %s", job_id)
            return None


def job_spec(settings: Settings) -> JobSpec:
    """The spec a job started now gets, from the settings."""
    s = settings
    return JobSpec(
        factors=s.factors,
        learning_rate=s.learning_rate,
        regularization=s.regularization,
        batch_size=s.batch_size,
        max_epochs=s.max_epochs,
        target_loss=s.target_loss,
        latency_cap_s=s.latency_cap_seconds,
        drift_latency_cap_s=s.drift_latency_cap_seconds,
        budget_usd=s.retrain_budget_usd,
        history_sample=s.history_sample,
        max_window_events=s.max_window_events,
        workers=s.retrain_workers,
        sync_ratio=s.retrain_sync_ratio,
        memory_mb=s.retrain_memory_mb,
        runtime=s.retrain_runtime,
        sync=s.retrain_sync,
        configurator=s.retrain_configurator,
        policy=s.retrain_policy,
        seed=s.seed,
        drift_history_ratio=s.drift_window_history_ratio,
        change_window_persists=s.drift_window_persists,
        user_change_ratio=s.drift_window_user_change_ratio,
        item_bias_support=s.item_bias_support,
        kinds=s.worker_kinds,
    )


def build_retrainer(
    settings: Settings,
    db: Database,
    registry: ModelRegistry,
    metrics: Metrics,
    *,
    background: bool = True,
    notifier: Notifier | None = None,
    events: EventBuffer | None = None,
    fencing_token: Callable[[], int | None] | None = None,
) -> Retrainer:
    """The retrainer the settings describe, recording into ``db``; job records are
    also published to ``events`` (the dashboard's live stream) when given, and fenced
    by the leader's ``fencing_token`` when given (``StoreJobRecorder``)."""
    recorder = StoreJobRecorder(
        db, metrics, notifier, settings.retrain_budget_usd, events, fencing_token
    )
    return Retrainer(
        lambda: job_spec(settings),
        StoreWindowSource(db, EventLog(registry.store)),
        recorder,
        registry,
        registry.store,
        settings.resolved_object_store_url,
        background=background,
        lambda_function=settings.lambda_function,
        configurator_host=_configurator_host(settings),
        ray_address=settings.ray_address,
    )


def _configurator_host(settings: Settings) -> ConfiguratorHost | None:
    """The process's configurator host where the settings want one; started now when
    this service's jobs will use it, so the first job does not wait for its imports."""
    if not settings.retrain_configurator_process:
        return None
    host = ConfiguratorHost.shared()
    if settings.retrain_enabled and settings.retrain_configurator in ISOLATED:
        host.start()
    return host
