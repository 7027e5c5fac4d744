"""Running one retraining job: train (or resume), publish or record pre-emption, record
failure, and settle its stragglers' bills and objects in the background.

The order of a successful job is fixed so a crash anywhere loses nothing and repeats
nothing; see :mod:`retrain.lifecycle`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from functions.mf import BiasedMF
from retrain.backends import TrainingBackend
from retrain.convergence import StopReason
from retrain.coordinator import DistributedBackend
from retrain.job import JobResult, run_training, starting_model
from retrain.placement import Placement
from retrain.ports import JobRecorder, VersionLike, VersionPublisher
from retrain.spec import JobSpec
from retrain.threads import JobThreads
from retrain.window import RatingsWindow, WindowSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRun:
    """A job being trained: what it needs to finish."""

    job_id: int
    spec: JobSpec
    backend: TrainingBackend
    up_to: int


class JobRunner:
    """Trains, concludes and records jobs, one call per job, on the caller's thread.

    Parameters
    ----------
    published
        Set whenever a job has published a version (the retrainer's ``published``).
    preempted_by
        Why the running job was pre-empted, if it was (read when it concludes).
    threads, background
        Where a job's stragglers are waited for: on a thread of ``threads`` if
        ``background``, else inline.
    """

    def __init__(
        self,
        windows: WindowSource,
        recorder: JobRecorder,
        registry: VersionPublisher,
        placement: Placement,
        *,
        published: threading.Event,
        preempted_by: Callable[[], str | None],
        threads: JobThreads,
        background: bool,
    ) -> None:
        self._windows = windows
        self._recorder = recorder
        self._registry = registry
        self._placement = placement
        self._published = published
        self._preempted_by = preempted_by
        self._threads = threads
        self._background = background

    # -- training ---------------------------------------------------------------------
    def train(
        self, job_id: int, spec: JobSpec, base: VersionLike | None, interrupt: threading.Event
    ) -> JobRun:
        """Train a new job warm-started from ``base``, then conclude it."""
        since = base.last_event_id if base else 0
        up_to = self._recorder.newest_event_id()
        window = spec.window_policy().build(
            self._windows, since, up_to, base.model if base else None
        )
        self._recorder.started(
            job_id,
            base_version=base.version if base else None,
            window_events=len(window),
            last_event_id=up_to,
        )
        template = BiasedMF(spec.factors, spec.learning_rate, spec.regularization, seed=spec.seed)
        model = starting_model(base.model if base else None, template, window)
        backend = self._placement.backend(job_id, spec)
        run = JobRun(job_id, spec, backend, up_to)
        return self._run_and_conclude(run, window, model, model, interrupt)

    def resume(self, job: dict[str, Any], interrupt: threading.Event) -> JobRun:
        """Carry on the job ``job`` records from its coordinator's checkpoint."""
        job_id = int(job["id"])
        spec = JobSpec.from_params({**job["params"], "runtime": job["runtime"]})
        since, base_model = 0, None
        if job["base_version"] is not None:
            base = self._registry.load(job["base_version"])
            since, base_model = base.last_event_id, base.model
        up_to = int(job["last_event_id"])
        # The same window as before the restart: the same events after the version (or
        # the change point) and the same seeded history sample; only its holdout is
        # used, the coordinator's checkpoint holds the training part.
        window = spec.window_policy().build(self._windows, since, up_to, base_model)
        backend = self._placement.resumed_backend(job_id, spec)
        if backend is None:
            raise RuntimeError(f"the checkpoint of job {job_id} disappeared")
        recorded = {int(e["epoch"]) for e in job["epochs"]}
        for record in backend.epochs:  # an epoch checkpointed just before the crash
            if record.epoch not in recorded:
                self._recorder.epoch(job_id, record)
        run = JobRun(job_id, spec, backend, up_to)
        return self._run_and_conclude(
            run, window, None, backend.model, interrupt, history=backend.epochs, prepare=False
        )

    def _run_and_conclude(
        self,
        run: JobRun,
        window: RatingsWindow,
        model: BiasedMF | None,
        configured_for: BiasedMF,
        interrupt: threading.Event,
        **resumed: Any,
    ) -> JobRun:
        """Run ``run``'s epochs from ``model`` (None: the backend's checkpoint), then
        publish or record it; ``resumed`` carries a resumed job's epochs."""
        spec, job_id = run.spec, run.job_id
        try:
            result = run_training(
                model,
                window,
                run.backend,
                self._placement.configurator(job_id, spec, window, configured_for),
                spec.rule(),
                on_epoch=lambda record: self._recorder.epoch(job_id, record),
                item_bias_support=spec.item_bias_support,
                interrupt=interrupt,
                **resumed,
            )
            self._conclude(run, result)
        except Exception:  # in training or in recording: bill the stragglers all the same
            self.finish_in_background(run, keep_checkpoint=False)
            raise
        return run

    # -- ending -----------------------------------------------------------------------
    def _conclude(self, run: JobRun, result: JobResult) -> None:
        """Publish the job's version, or record that it was pre-empted and has none."""
        if result.stop_reason != StopReason.PREEMPTED:
            self._publish(run, result)
            return
        stats = getattr(run.backend, "stats", None)  # distributed: the bill so far
        reason = self._preempted_by() or "pre-empted"
        self._recorder.preempted(
            run.job_id,
            reason=reason,
            cost_usd=stats.cost_usd if stats else 0.0,
            invocations=stats.invocation_report() if stats else None,
        )
        log.info(
            "job %s: %s after %d epochs; nothing published", run.job_id, reason, len(result.epochs)
        )

    def _publish(self, run: JobRun, result: JobResult) -> None:
        """Publish (once per job), record success, then announce the version."""
        published = self._registry.publish(
            result.model, last_event_id=run.up_to, job_id=run.job_id, rmse=result.holdout_rmse
        )
        stats = getattr(run.backend, "stats", None)  # distributed: the bill so far
        self._recorder.succeeded(
            run.job_id,
            version=published.version,
            stop_reason=str(result.stop_reason),
            cost_usd=stats.cost_usd if stats else 0.0,
            invocations=stats.invocation_report() if stats else None,
        )
        self._published.set()
        log.info(
            "job %s: %s after %d epochs, holdout rmse %s -> %s",
            run.job_id,
            result.stop_reason,
            len(result.epochs),
            result.holdout_rmse,
            published.version,
        )

    def record_failure(self, job_id: int, exc: Exception) -> None:
        """Record ``job_id`` failed, unless it published before the error (recording its
        success failed): serving follows the registry, so the job record must say what
        serving will serve, not that the job failed."""
        try:
            if self._recorder.published_version(job_id) is not None:
                # The stop reason is short (a column of 32); the error is in the log.
                self.already_published(job_id, "published; recorded late")
                return
            self._recorder.failed(job_id, str(exc))
        except Exception:  # the store is down: the job stays running; a restart settles it
            log.exception("retraining job %s: could not record how it ended", job_id)

    def already_published(self, job_id: int, stop_reason: str) -> bool:
        """A job that published, but whose success was not recorded (a crash or a store
        error in between): record it now."""
        version = self._recorder.published_version(job_id)
        if version is None:
            return False
        self._recorder.succeeded(job_id, version=version, stop_reason=stop_reason)
        self._published.set()
        log.info(
            "retraining job %s had published %s before its success was recorded", job_id, version
        )
        return True

    # -- stragglers -------------------------------------------------------------------
    def finish_in_background(self, run: JobRun, *, keep_checkpoint: bool) -> None:
        """Bill the stragglers when they finish, then delete the job's objects.

        Runs off the job's thread: the job is recorded and published before its
        stragglers finish (selective sync leaves up to λ−κ workers running). A thread
        waits for them rather than done callbacks alone, because simulated invocations
        only complete while someone waits on them. The checkpoint goes too: a job that
        ended, succeeded or failed, is never resumed (only jobs a dead process left
        running are).
        """
        if not isinstance(run.backend, DistributedBackend):
            return
        backend = run.backend
        if not backend.pending_invocations():  # nothing left running: no thread needed
            self._settle(run.job_id, backend, keep_checkpoint=keep_checkpoint)
            return

        def finish() -> None:
            self._settle(run.job_id, backend, keep_checkpoint=keep_checkpoint)

        if self._background:
            self._threads.start(
                threading.Thread(target=finish, name=f"stragglers-{run.job_id}", daemon=True)
            )
        else:
            finish()

    def _settle(self, job_id: int, backend: DistributedBackend, *, keep_checkpoint: bool) -> None:
        """Wait for the stragglers, record the job's whole bill, delete its objects."""
        try:
            backend.finish_stragglers()
            self._recorder.billed(
                job_id,
                cost_usd=backend.stats.cost_usd,
                invocations=backend.stats.invocation_report(),
            )
            deleted = backend.cleanup(keep_checkpoint=keep_checkpoint)
            log.info("job %s: deleted %d objects of its own", job_id, deleted)
        except Exception:  # bookkeeping after the fact must not take the service down
            log.exception("job %s: could not finish its stragglers' bookkeeping", job_id)
