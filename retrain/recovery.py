"""After a restart: settle the jobs a previous process left running, and sweep the
object store of what ended jobs left behind.

A distributed job checkpoints its coordinator after every epoch, so a restart loses at
most the epoch in flight: the newest running job with a checkpoint resumes from it. A
job that had already published its version is only recorded as succeeded, with the bill
its checkpoint holds. Jobs that cannot resume (in-process training, no checkpoint yet, a
damaged one) are marked failed, saying why, rather than shown running forever.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from functions.objectstore import ObjectStore
from functions.shards import job_prefixes
from retrain.checkpoints import CheckpointError, checkpoint_prefix, read_checkpoint
from retrain.placement import IN_PROCESS_BACKENDS, coordinator_job
from retrain.ports import JobRecorder
from retrain.spec import JobSpec
from retrain.stats import CoordinatorStats

log = logging.getLogger(__name__)

_COORDINATOR_JOB = re.compile(r"job-[0-9]{1,9}")  # job ids are 32-bit
_ENDED = ("succeeded", "failed", "preempted")

#: The top-level folders under which jobs keep their objects, one folder per job.
_JOB_ROOTS = tuple(
    prefix.split("/", 1)[0] + "/"
    for prefix in (*job_prefixes(coordinator_job(0)), checkpoint_prefix(coordinator_job(0)))
)


class Recovery:
    """Settles the job records and objects a previous process left.

    Parameters
    ----------
    already_published
        Records a job that published but whose success was not recorded; True if it
        had (``retrain.runner.JobRunner.already_published``).
    """

    def __init__(
        self,
        recorder: JobRecorder,
        store: ObjectStore,
        already_published: Callable[[int, str], bool],
    ) -> None:
        self._recorder = recorder
        self._store = store
        self._already_published = already_published

    def settle_interrupted(self) -> dict[str, Any] | None:
        """Record how each job left running ended, all but the one to resume, and sweep
        the store; returns the record of the job to resume, if any."""
        resumable: int | None = None
        for job in sorted(self._recorder.active(), key=lambda j: -int(j["id"])):
            job_id = int(job["id"])
            if self._already_published(job_id, "published before restart"):
                self._bill_from_checkpoint(job)
                self.delete_job_objects(job_id)
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
                self.delete_job_objects(job_id)
        self.sweep(keep=resumable)
        if resumable is None:
            return None
        record = self._recorder.get(resumable)
        assert record is not None
        return record

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

    def delete_job_objects(self, job_id: int) -> None:
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

    def sweep(self, keep: int | None) -> None:
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
