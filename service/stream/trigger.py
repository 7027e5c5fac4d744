"""The retrain trigger: the policy asks for a job, the lifecycle runs it.

After each batch the trigger tells the policy (``RETRAIN_POLICY``) what arrived and
answers the drift alerts the monitor raised: an alert's job trains on the events after
its change point. A drift alert raised while another job runs is deferred and started as
soon as that job ends (the running job's window predates the change); a scheduled job is
cut short for it when ``DRIFT_PREEMPTS_JOBS``. Without an alert, the policy's progress
rule (bootstrap, refresh, interval, Continuum's cost rule) may ask for a scheduled job.

In a cluster only the leader's trigger starts jobs (``leading``); every replica's policy
still counts the events, so a replica that takes over asks at the same point. The
database refuses a job started by a deposed leader or beside an active one; the trigger
logs that and asks again later.

Ownership: ``after_batch`` runs on the ingest path; ``start_deferred_drift`` and
``ask_again`` also run on the registry follower's thread, so the deferred alert and the
policy's asks are each guarded by a lock of their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from retrain import TriggerPolicy
from retrain.lifecycle import JobAlreadyRunning, Retrainer
from service.serving.registry import LoadedVersion, ModelRegistry
from service.store import Database
from service.store.jobs import get_job
from service.store.leases import NotLeaseHolder
from service.stream.learner import Learner
from service.stream.monitor import RaisedAlert

log = logging.getLogger(__name__)


class RetrainTrigger:
    """Decides when a retraining job starts, and starts it."""

    def __init__(
        self,
        db: Database,
        registry: ModelRegistry,
        policy: TriggerPolicy,
        retrainer: Retrainer,
        learner: Learner,
        *,
        enabled: bool,
        drift_preempts_jobs: bool,
        swap_in_progress: Callable[[], bool],
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.db = db
        self.registry = registry
        self.policy = policy
        self.retrainer = retrainer
        self.learner = learner
        self.enabled = enabled
        self.drift_preempts_jobs = drift_preempts_jobs
        #: Whether the serving side is swapping in a version now.
        self.swap_in_progress = swap_in_progress
        #: Whether this replica leads the cluster (only the leader starts jobs).
        self.leading = leading
        #: A drift alert raised while another job ran: (trigger, alert id, change point
        #: id), started as a job of its own once that one ends.
        self._deferred_drift: tuple[str, int, int] | None = None
        self._deferred_lock = threading.Lock()
        self._observed_jobs: set[int] = set()  # jobs the policy has been told of
        #: Whether the policy's last ask was put off because a version was on its way;
        #: the ingest path and the registry follower's tick ask, one at a time.
        self._put_off = False
        self._asking = threading.Lock()

    # -- the ingest path ----------------------------------------------------------------
    def observe_events(self, labelled: int) -> None:
        """Tell the policy ``labelled`` labelled events arrived now."""
        self.policy.observe_events(labelled, time.time())

    def after_batch(self, alerts: Sequence[RaisedAlert]) -> None:
        """Answer the batch's alerts, start a deferred drift job, or ask the policy."""
        if not (self.enabled and self.leading()):
            return
        try:
            self._answer(alerts)
        except (JobAlreadyRunning, NotLeaseHolder) as refused:
            log.info("no job started: %s", refused)

    def _answer(self, alerts: Sequence[RaisedAlert]) -> None:
        for alert in alerts:
            trigger = self.policy.on_alert()
            if trigger is None:
                continue
            if self.retrainer.active_job_id is not None and alert.change_after_id is not None:
                # The running job's window predates the change: train on the change as
                # soon as it ends, rather than call that job the answer to the alert; a
                # scheduled job is cut short at its next epoch (DRIFT_PREEMPTS_JOBS).
                with self._deferred_lock:
                    self._deferred_drift = (trigger, alert.alert_id, alert.change_after_id)
                if self.drift_preempts_jobs:
                    self.retrainer.preempt(f"pre-empted by drift alert {alert.alert_id}")
                continue
            self.retrainer.request(
                trigger,
                alert.alert_id,
                base=self.learner.current,
                change_after_id=alert.change_after_id,
            )
        self.start_deferred_drift()
        self._ask_policy()

    def _ask_policy(self) -> None:
        """Start the job the policy asks for now, unless a job runs; while a version is
        on its way, ask again on the next tick (``ask_again``)."""
        with self._asking:
            if self.retrainer.active_job_id is not None:
                return
            learner = self.learner
            trigger = self.policy.on_progress(learner.labelled_seen, learner.labelled_since_swap)
            self._put_off = trigger is not None and self._version_on_its_way()
            if trigger is not None and not self._put_off:
                self.retrainer.request(trigger, base=learner.current)

    def ask_again(self) -> None:
        """Ask the policy again if the last ask was put off while a version was on its
        way (a tick task): without it, a stream that pauses after that batch would wait
        for its next event, a first model included."""
        if not (self._put_off and self.enabled and self.leading()):
            return
        try:
            self._ask_policy()
        except (JobAlreadyRunning, NotLeaseHolder) as refused:
            log.info("no job started: %s", refused)

    def start_deferred_drift(self) -> None:
        """Start the drift job an alert asked for while another job ran, if none runs now.

        Called after each batch and whenever a job publishes, so the drift job starts
        when the job before it ends, whether or not events keep arriving.
        """
        if not (self.enabled and self.leading()):
            return
        with self._deferred_lock:
            if self._deferred_drift is None or self.retrainer.active_job_id is not None:
                return
            trigger, alert_id, change_after_id = self._deferred_drift
            self._deferred_drift = None
        try:
            self.retrainer.request(
                trigger, alert_id, base=self.learner.current, change_after_id=change_after_id
            )
        except (JobAlreadyRunning, NotLeaseHolder) as refused:
            log.info("deferred drift job not started: %s", refused)

    @property
    def drift_deferred(self) -> bool:
        return self._deferred_drift is not None

    def _version_on_its_way(self) -> bool:
        """Whether a version is published but not serving yet: a job published it and
        its swap is pending or running, or nothing serves and one exists (a bootstrap
        job just finished).

        A scheduled job started meanwhile would build on the version being replaced and
        count its window from it, and a second bootstrap would train the same window
        again. The policy asks again after the next batch, counting from the new
        version (or on the registry follower's next tick, ``ask_again``). It also keeps a
        job's window build off the swap's catch-up, the two heaviest pieces of retraining
        work beside ``/recommend``.
        """
        if self.retrainer.published.is_set() or self.swap_in_progress():
            return True
        if self.learner.current is not None:
            return False
        try:
            return bool(self.registry.versions(include_deleted=False))
        except SQLAlchemyError:
            log.exception("reading the registry before a bootstrap job")
            return False

    # -- by hand ----------------------------------------------------------------------------
    def retrain_now(self, trigger: str = "manual") -> int:
        """Start a job by hand from the serving version; ``JobAlreadyRunning`` if one
        runs, ``NotLeaseHolder`` on a replica that does not lead the cluster."""
        if not self.leading():
            raise NotLeaseHolder("leader", None)
        return self.retrainer.request(trigger, None, base=self.learner.current, exclusive=True)

    # -- versions ---------------------------------------------------------------------------
    def observe_job(self, loaded: LoadedVersion) -> None:
        """Tell the policy how long the job behind ``loaded`` ran, over how many events,
        once per job: Continuum's rule refits its training-time model on these."""
        job_id = loaded.row.get("job_id")
        if job_id is None or int(job_id) in self._observed_jobs:
            return  # a rollback or a second swap of one version is not a new job
        self._observed_jobs.add(int(job_id))
        try:
            with self.db.connect() as conn:
                job = get_job(conn, int(job_id))
        except SQLAlchemyError:
            log.exception("reading job %s for the trigger policy", job_id)
            return
        if job is None or job.get("finished_at") is None or job.get("started_at") is None:
            return
        if job.get("window_events"):
            self.policy.observe_job(job["window_events"], job["finished_at"] - job["started_at"])

    def policy_status(self) -> dict[str, str]:
        """The policy's name and what it waits for, for ``/healthz``."""
        learner = self.learner
        return {
            "name": self.policy.name,
            "waiting_for": self.policy.waiting_for(
                learner.labelled_seen, learner.labelled_since_swap
            ),
        }
