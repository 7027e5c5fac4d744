"""Request and response models of the HTTP API (docs/api.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from service.auth.keys import KEY_NAME_PATTERN
from service.auth.scopes import SCOPES, checked
from service.ingest.validation import EventIn as EventIn  # the request schema of POST /ingest

#: The largest count a query parameter takes: what a signed 64-bit database integer
#: (``BIGINT``, e.g. ``heartbeats.events_seen``) holds. Larger values are refused with
#: 422, not passed to SQL, where they would overflow into a 500.
MAX_ID = 2**63 - 1
#: The largest job id: ``retrain_jobs.id`` is an ``INTEGER`` (32-bit ``SERIAL`` on
#: PostgreSQL), so a larger id names no job and would overflow the query's parameter.
MAX_JOB_ID = 2**31 - 1
#: The largest drift alert id: ``drift_alerts.id`` is an ``INTEGER`` too.
MAX_ALERT_ID = 2**31 - 1


class IngestBatch(BaseModel):
    """The body of ``POST /ingest``: one atomic batch of events."""

    model_config = {"extra": "forbid"}

    events: list[EventIn]


class ErrorPublic(BaseModel):
    """Every refusal: ``detail`` says what is wrong (422 on /ingest lists each bad event)."""

    detail: str | list[dict[str, Any]]


class IngestResult(BaseModel):
    accepted: int
    duplicates: int
    position: int = Field(
        description="The event log's position after this batch: pass it as "
        "/recommend?after= on any replica to read this batch's effect there."
    )


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
    acknowledged_at: float | None = Field(None, description="When an admin acknowledged it")
    acknowledged_by: str | None = Field(None, description="The key that acknowledged it")
    kind: str = Field(
        "drift", description="drift (the monitor's) or rollback (the rollout guard's)"
    )


class AlertsPublic(BaseModel):
    alerts: list[AlertPublic]


class SegmentPublic(BaseModel):
    """One segment's error before and after the change, and its share of the rise."""

    events_before: int
    events_after: int
    rmse_before: float | None = Field(description="None when the segment had no events")
    rmse_after: float | None = Field(description="None when the segment had no events")
    share_of_rise: float | None = Field(
        description=(
            "Share of the rise of mean squared error this segment accounts for (its own "
            "rise and its change of traffic share); a partition's shares sum to 1. None "
            "when the error did not rise."
        )
    )


class UserSegmentsPublic(BaseModel):
    new: SegmentPublic = Field(
        description="Users with fewer than rules.new_user_events events before the change"
    )
    returning: SegmentPublic


class ItemSegmentsPublic(BaseModel):
    head: SegmentPublic = Field(
        description="The most popular items, together drawing rules.head_share of the events"
    )
    tail: SegmentPublic


class MoverPublic(BaseModel):
    """A user or item among those whose error rose most."""

    id: str
    events_before: int
    events_after: int
    rmse_before: float | None
    rmse_after: float
    mse_rise: float = Field(description="Mean squared error after minus the baseline")
    baseline: str = Field(
        description="'own': its own level before the change; 'overall': too few events "
        "before it, so the overall level"
    )


class SegmentRulesPublic(BaseModel):
    reference_events: int = Field(description="Most events before the change compared")
    new_user_events: int
    head_share: float
    min_events: int = Field(description="Fewest events after the change to be listed")
    top: int


class AlertSegmentsPublic(BaseModel):
    """How the alert's error rise splits across user and item segments."""

    change_events: int
    events_before: int
    events_after: int
    rmse_before: float
    rmse_after: float
    mse_rise: float
    users: UserSegmentsPublic
    items: ItemSegmentsPublic
    head_min_popularity: int = Field(
        description="Least popularity (events among the newest) of a head item's event"
    )
    top_users: list[MoverPublic]
    top_items: list[MoverPublic]
    rules: SegmentRulesPublic


class AlertDetailPublic(AlertPublic):
    """One alert: what the list shows, the detector, the change point and the segments."""

    detector: str | None = Field(description="The detector that raised it (DRIFT_DETECTOR)")
    change_events: int | None = Field(
        description="Labelled events seen when the raised error level began; None if unknown"
    )
    segments: AlertSegmentsPublic | None = Field(
        description="None when no change point is known or no events around it were kept"
    )


class IntervalPublic(BaseModel):
    """A difference, new minus old, with its interval at the comparison's confidence."""

    estimate: float | None
    low: float | None = Field(description="None: not bounded yet (fewer than two users).")
    high: float | None = Field(description="None: not bounded yet (fewer than two users).")


class ComparisonPublic(BaseModel):
    """Two versions on the same live events, new minus old, users as the unit."""

    role: str = Field(description="candidate (shadow before promotion) or previous (watch).")
    compared_with: str | None = Field(description="The version on the other side.")
    events_compared: int
    users: int
    ranked_events: int = Field(description="Events of the ranking sample among them.")
    confidence: float
    old_rmse: float | None = Field(description="The old version's RMSE on these events.")
    old_hit_rate: float | None
    rmse_diff: IntervalPublic | None = Field(description="RMSE, relative (-0.01: 1 % lower).")
    hit_rate_diff: IntervalPublic | None = Field(description="Hit-rate@10, absolute.")
    ndcg_diff: IntervalPublic | None = Field(description="NDCG@10, absolute.")
    decision: str | None = Field(
        description="promote, hold, keep, roll_back or served; None while comparing."
    )
    reason: str | None


class GuardPublic(BaseModel):
    """The rollout guard's record of a version published while another served."""

    state: str = Field(description="shadow, held, watch, kept or rolled_back.")
    compared_with: str | None = Field(description="The version serving beside it in shadow.")
    published_at: float
    decided_at: float | None = None
    promoted_at: float | None = None
    watch_ended_at: float | None = None
    events_compared: int = Field(0, description="In shadow: events compared so far.")
    rmse_diff: IntervalPublic | None = Field(None, description="The shadow's, relative.")
    hit_rate_diff: IntervalPublic | None = None
    ndcg_diff: IntervalPublic | None = None
    decision: str | None = None
    reason: str | None = None
    shadow: ComparisonPublic | None = Field(None, description="Against the serving version.")
    watch: ComparisonPublic | None = Field(
        None, description="After promotion, against the version it replaced."
    )


class VersionPublic(BaseModel):
    version: str
    created_at: float
    rmse: float | None
    checksum: str
    job_id: int | None
    n_users: int
    n_items: int
    deleted_at: float | None = Field(
        None, description="When retention deleted the artifact (RETENTION_VERSIONS); None: kept."
    )
    serving: list[ServingIntervalPublic] = Field(
        default_factory=list, description="When the version served, oldest first."
    )
    guard: GuardPublic | None = Field(
        None, description="The rollout guard's shadow and watch (None: served at publication)."
    )


class ServingIntervalPublic(BaseModel):
    started_at: float
    ended_at: float | None = Field(description="None: the version still serves.")
    trigger: str = Field(description="What made it serve: publish, promote or rollback.")


class RollbackPublic(BaseModel):
    id: int
    rolled_back_at: float
    actor: str = Field(description="The key's name (or client address) that rolled back.")
    from_version: str | None
    to_version: str


class ModelsPublic(BaseModel):
    current: str | None
    versions: list[VersionPublic]
    rollbacks: list[RollbackPublic] = Field(
        default_factory=list, description="Every rollback, oldest first."
    )


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
    last_event_id: int | None = Field(
        None, description="The newest event the job's window holds (its events are up to it)."
    )
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


class HeartbeatPublic(BaseModel):
    """One prequential heartbeat; ``id`` is None while it waits for the next write."""

    id: int | None = None
    at: float
    events_seen: int
    events: int
    rmse: float
    static_rmse: float | None = Field(description="RMSE of the never-retrained model")
    model_version: str | None
    hit_rate: float | None = Field(
        None, description="Hit-rate@10 of the serving model on the heartbeat's ranked events"
    )
    ndcg: float | None = Field(None, description="NDCG@10 of the serving model, the same events")
    static_hit_rate: float | None = Field(
        None, description="Hit-rate@10 of the never-retrained model, the same events"
    )
    static_ndcg: float | None = Field(
        None, description="NDCG@10 of the never-retrained model, the same events"
    )
    ranked_events: int | None = Field(
        None,
        description="Sampled liked events ranked in the heartbeat (the figures are null at 0)",
    )


class HeartbeatsPublic(BaseModel):
    heartbeats: list[HeartbeatPublic]


class TrackPublic(BaseModel):
    """One model's running prequential figures: RMSE over every labelled event, ranking
    over the sampled liked events (``RANKING_SAMPLE``)."""

    rmse: float | None
    count: int
    hit_rate: float | None = Field(None, description="Hit-rate@10 so far")
    ndcg: float | None = Field(None, description="NDCG@10 so far")
    ranked_events: int = Field(0, description="Sampled liked events ranked so far")


class HealthPublic(BaseModel):
    """``/healthz``: the same body whether the answer is 200 or 503 (``status`` degraded)."""

    status: str = Field(description="'ok', or 'degraded' when the database is unreachable")
    model_version: str | None
    labelled_events_seen: int
    retrain_job_running: int | None
    retrain_policy: dict[str, str] | None = Field(
        None,
        description=(
            "The trigger policy (RETRAIN_POLICY): 'name' and 'waiting_for' in words, e.g. "
            "'next batch in 212 s' or 'regret 0.4 of threshold'."
        ),
    )
    prequential: dict[str, TrackPublic]
    database: str
    events_stored: int | None = None
    kafka: dict[str, Any] | None = Field(
        None, description="The consumer's state, when the server consumes from Kafka."
    )
    cluster: dict[str, Any] | None = Field(
        None,
        description="This replica in the cluster: replica_id, leader (whether it, or its "
        "stream process, leads), holds_lease (this process), leader_id, fencing_token, "
        "applied_position, log_position, log_lag_events, replayed_at_start.",
    )


class JobsPublic(BaseModel):
    jobs: list[JobPublic]


class RetrainAccepted(BaseModel):
    job_id: int
    status: str


#: The scopes ``POST /keys`` takes, listed in its schema.
_SCOPE_ENUM: dict[str, Any] = {"items": {"enum": sorted(SCOPES)}}


class ApiKeyIn(BaseModel):
    """``POST /keys``: a name and one or more scopes (``ingest``, ``read``, ``admin``)."""

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=KEY_NAME_PATTERN)
    scopes: list[str] = Field(min_length=1, max_length=len(SCOPES), json_schema_extra=_SCOPE_ENUM)

    @field_validator("scopes")
    @classmethod
    def _known(cls, scopes: list[str]) -> list[str]:
        return checked(scopes)


class ApiKeyPublic(BaseModel):
    """A key as listed: never its secret or hash."""

    name: str
    key_id: str = Field(description="The public part of the key (dlk_<key_id>_...).")
    scopes: list[str]
    created_at: float
    last_used_at: float | None


class ApiKeysPublic(BaseModel):
    keys: list[ApiKeyPublic]


class ApiKeyCreated(BaseModel):
    """The new key: shown in this answer only; the service keeps a hash."""

    name: str
    scopes: list[str]
    key: str


class ApiKeyRevoked(BaseModel):
    name: str
    revoked: bool


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the refusals a route can give, each with its meaning."""
    return {code: {"model": ErrorPublic, "description": _MEANINGS[code]} for code in codes}


_MEANINGS = {
    400: "The body is not valid JSON (or nests deeper, or holds numbers larger, than JSON "
    "parsers accept).",
    404: "No such resource.",
    401: "No API key, or a wrong or revoked one (see WWW-Authenticate).",
    403: "The key lacks the scope this route needs (or a session request its CSRF token).",
    409: "Conflicts with the current state (a job is running, nothing is stored).",
    413: "The body or the batch is too large.",
    415: "The body is not application/json.",
    422: "The request is well-formed but invalid; the detail names each problem.",
    429: "Over this key's rate limit or item cap; retry after Retry-After seconds.",
    503: "The database is unreachable; retry later.",
}
