"""The life of a retraining job: created, run (or resumed), recorded, published, cleaned up.

``Retrainer`` is the one owner of jobs. The service gives it three things and gets no
calls back on the job thread: a ``WindowSource`` (the events to train on), a
``JobRecorder`` (where job records live) and a ``VersionPublisher`` (the model registry).
The order of a successful job is fixed so a crash anywhere loses nothing and repeats
nothing:

1. train, epoch by epoch, each epoch recorded (and, for distributed jobs, checkpointed);
2. publish the model: at most one version per job, so a job resumed after a crash
   between this step and the next finds its version instead of publishing it again;
3. record the job succeeded, naming the version;
4. announce it (``published``): serving follows the registry, as it does for versions
   other processes publish, and swaps on its own thread;
5. in the background, wait for the stragglers still running, record their bills, and
   delete the job's snapshots, shards, deltas and checkpoint from the object store.

One job runs at a time; alerts raised meanwhile are attached to it, since it already
trains on the newest data. A scheduled job (a refresh) may be pre-empted instead
(``Retrainer.preempt``): it stops after the epoch in flight, publishes nothing, is
recorded ``preempted`` and its objects are deleted, so the drift job an alert asks for
starts at once rather than after a job whose window predates the change.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from configurator import Configurator, History, JobContext, make_configurator
from configurator.process import ConfiguratorHost
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore
from functions.runtimes import Runtime, open_runtime
from functions.shards import job_prefixes
from retrain.backends import InProcessBackend, TrainingBackend
from retrain.checkpoints import CheckpointError, checkpoint_prefix, read_checkpoint
from retrain.convergence import StopReason
from retrain.coordinator import DistributedBackend
from retrain.job import EpochRecord, JobResult, run_training, starting_model
from retrain.spec import JobSpec
from retrain.stats import CoordinatorStats
from retrain.sync import sync_policy
from retrain.window import RatingsWindow, WindowSource

log = logging.getLogger(__name__)

#: The most workers a configurator may pick per runtime: Lambda's default concurrency
#: (the sim runtime simulates it); on runtimes of this machine's processes or threads,
#: the spec's own λ, since more than that only contend for its cores.
_MAX_WORKERS = {"lambda": 1000, "sim": 1000}

#: Triggers whose jobs a drift alert does not pre-empt: the first version (nothing
#: serves without it), the answer to an alert, and a job a person asked for. Jobs a
#: policy schedules (refresh, periodic, batch, ...) may be pre-empted.
UNPREEMPTIBLE_TRIGGERS = frozenset({"bootstrap", "drift", "manual"})

#: In-flight invocations the local runtime allows per worker: selective sync starts a
#: straggler's shard again while the straggler still runs, as Lambda would.
_LOCAL_CONCURRENCY = 2


class JobAlreadyRunning(RuntimeError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"retraining job {job_id} is still running")
        self.job_id = job_id


class NothingToTrain(RuntimeError):
    pass


class VersionLike(Protocol):
    """A model version as the registry hands it out."""

    @property
    def version(self) -> str: ...

    @property
    def model(self) -> BiasedMF: ...

    @property
    def last_event_id(self) -> int: ...


class VersionPublisher(Protocol):
    """The model registry, as jobs use it."""

    def publish(
        self, model: BiasedMF, *, last_event_id: int, job_id: int | None, rmse: float | None
    ) -> VersionLike: ...

    def load(self, version: str) -> VersionLike: ...


class JobRecorder(Protocol):
    """Where job records live (the service's event store)."""

    def newest_event_id(self) -> int: ...

    def create(self, trigger: str, spec: JobSpec, alert_id: int | None) -> int: ...

    def attach_alert(self, alert_id: int, job_id: int) -> None: ...

    def started(
        self, job_id: int, *, base_version: str | None, window_events: int, last_event_id: int
    ) -> None: ...

    def epoch(self, job_id: int, record: EpochRecord) -> None: ...

    def succeeded(
        self,
        job_id: int,
        *,
        version: str,
        stop_reason: str,
        cost_usd: float | None = None,
        invocations: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record the job succeeded with ``version``; its bill too, if ``cost_usd`` is
        given (a job recorded after a restart keeps the bill recorded so far)."""
        ...

    def failed(self, job_id: int, error: str) -> None: ...

    def preempted(
        self,
        job_id: int,
        *,
        reason: str,
        cost_usd: float,
        invocations: list[dict[str, Any]] | None,
    ) -> None:
        """Record the job ended without a version because ``reason`` pre-empted it."""
        ...

    def billed(
        self, job_id: int, *, cost_usd: float, invocations: list[dict[str, Any]]
    ) -> None: ...

    def active(self) -> list[dict[str, Any]]:
        """Jobs recorded queued or running; at start-up, those a previous process left."""
        ...

    def get(self, job_id: int) -> dict[str, Any] | None: ...

    def published_version(self, job_id: int) -> str | None: ...


@dataclass(frozen=True)
class _Run:
    """A job being trained: what it needs to finish."""

    job_id: int
    spec: JobSpec
    backend: TrainingBackend
    up_to: int


#: Runtimes that train in this process, without workers or checkpoints.
IN_PROCESS_BACKENDS: dict[str, Callable[[JobSpec], TrainingBackend]] = {
    "inprocess": lambda spec: InProcessBackend(seed=spec.seed),
}


class Retrainer:
    """Starts, runs, resumes and records retraining jobs.

    Parameters
    ----------
    spec
        Returns the spec a new job gets (the settings as they are now).
    background
        Run jobs on a thread (the service) or inline in ``request`` (benchmarks and
        tests, where reproducibility matters more than ingestion never waiting).
    lambda_function
        The deployed worker the ``lambda`` runtime invokes.
    """

    def __init__(
        self,
        spec: Callable[[], JobSpec],
        windows: WindowSource,
        recorder: JobRecorder,
        registry: VersionPublisher,
        store: ObjectStore,
        store_url: str,
        *,
        background: bool = True,
        lambda_function: str = "driftline-worker",
        configurator_host: ConfiguratorHost | None = None,
    ) -> None:
        self._spec = spec
        self._windows = windows
        self._recorder = recorder
        self._registry = registry
        self._store = store
        self._store_url = store_url
        self._background = background
        self._lambda_function = lambda_function
        self._lock = threading.Lock()
        self._active: int | None = None
        self._active_base: str | None = None
        #: The running job's trigger, its interrupt and why it was set (``preempt``).
        self._active_trigger: str | None = None
        self._interrupt = threading.Event()
        self._preempted_by: str | None = None
        #: The latest drift alert's change point (see ``_change_point``).
        self._regime_change: int | None = None
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()
        self._runtimes: dict[str, Runtime] = {}
        self.training_seconds = 0.0
        #: Set whenever a job has published a version; serving follows the registry.
        self.published = threading.Event()
        #: Where numeric configurators decide (None: in this process). Not ours to
        #: close: one host serves every retrainer of the process.
        self._configurator_host = configurator_host

    @property
    def active_job_id(self) -> int | None:
        return self._active

    @property
    def active_base_version(self) -> str | None:
        """The version the running job builds on (retention must keep it)."""
        return self._active_base

    # -- starting ---------------------------------------------------------------------
    def request(
        self,
        trigger: str,
        alert_id: int | None = None,
        *,
        base: VersionLike | None = None,
        exclusive: bool = False,
        change_after_id: int | None = None,
    ) -> int:
        """Start a job warm-started from ``base`` (or attach ``alert_id`` to the running
        one); returns its id. With ``exclusive`` a running job is an error
        (``JobAlreadyRunning``), which is what a person asking by hand wants to hear.

        ``change_after_id`` is the last event before the change point of the alert that
        asks: where the spec has a ``drift_history_ratio``, the job's window starts
        there (``retrain.window.ChangeWindowPolicy``), and the spec records it so a
        resumed job rebuilds the same window. Later jobs may keep it
        (``_change_point``)."""
        with self._lock:
            if self._active is not None:
                if exclusive:
                    raise JobAlreadyRunning(self._active)
                if alert_id is not None:
                    self._recorder.attach_alert(alert_id, self._active)
                return self._active
            if self._recorder.newest_event_id() == 0:
                raise NothingToTrain("no events stored yet: nothing to train on")
            spec = self._spec().for_trigger(trigger)
            change_after_id = self._change_point(trigger, change_after_id, spec)
            if change_after_id is not None and spec.drift_history_ratio is not None:
                spec = replace(spec, change_after_id=change_after_id)
            job_id = self._recorder.create(trigger, spec, alert_id)
            self._activate(job_id, base.version if base else None, trigger)
            interrupt = self._interrupt
        self._start(job_id, lambda: self._train(job_id, spec, base, interrupt))
        return job_id

    def _activate(self, job_id: int, base_version: str | None, trigger: str | None) -> None:
        """Make ``job_id`` the running job, with an interrupt of its own (under the lock)."""
        self._active = job_id
        self._active_base = base_version
        self._active_trigger = trigger
        self._interrupt = threading.Event()
        self._preempted_by = None

    def preempt(self, reason: str) -> int | None:
        """Ask the running job to stop after the epoch in flight, without publishing,
        if a policy scheduled it; returns its id, or None when no job runs or the
        running one is not pre-empted (``UNPREEMPTIBLE_TRIGGERS``).

        A drift alert calls this: a refresh trains on a window from before the change
        and, with GP-OPT, takes as long as its deadline allows; until the drift job
        swaps in, the model that drifted serves. The job ends at an epoch boundary, so
        its model is never half-merged; ``_conclude`` records it ``preempted`` and its
        objects are deleted like any ended job's. Its epochs stay recorded, and the
        configurator keeps their observations.
        """
        with self._lock:
            job_id = self._active
            if job_id is None or self._active_trigger in UNPREEMPTIBLE_TRIGGERS:
                return None
            if not self._interrupt.is_set():
                self._preempted_by = reason
                self._interrupt.set()
                log.info(
                    "retraining job %s: %s; stopping after its epoch in flight", job_id, reason
                )
            return job_id

    def _change_point(self, trigger: str, change_after_id: int | None, spec: JobSpec) -> int | None:
        """Where this job's window starts: the asking alert's change point, else, with
        ``spec.change_window_persists``, the latest alert's while the events since it
        are at most ``spec.history_sample``.

        A drift job sees the new regime's first few thousand events; the scheduled jobs
        after it would otherwise mix every later event with a history sample drawn
        mostly from before the change, and fit half of the taste the alert was about
        (bench drift, history ratio 2: a synthetic taste inversion's RMSE 1.0439 →
        1.0374, MovieLens' hit-rate@10 after it 0.0255 → 0.0305). Past ``history_sample`` events the
        change window would outgrow the default window, so the default returns. The
        change point is held in memory: after a restart, jobs take the default window
        until the next alert (a resumed job keeps the one its spec records).
        """
        if change_after_id is not None:
            self._regime_change = change_after_id
            return change_after_id
        regime = self._regime_change
        if regime is None or trigger == "bootstrap" or not spec.change_window_persists:
            return None
        if self._recorder.newest_event_id() - regime > spec.history_sample:
            self._regime_change = None
            return None
        return regime

    def _start(self, job_id: int, work: Callable[[], _Run | None]) -> None:
        if self._background:
            thread = threading.Thread(
                target=self._run, args=(job_id, work), name=f"retrain-{job_id}", daemon=True
            )
            self._track(thread)
        else:
            self._run(job_id, work)

    def _track(self, thread: threading.Thread) -> None:
        with self._threads_lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()  # under the lock: ``wait`` never sees it unstarted

    def wait(self, timeout: float | None = None) -> None:
        """Block until running jobs, and their stragglers' bookkeeping, have finished.

        A job's thread starts its stragglers' thread as it ends, so this looks again
        until no thread it knows of is alive.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._threads_lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return
            for thread in alive:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                thread.join(left)

    def _run(self, job_id: int, work: Callable[[], _Run | None]) -> None:
        started = time.perf_counter()
        run: _Run | None = None
        try:
            run = work()
        except Exception as exc:  # a failed job must be recorded, never kill the service
            log.exception("retraining job %s failed", job_id)
            self._record_failure(job_id, exc)
        finally:
            self.training_seconds += time.perf_counter() - started
            with self._lock:
                self._active = None
                self._active_base = None
                self._active_trigger = None
        if run is not None:
            self._after(run)

    # -- training ---------------------------------------------------------------------
    def _train(
        self, job_id: int, spec: JobSpec, base: VersionLike | None, interrupt: threading.Event
    ) -> _Run:
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
        backend = self._backend(job_id, spec)
        run = _Run(job_id, spec, backend, up_to)
        try:
            result = run_training(
                model,
                window,
                backend,
                self._configurator(job_id, spec, window, model),
                spec.rule(),
                on_epoch=lambda record: self._recorder.epoch(job_id, record),
                item_bias_support=spec.item_bias_support,
                interrupt=interrupt,
            )
            self._conclude(run, result)
        except Exception:  # in training or in recording: bill the stragglers all the same
            self._finish_in_background(run, keep_checkpoint=False)
            raise
        return run

    def _conclude(self, run: _Run, result: JobResult) -> None:
        """Publish the job's version, or record that it was pre-empted and has none."""
        if result.stop_reason != StopReason.PREEMPTED:
            self._publish(run, result)
            return
        stats = getattr(run.backend, "stats", None)  # distributed: the bill so far
        reason = self._preempted_by or "pre-empted"
        self._recorder.preempted(
            run.job_id,
            reason=reason,
            cost_usd=stats.cost_usd if stats else 0.0,
            invocations=stats.invocation_report() if stats else None,
        )
        log.info(
            "job %s: %s after %d epochs; nothing published", run.job_id, reason, len(result.epochs)
        )

    def _publish(self, run: _Run, result: JobResult) -> None:
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
        self.published.set()
        log.info(
            "job %s: %s after %d epochs, holdout rmse %s -> %s",
            run.job_id,
            result.stop_reason,
            len(result.epochs),
            result.holdout_rmse,
            published.version,
        )

    def _record_failure(self, job_id: int, exc: Exception) -> None:
        """Record ``job_id`` failed, unless it published before the error (recording its
        success failed): serving follows the registry, so the job record must say what
        serving will serve, not that the job failed."""
        try:
            if self._recorder.published_version(job_id) is not None:
                # The stop reason is short (a column of 32); the error is in the log.
                self._already_published(job_id, "published; recorded late")
                return
            self._recorder.failed(job_id, str(exc))
        except Exception:  # the store is down: the job stays running; a restart settles it
            log.exception("retraining job %s: could not record how it ended", job_id)

    def _after(self, run: _Run) -> None:
        self._finish_in_background(run, keep_checkpoint=False)

    def _finish_in_background(self, run: _Run, *, keep_checkpoint: bool) -> None:
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
            self._track(
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

    # -- restarts ---------------------------------------------------------------------
    def resume_interrupted(self) -> int | None:
        """Carry on the job a previous process left running; returns its id, if any.

        A distributed job checkpoints its coordinator after every epoch, so a restart
        loses at most the epoch in flight: the newest running job with a checkpoint
        resumes from it (in the background, like any job), its stragglers' updates
        still used. A job that had already published its version is only recorded as
        succeeded, with the bill its checkpoint holds. Jobs that cannot resume
        (in-process training, no checkpoint yet, a damaged one) are marked failed,
        saying why, rather than shown running forever.
        """
        resumable: int | None = None
        for job in sorted(self._recorder.active(), key=lambda j: -int(j["id"])):
            job_id = int(job["id"])
            if self._already_published(job_id, "published before restart"):
                self._bill_from_checkpoint(job)
                self._delete_job_objects(job_id)
                continue
            if resumable is None:
                reason = self._why_not_resumable(job)
            else:
                reason = f"interrupted by a restart; job {resumable}, newer, resumed instead"
            if reason is None:
                resumable = job_id
            else:
                log.warning("retraining job %s: %s", job_id, reason)
                self._recorder.failed(job_id, reason)
                self._delete_job_objects(job_id)
        self._sweep(keep=resumable)
        if resumable is None:
            return None
        record = self._recorder.get(resumable)
        assert record is not None
        with self._lock:
            self._activate(resumable, record["base_version"], record.get("trigger"))
            interrupt = self._interrupt
        log.info("retraining job %s: resuming from its checkpoint", resumable)
        self._start(resumable, lambda: self._resume(record, interrupt))
        return resumable

    def _already_published(self, job_id: int, stop_reason: str) -> bool:
        """A job that published, but whose success was not recorded (a crash or a store
        error in between): record it now."""
        version = self._recorder.published_version(job_id)
        if version is None:
            return False
        self._recorder.succeeded(job_id, version=version, stop_reason=stop_reason)
        self.published.set()
        log.info(
            "retraining job %s had published %s before its success was recorded", job_id, version
        )
        return True

    def _bill_from_checkpoint(self, job: dict[str, Any]) -> None:
        """A job killed after publishing never recorded its bill: its last checkpoint has
        the bill up to its last epoch (what its final epoch cost is lost with the
        process)."""
        if job.get("invocations"):
            return
        try:
            state = read_checkpoint(self._store, coordinator_job(int(job["id"])))
        except CheckpointError as exc:
            log.warning("job %s: no bill from its checkpoint: %s", job["id"], exc)
            return
        if state is None:
            return
        stats = CoordinatorStats.from_dict(state.stats)
        self._recorder.billed(
            int(job["id"]), cost_usd=stats.cost_usd, invocations=stats.invocation_report()
        )

    def _delete_job_objects(self, job_id: int) -> None:
        """Delete what a job that ended without its backend (a restart) left in the store:
        snapshots, shards, deltas and checkpoint. Its workers died with the process that
        ran them; a Lambda straggler of a crashed coordinator may still write one delta
        afterwards, which the next cleanup of this job does not see (bounded: one per
        worker of the epoch in flight)."""
        name = coordinator_job(job_id)
        deleted = 0
        try:
            for prefix in (*job_prefixes(name), checkpoint_prefix(name)):
                deleted += self._store.delete_prefix(prefix)
        except OSError as exc:
            log.warning("job %s: could not delete its objects: %s", job_id, exc)
        if deleted:
            log.info("job %s: deleted %d objects it left behind", job_id, deleted)

    def _sweep(self, keep: int | None) -> None:
        """Delete what ended jobs left in the store, all of them but ``keep``'s.

        A process stopped while a finished job's stragglers still ran never deleted
        that job's objects, and a Lambda straggler can write its delta after the
        cleanup. Only names the coordinator gives (``job-<id>``) are touched, and only
        of jobs recorded as ended: a job another process sharing the store started
        meanwhile keeps its objects.
        """
        ended: dict[str, bool] = {}

        def has_ended(name: str) -> bool:
            if name not in ended:
                job_id = int(name.removeprefix("job-"))
                record = None if job_id == keep else self._recorder.get(job_id)
                ended[name] = job_id != keep and (record is None or record["status"] in _ENDED)
            return ended[name]

        deleted = 0
        try:
            for root in _JOB_ROOTS:
                names = {key[len(root) :].split("/", 1)[0] for key in self._store.list(root)}
                for name in sorted(names):
                    if _COORDINATOR_JOB.fullmatch(name) and has_ended(name):
                        deleted += self._store.delete_prefix(f"{root}{name}/")
        except Exception as exc:  # housekeeping: the next start-up sweeps again
            log.warning("could not sweep the objects of ended jobs: %s", exc)
        if deleted:
            log.info("deleted %d objects ended jobs had left in the store", deleted)

    def protected_versions(self) -> set[str]:
        """Versions a running job builds on, in this process or (through the job
        records) in any other sharing the database: retention must keep them."""
        protected = {self._active_base} if self._active_base else set()
        protected.update(
            str(job["base_version"])
            for job in self._recorder.active()
            if job.get("base_version") is not None
        )
        return protected

    def _why_not_resumable(self, job: dict[str, Any]) -> str | None:
        spec = JobSpec.from_params({**job["params"], "runtime": job["runtime"]})
        if spec.runtime in IN_PROCESS_BACKENDS:
            return "interrupted by a restart (in-process training keeps no checkpoint)"
        if job["status"] != "running" or job["last_event_id"] is None:
            return "interrupted by a restart before it started"
        try:
            found = read_checkpoint(self._store, coordinator_job(int(job["id"])))
        except CheckpointError as exc:
            return f"interrupted by a restart; its checkpoint is unusable: {exc}"
        if found is None:
            return "interrupted by a restart before its first checkpoint"
        return None

    def _resume(self, job: dict[str, Any], interrupt: threading.Event) -> _Run:
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
        backend = DistributedBackend.resume(
            self._runtime(spec), self._store, self._store_url, coordinator_job(job_id)
        )
        if backend is None:
            raise RuntimeError(f"the checkpoint of job {job_id} disappeared")
        recorded = {int(e["epoch"]) for e in job["epochs"]}
        for record in backend.epochs:  # an epoch checkpointed just before the crash
            if record.epoch not in recorded:
                self._recorder.epoch(job_id, record)
        run = _Run(job_id, spec, backend, up_to)
        try:
            result = run_training(
                None,
                window,
                backend,
                self._configurator(job_id, spec, window, backend.model),
                spec.rule(),
                on_epoch=lambda record: self._recorder.epoch(job_id, record),
                history=backend.epochs,
                prepare=False,
                item_bias_support=spec.item_bias_support,
                interrupt=interrupt,
            )
            self._conclude(run, result)
        except Exception:  # in training or in recording: bill the stragglers all the same
            self._finish_in_background(run, keep_checkpoint=False)
            raise
        return run

    def _configurator(
        self, job_id: int, spec: JobSpec, window: RatingsWindow, model: BiasedMF
    ) -> Configurator:
        """The spec's configurator, told what the job is, warm from earlier jobs'
        observations in the object store."""
        train_samples = len(window) - len(window) // 10  # run_training holds out a tenth
        context = JobContext(
            train_samples=max(train_samples, 1),
            factors=spec.factors,
            model_rows=model.n_users + model.n_items,
            latency_cap_s=spec.latency_cap_s,
            budget_usd=spec.budget_usd,
            max_epochs=spec.max_epochs,
            job_id=coordinator_job(job_id),
            max_workers=_MAX_WORKERS.get(spec.runtime, spec.workers),
        )
        return make_configurator(
            spec.configurator,
            spec.epoch_config(),
            context,
            History(self._store),
            host=self._configurator_host,
        )

    # -- placement --------------------------------------------------------------------
    def _backend(self, job_id: int, spec: JobSpec) -> TrainingBackend:
        """Where this job's epochs run, as its spec says."""
        in_process = IN_PROCESS_BACKENDS.get(spec.runtime)
        if in_process is not None:
            return in_process(spec)
        return DistributedBackend(
            self._runtime(spec),
            self._store,
            self._store_url,
            coordinator_job(job_id),
            sync_policy(spec.sync, spec.sync_ratio),
            seed=spec.seed or 0,
        )

    def _runtime(self, spec: JobSpec) -> Runtime:
        """The function runtime a spec names, opened once and kept (warm containers)."""
        runtime = self._runtimes.get(spec.runtime)
        if runtime is None:
            options = self._runtime_options(spec).get(spec.runtime, {})
            runtime = open_runtime(spec.runtime, **options)
            self._runtimes[spec.runtime] = runtime
        return runtime

    def _runtime_options(self, spec: JobSpec) -> Mapping[str, Mapping[str, Any]]:
        return {
            "local": {"concurrency": _LOCAL_CONCURRENCY * spec.workers},
            "thread": {"concurrency": _LOCAL_CONCURRENCY * spec.workers},
            "lambda": {"function_name": self._lambda_function},
            "sim": {"execute": handler},
        }

    def close(self) -> None:
        """Stop the worker processes of the function runtimes that were started."""
        for runtime in self._runtimes.values():
            runtime.close()
        self._runtimes = {}


def coordinator_job(job_id: int) -> str:
    """The coordinator's name for a job: its snapshots, deltas and checkpoint keys."""
    return f"job-{job_id}"


_COORDINATOR_JOB = re.compile(r"job-[0-9]{1,9}")  # job ids are 32-bit
_ENDED = ("succeeded", "failed", "preempted")

#: The top-level folders under which jobs keep their objects, one folder per job.
_JOB_ROOTS = tuple(
    prefix.split("/", 1)[0] + "/"
    for prefix in (*job_prefixes(coordinator_job(0)), checkpoint_prefix(coordinator_job(0)))
)
