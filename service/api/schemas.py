"""Request and response models of the HTTP API (DESIGN.md §3)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from service.validation import EventIn as EventIn  # the request schema of POST /ingest


class IngestResult(BaseModel):
    accepted: int
    duplicates: int


class ScoredItem(BaseModel):
    item_id: str
    score: float


class RecommendationPublic(BaseModel):
    user_id: str
    items: list[ScoredItem]
    model_version: str
    source: str = Field(description="'model' for personalised results, 'popular' otherwise")


class AlertPublic(BaseModel):
    id: int
    detected_at: float
    metric: str
    before: float
    after: float
    events_seen: int
    model_version: str | None
    retrain_job_id: int | None


class AlertsPublic(BaseModel):
    alerts: list[AlertPublic]


class VersionPublic(BaseModel):
    version: str
    created_at: float
    rmse: float | None
    checksum: str
    job_id: int | None
    n_users: int
    n_items: int


class ModelsPublic(BaseModel):
    current: str | None
    versions: list[VersionPublic]


class EpochPublic(BaseModel):
    epoch: int
    loss: float
    duration_s: float
    config: dict[str, Any]


class JobPublic(BaseModel):
    id: int
    policy: str
    trigger: str
    status: str
    runtime: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    base_version: str | None
    model_version: str | None
    window_events: int | None
    stop_reason: str | None
    cost_usd: float | None
    error: str | None
    params: dict[str, Any]
    alert_ids: list[int]
    invocations: list[dict[str, Any]] | None = Field(
        None,
        description=(
            "Worker invocations of a distributed job: timings, outcome, cost, and the "
            "epoch each update was folded into (applied_in) with its share of a step."
        ),
    )
    loss_curve: list[float]
    epochs: list[EpochPublic]

    @classmethod
    def from_record(cls, job: dict[str, Any]) -> JobPublic:
        started, finished = job.get("started_at"), job.get("finished_at")
        return cls(
            **{k: v for k, v in job.items() if k in cls.model_fields},
            duration_s=(finished - started) if started and finished else None,
            loss_curve=[e["loss"] for e in job["epochs"]],
        )


class JobsPublic(BaseModel):
    jobs: list[JobPublic]


class RetrainAccepted(BaseModel):
    job_id: int
    status: str
