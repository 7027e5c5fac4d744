"""What the service supplies to retraining: the model registry and the job records.

``retrain`` imports nothing of the service; the service hands a ``Retrainer`` objects
of these shapes (and a ``retrain.window.WindowSource``).
"""

from __future__ import annotations

from typing import Any, Protocol

from functions.mf import BiasedMF
from retrain.job import EpochRecord
from retrain.spec import JobSpec


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
