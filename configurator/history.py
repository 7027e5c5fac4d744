"""Observations kept across jobs, so that a job's configurator starts warm.

One JSON object per job under ``configurator/jobs/``, keyed by the job: its context
(window size, factors) and, per epoch, the config, latency, cost and loss progress; and
the residual GPs' hyper-parameters when the job ended. A new job reads the newest few:
their epochs become observations with their own context as an input (the surrogate
sees the window size), and the hyper-parameters seed its GPs. One object per job means
replicas sharing a store never overwrite each other's. Only the newest are read, so a
save also deletes all but the newest ``KEEP_STORED`` jobs: the store stays flat however
many jobs run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from configurator.space import EpochConfig

log = logging.getLogger(__name__)

PREFIX = "configurator/jobs/"
#: Jobs read back, newest first, and epochs kept of each.
KEEP_JOBS = 8
KEEP_EPOCHS = 60
#: Jobs' objects kept in the store: the ones read back, and as many again, so a replica
#: reading while another saves and prunes still finds what it listed.
KEEP_STORED = 2 * KEEP_JOBS


class BlobStore(Protocol):
    """What is needed of an object store (``functions.objectstore.ObjectStore``)."""

    def put(self, key: str, data: bytes) -> Any: ...

    def get(self, key: str) -> bytes: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class PastEpoch:
    """One observed epoch of an earlier job."""

    config: dict[str, Any]
    latency_s: float
    cost_usd: float
    progress: float | None
    samples: int

    @property
    def epoch_config(self) -> EpochConfig:
        return EpochConfig(**self.config)


@dataclass(frozen=True)
class PastJob:
    """An earlier job's context, epochs and final hyper-parameters."""

    job_id: str
    train_samples: int
    factors: int
    model_rows: int
    epochs: tuple[PastEpoch, ...]
    hyperparameters: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> PastJob:
        raw = json.loads(data)
        epochs = tuple(PastEpoch(**e) for e in raw.pop("epochs"))
        return cls(epochs=epochs, **raw)


class History:
    """Past jobs in an object store; reading or writing never fails a job."""

    def __init__(self, store: BlobStore, keep_jobs: int = KEEP_JOBS) -> None:
        self.store = store
        self.keep_jobs = keep_jobs

    def load(self) -> list[PastJob]:
        """The newest ``keep_jobs`` jobs, newest first."""
        try:
            keys = sorted(self.store.list(PREFIX), key=_job_number, reverse=True)
        except Exception as exc:  # a cold start is still a start
            log.warning("configurator: could not list past jobs: %s", exc)
            return []
        jobs = []
        for key in keys[: self.keep_jobs]:
            try:
                jobs.append(PastJob.from_json(self.store.get(key)))
            except Exception as exc:
                log.warning("configurator: skipping unreadable past job %s: %s", key, exc)
        return jobs

    def save(self, job: PastJob) -> None:
        trimmed = PastJob(
            job.job_id,
            job.train_samples,
            job.factors,
            job.model_rows,
            job.epochs[-KEEP_EPOCHS:],
            job.hyperparameters,
        )
        try:
            self.store.put(f"{PREFIX}{job.job_id}.json", trimmed.to_json())
        except Exception as exc:
            log.warning("configurator: could not keep job %s's observations: %s", job.job_id, exc)
            return
        self._prune()

    def _prune(self) -> None:
        """Delete all but the newest ``KEEP_STORED`` jobs' objects (never fails a job)."""
        try:
            keys = sorted(self.store.list(PREFIX), key=_job_number, reverse=True)
            for key in keys[KEEP_STORED:]:
                self.store.delete(key)
        except Exception as exc:
            log.warning("configurator: could not prune past jobs: %s", exc)


def _job_number(key: str) -> tuple[int, str]:
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    digits = "".join(ch for ch in stem if ch.isdigit())
    return (int(digits) if digits else -1, stem)
