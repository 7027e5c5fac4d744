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

The ``Retrainer`` decides which job runs and on which thread; its collaborators do the
rest: ``retrain.runner.JobRunner`` trains, concludes and records one job,
``retrain.recovery.Recovery`` settles what a previous process left, and
``retrain.placement.Placement`` builds a job's backend on the runtimes it keeps open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from configurator.process import ConfiguratorHost
from functions.objectstore import ObjectStore
from functions.runtimes import Runtime
from retrain.placement import IN_PROCESS_BACKENDS, Placement, coordinator_job
from retrain.ports import JobRecorder, VersionLike, VersionPublisher
from retrain.recovery import Recovery
from retrain.runner import JobRun, JobRunner
from retrain.spec import JobSpec
from retrain.threads import JobThreads
from retrain.window import WindowSource

__all__ = [
    "IN_PROCESS_BACKENDS",
    "UNPREEMPTIBLE_TRIGGERS",
    "JobAlreadyRunning",
    "JobRecorder",
    "NothingToTrain",
    "Retrainer",
    "VersionLike",
    "VersionPublisher",
    "coordinator_job",
]

log = logging.getLogger(__name__)

#: Triggers whose jobs a drift alert does not pre-empt: the first version (nothing
#: serves without it), the answer to an alert, and a job a person asked for. Jobs a
#: policy schedules (refresh, periodic, batch, ...) may be pre-empted.
UNPREEMPTIBLE_TRIGGERS = frozenset({"bootstrap", "drift", "manual"})


class JobAlreadyRunning(RuntimeError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"retraining job {job_id} is still running")
        self.job_id = job_id


class NothingToTrain(RuntimeError):
    pass


class Retrainer:
    """Starts, runs, resumes and records retraining jobs, one at a time.

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
        ray_address: str | None = None,
    ) -> None:
        self._spec = spec
        self._recorder = recorder
        self._background = background
        self._lock = threading.Lock()
        self._active: int | None = None
        self._active_base: str | None = None
        #: The running job's trigger, its interrupt and why it was set (``preempt``).
        self._active_trigger: str | None = None
        self._interrupt = threading.Event()
        self._preempted_by: str | None = None
        #: The latest drift alert's change point (see ``_change_point``).
        self._regime_change: int | None = None
        self._threads = JobThreads()
        self.training_seconds = 0.0
        #: Set whenever a job has published a version; serving follows the registry.
        self.published = threading.Event()
        #: Where numeric configurators decide (None: in this process). Not ours to
        #: close: one host serves every retrainer of the process.
        self._configurator_host = configurator_host
        self._placement = Placement(
            store,
            store_url,
            lambda_function=lambda_function,
            configurator_host=configurator_host,
            ray_address=ray_address,
        )
        self._runner = JobRunner(
            windows,
            recorder,
            registry,
            self._placement,
            published=self.published,
            preempted_by=lambda: self._preempted_by,
            threads=self._threads,
            background=background,
        )
        self._recovery = Recovery(recorder, store, self._runner.already_published)

    @property
    def active_job_id(self) -> int | None:
        return self._active

    @property
    def active_base_version(self) -> str | None:
        """The version the running job builds on (retention must keep it)."""
        return self._active_base

    @property
    def _runtimes(self) -> dict[str, Runtime]:
        """The function runtimes opened so far, by name (kept by the placement)."""
        return self._placement.runtimes

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

    def preempt(self, reason: str, *, force: bool = False) -> int | None:
        """Ask the running job to stop after the epoch in flight, without publishing,
        if a policy scheduled it (any job with ``force``: this process may no longer
        start or finish jobs); returns its id, or None when no job runs or the
        running one is not pre-empted (``UNPREEMPTIBLE_TRIGGERS``).

        A drift alert calls this: a refresh trains on a window from before the change
        and, with GP-OPT, takes as long as its deadline allows; until the drift job
        swaps in, the model that drifted serves. The job ends at an epoch boundary, so
        its model is never half-merged; the runner records it ``preempted`` and its
        objects are deleted like any ended job's. Its epochs stay recorded, and the
        configurator keeps their observations.
        """
        with self._lock:
            job_id = self._active
            if job_id is None or (not force and self._active_trigger in UNPREEMPTIBLE_TRIGGERS):
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
        mostly from before the change, and fit half of the taste the alert was about.
        Past ``history_sample`` events the change window would outgrow the default
        window, so the default returns. The change point is held in memory: after a
        restart, jobs take the default window until the next alert (a resumed job keeps
        the one its spec records).
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

    def _train(
        self, job_id: int, spec: JobSpec, base: VersionLike | None, interrupt: threading.Event
    ) -> JobRun:
        return self._runner.train(job_id, spec, base, interrupt)

    # -- running ----------------------------------------------------------------------
    def _start(self, job_id: int, work: Callable[[], JobRun | None]) -> None:
        if self._background:
            thread = threading.Thread(
                target=self._run, args=(job_id, work), name=f"retrain-{job_id}", daemon=True
            )
            self._threads.start(thread)
        else:
            self._run(job_id, work)

    def _run(self, job_id: int, work: Callable[[], JobRun | None]) -> None:
        started = time.perf_counter()
        run: JobRun | None = None
        try:
            run = work()
        except Exception as exc:  # a failed job must be recorded, never kill the service
            log.exception("retraining job %s failed", job_id)
            self._runner.record_failure(job_id, exc)
        finally:
            self.training_seconds += time.perf_counter() - started
            with self._lock:
                self._active = None
                self._active_base = None
                self._active_trigger = None
        if run is not None:
            self._runner.finish_in_background(run, keep_checkpoint=False)

    def wait(self, timeout: float | None = None) -> None:
        """Block until running jobs, and their stragglers' bookkeeping, have finished."""
        self._threads.wait(timeout)

    # -- restarts ---------------------------------------------------------------------
    def resume_interrupted(self) -> int | None:
        """Carry on the job a previous process left running; returns its id, if any.

        The newest running job with a checkpoint resumes from it (in the background,
        like any job), its stragglers' updates still used; the others are settled as
        ``retrain.recovery`` describes.
        """
        record = self._recovery.settle_interrupted()
        if record is None:
            return None
        resumable = int(record["id"])
        with self._lock:
            self._activate(resumable, record["base_version"], record.get("trigger"))
            interrupt = self._interrupt
        log.info("retraining job %s: resuming from its checkpoint", resumable)
        self._start(resumable, lambda: self._runner.resume(record, interrupt))
        return resumable

    def _sweep(self, keep: int | None) -> None:
        """Delete what ended jobs left in the store, all of them but ``keep``'s."""
        self._recovery.sweep(keep)

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

    def close(self) -> None:
        """Stop the worker processes of the function runtimes that were started."""
        self._placement.close()
