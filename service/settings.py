"""One settings object for the whole service.

Values come from CLI flags, then ``DRIFTLINE_*`` environment variables, then defaults.
The object is built once (in the CLI or a test) and handed to the app, never read at
import time, so tests can run several differently configured services side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

if TYPE_CHECKING:
    from service.ingest.validation import EventLimits

#: A list setting, given as comma-separated text in a flag or a ``DRIFTLINE_*`` variable.
Names = Annotated[tuple[str, ...], NoDecode]

#: The names a service bound to loopback is reached by (Host header, without the port).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Settings(BaseSettings):
    """Driftline's configuration (environment prefix ``DRIFTLINE_``)."""

    model_config = SettingsConfigDict(
        env_prefix="DRIFTLINE_", extra="forbid", env_parse_none_str="none"
    )

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    data_dir: Path = Path("data")
    database_url: str | None = Field(
        None, description="Any SQLAlchemy URL; default: SQLite (WAL) under data_dir."
    )
    object_store_url: str | None = Field(
        None, description="Where model artifacts live; default: file:// under data_dir."
    )
    log_level: str = "info"

    # Kafka ingestion (off unless a bootstrap server is given).
    kafka_bootstrap: str | None = Field(None, description="HOST:PORT of a Kafka broker.")
    kafka_topic: str = "events"
    kafka_replica: int = Field(0, ge=0)
    kafka_replicas: int = Field(1, ge=1)
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=(
            "consume: serve Prometheus metrics on HOST:this port (serve has /metrics); "
            "none: not exported."
        ),
    )

    # Ingestion limits and validation.
    rating_min: float = 0.5
    rating_max: float = 5.0
    max_batch_events: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    timestamp_min: float = Field(
        631_152_000.0,
        description="Earliest event timestamp accepted, seconds since 1970 (default: 1990).",
    )
    timestamp_ahead_seconds: float = Field(
        86_400.0, ge=0, description="How far past the server's clock a timestamp may be."
    )

    # Access control and request hardening (README: Security).
    insecure: bool = Field(
        False,
        description=(
            "Serve without API keys on an address other than loopback (anyone who can "
            "reach it can ingest, read and retrain)."
        ),
    )
    public_paths: Names = Field(
        ("/healthz", "/metrics"),
        description="Routes answered without a key, comma-separated (none: every route).",
    )
    trusted_hosts: Names = Field(
        LOOPBACK_HOSTS,
        description=(
            "Host header names accepted, comma-separated; '*' accepts any (a defence "
            "against DNS rebinding: add the names clients use to reach the service)."
        ),
    )
    cors_origins: Names = Field(
        (), description="Origins allowed to call the API from a browser (default: none)."
    )
    session_secret: SecretStr | None = Field(
        None,
        description=(
            "Signs dashboard sessions and CSRF tokens; default: random per process (set "
            "one for several serve replicas behind one address)."
        ),
    )
    session_hours: float = Field(12.0, gt=0, description="How long a dashboard sign-in lasts.")
    key_refresh_seconds: float = Field(
        1.0,
        gt=0,
        description="How often the key table is reread: the most a revoked key lives on.",
    )

    # Abuse limits, per key (or per client address when the service is open).
    ingest_rate_events: float | None = Field(
        None, gt=0, description="Events per second one key may ingest (none: unlimited)."
    )
    ingest_burst_events: int | None = Field(
        None,
        ge=1,
        description="Events a key may ingest at once (default: one second's worth, at least "
        "MAX_BATCH_EVENTS).",
    )
    recommend_rate: float | None = Field(
        None, gt=0, description="GET /recommend requests per second per key (none: unlimited)."
    )
    recommend_burst: int | None = Field(
        None, ge=1, description="Requests a key may make at once (default: one second's worth)."
    )
    ingest_item_cap: int | None = Field(
        None,
        ge=1,
        description=(
            "Most events one key may ingest for one item per INGEST_ITEM_WINDOW_SECONDS "
            "(none: no cap); limits how far one client can push an item up."
        ),
    )
    ingest_item_window_seconds: float = Field(3600.0, gt=0)

    # Prequential evaluation and drift detection.
    heartbeat_events: int = Field(500, ge=1)
    heartbeat_seconds: float | None = Field(None, gt=0)
    drift_detector: str = Field(
        "page-hinkley", description="Which drift detector: a name in drift.DETECTORS."
    )
    adwin_delta: float = Field(0.002, gt=0, lt=1)
    min_relative_drop: float = Field(0.1, ge=0)
    min_heartbeats: int = Field(5, ge=1)
    ranking_min_rating: float = Field(
        4.0,
        description="A labelled event rated at least this is ranked for hit-rate@10 and NDCG@10.",
    )
    ranking_sample: float = Field(
        0.1,
        ge=0,
        le=1,
        description=(
            "Share of those events ranked, a fixed hash sample of user, item and timestamp "
            "(the same events for every model and run); 0 turns ranking off."
        ),
    )

    # Retraining.
    retrain_enabled: bool = True
    bootstrap_events: int = Field(1000, ge=1)
    refresh_events: int | None = Field(10_000, ge=1)
    history_sample: int = Field(50_000, ge=0)
    drift_window_history_ratio: float | None = Field(
        3.0,
        ge=0,
        description=(
            "A drift job trains on every event since the alert's change point plus a uniform "
            "sample of older events, at most this many per recent event (and at most "
            "HISTORY_SAMPLE); none: a drift job's window is like any other job's."
        ),
    )
    drift_window_persists: bool = Field(
        True,
        description=(
            "Jobs after a drift job (refreshes, policy and manual jobs) also build their "
            "window from the latest alert's change point, until the next alert or until "
            "HISTORY_SAMPLE events have arrived since it; false: only the drift job does."
        ),
    )
    drift_window_user_change_ratio: float | None = Field(
        1.4,
        gt=0,
        description=(
            "A change window leaves out the older events of users whose events since the "
            "change the job's base version predicts with an RMSE at least this many times "
            "the window's (3 events or more): they are learnt from the change on; none: "
            "every user's older events may be sampled."
        ),
    )
    factors: int = Field(8, ge=1, le=512)
    learning_rate: float = Field(0.05, gt=0)
    regularization: float = Field(0.1, ge=0)
    item_bias_support: float = Field(
        20.0,
        ge=0,
        description=(
            "A trained version's item biases and factors are damped by n / (n + this), n the "
            "item's ratings in the job's window, so that an item rated once at 5 stars does "
            "not top every list; 0 keeps them as trained."
        ),
    )
    batch_size: int = Field(1024, ge=1)
    max_epochs: int = Field(30, ge=1)
    target_loss: float | None = Field(None, gt=0)
    latency_cap_seconds: float = Field(
        120.0,
        gt=0,
        description=(
            "A job's deadline: it stops once this many seconds have passed. GP-OPT picks "
            "the cheapest config that meets each epoch's share of it, so a job takes about "
            "as long as this allows: at 600 s a refresh could take ten minutes to reflect "
            "new data. 120 s keeps a refresh within two minutes of its trigger. driftline demo "
            "(local runtime, with DRIFT_LATENCY_CAP_SECONDS 30): post-onset RMSE 0.8691 and "
            "hit-rate@10 0.027 for $0.0014 of jobs, against 0.8699-0.8709 and 0.017-0.023 "
            "for $0.0009-0.0011 at 600 s and none, and static's 0.8707 and 0.026 for "
            "$0.0095; refreshes took 10-25 s (600 s: 11-56 s, static: 8-29 s)."
        ),
    )
    drift_latency_cap_seconds: float | None = Field(
        30.0,
        gt=0,
        description=(
            "A drift-triggered job's deadline where tighter than LATENCY_CAP_SECONDS (None: "
            "the same): until it swaps in, the model that drifted serves. GP-OPT meets it "
            "with more workers; on functions that costs little more (bench policies: a "
            "20 s drift deadline against 120 s made drift jobs 1.7-6x faster than "
            "cost-aware's jobs, for a 9-26 % dearer adwin bill; 25 s: 1.7-4.7x, 30 s: "
            "1.5-3.9x, the tighter the dearer by the workers' requests). 30 s: on driftline demo "
            "drift jobs took 10-27 s (at none: 8-32 s) and one of a 22,700-event "
            "window bought workers to keep it, $0.0007."
        ),
    )
    drift_preempts_jobs: bool = Field(
        True,
        description=(
            "A drift alert that finds a scheduled job (a refresh) running stops it after its "
            "epoch in flight, unpublished and recorded 'preempted', and its drift job starts "
            "at once; false: the drift job waits for that job to end. Bootstrap, drift and "
            "manual jobs always run to the end."
        ),
    )
    retrain_budget_usd: float | None = Field(
        None, gt=0, description="Stop a job once its workers have cost this much (USD)."
    )
    seed: int | None = 0
    retrain_runtime: Literal["inprocess", "local", "lambda", "gpu", "sim", "thread"] = Field(
        "local",
        description=(
            "Where epochs run: this process, Lambda-like worker processes, the deployed "
            "Lambda function, torch worker processes, in this process with simulated "
            "Lambda timings and bill, or workers on threads of this process."
        ),
    )
    lambda_function: str = Field(
        "driftline-worker", description="The deployed worker (RETRAIN_RUNTIME=lambda)."
    )
    retrain_policy: str = Field(
        "adwin",
        description=(
            "When to retrain: a name in retrain.policies.POLICIES (adwin, best-effort, "
            "cost-aware, continuum, periodic, never)."
        ),
    )
    retrain_interval_s: float = Field(
        300.0,
        gt=0,
        description="RETRAIN_POLICY=cost-aware: seconds between batch retrains (SandPiper: 5 min).",
    )
    continuum_weight: float = Field(
        10.0,
        gt=0,
        description=(
            "RETRAIN_POLICY=continuum: w in 'retrain when the pending data's latency regret "
            "exceeds w x the fixed cost of a retrain'; larger waits longer, retrains less."
        ),
    )
    periodic_events: int = Field(
        10_000, ge=1, description="RETRAIN_POLICY=periodic: labelled events between retrains."
    )
    retrain_configurator: str = Field(
        "gp",
        description=(
            "Who picks each epoch's config vector: a name in configurator.CONFIGURATORS "
            "(gp: GP-OPT, the cheapest config that meets the deadline, so a job takes "
            "about as long as LATENCY_CAP_SECONDS allows, and a drift alert pre-empts a "
            "refresh (DRIFT_PREEMPTS_JOBS); static: the RETRAIN_WORKERS, "
            "RETRAIN_MEMORY_MB, ... defaults every epoch)."
        ),
    )
    retrain_configurator_process: bool = Field(
        True,
        description=(
            "Run GP-OPT's decisions and refits in a child process of the service rather "
            "than beside /recommend's threads under one interpreter lock (bench serve: "
            "p99 under ingestion and a retrain 440 ms in process)."
        ),
    )
    retrain_sync: str = Field(
        "selective",
        description="How epochs synchronise workers: bsp, selective (κ of λ) or asp.",
    )
    retention_versions: int = Field(
        20,
        ge=1,
        description=(
            "Model versions whose artifacts are kept; older ones are deleted from the object "
            "store (never the serving one, the first one, or one a running job builds on)."
        ),
    )
    retrain_workers: int = Field(4, ge=1, le=1000)
    retrain_sync_ratio: float = Field(0.75, gt=0, le=1)
    retrain_memory_mb: int = Field(1024, ge=128, le=10_240)

    # Serving.
    fold_in_regularization: float = Field(10.0, gt=0)
    fold_in_bias_regularization: float = Field(3.0, gt=0)
    fold_in_item_bias_regularization: float = Field(
        3.0,
        gt=0,
        description=(
            "An item's online bias, as predictions use it, is the sum of its residuals "
            "over this plus their count."
        ),
    )
    fold_in_scale_regularization: float = Field(
        1.0,
        gt=0,
        description=(
            "How many ratings' worth of weight a user's scale on item biases (prior 1) "
            "carries: a user who turns against the crowd, rating low what most rate high, "
            "takes a negative scale within a few ratings (bench drift: post-drift RMSE on "
            "MovieLens with a taste inversion 0.892 -> 0.868)."
        ),
    )
    ranking_item_bias_regularization: float = Field(
        150.0,
        gt=0,
        description=(
            "How far ranking (top-K, hit-rate@10) shrinks an item's online residuals towards "
            "the serving version's item bias, in ratings: a larger value keeps items with a "
            "handful of high ratings off every list; predictions never read it (bench drift: "
            "150 ranked at least as well as 30 in all ten runs, hit-rate@10 0.019 -> 0.031 "
            "after a taste inversion on MovieLens)."
        ),
    )
    fold_in_forgetting: float = Field(0.95, gt=0, le=1)
    fold_in_replay_events: int = Field(50_000, ge=0)
    popular_window: int = Field(5_000, ge=1)
    serving_max_users: int | None = Field(
        200_000,
        ge=4096,
        description=(
            "Most users whose online fold-in is kept (about 1 KB each at 8 factors); the "
            "least recently seen are evicted and served from the version's vector."
        ),
    )
    serving_max_items: int | None = Field(
        1_000_000,
        ge=4096,
        description=(
            "Most items whose online bias is kept (about 150 bytes each); the least "
            "recently seen are evicted and get a zero online bias."
        ),
    )
    serving_history_pairs: int | None = Field(
        500_000,
        ge=4096,
        description=(
            "Most (user, item) pairs kept in memory to leave a user's rated items out of "
            "/recommend and of prequential ranking (about 130 bytes each); the least "
            "recently seen users are evicted first, and an evicted user's earlier items "
            "are no longer left out."
        ),
    )
    serving_index: Literal["exact", "ann", "auto"] = Field(
        "auto",
        description=(
            "How /recommend finds a user's top items: score every item (exact), ask an "
            "approximate inner-product index built at each swap (ann), or ann from "
            "SERVING_ANN_MIN_ITEMS items on (auto)."
        ),
    )
    serving_ann_min_items: int = Field(
        50_000,
        ge=1,
        description=(
            "With SERVING_INDEX=auto, catalogues of at least this many items get an ANN "
            "index: below it, scoring every item costs about as much as a search."
        ),
    )
    serving_ann_probes: int = Field(
        32,
        ge=1,
        description=(
            "Inverted lists the ANN index scans per request (of about sqrt(items)): more "
            "raise recall and cost time."
        ),
    )
    serving_ann_kept_variance: float = Field(
        0.85,
        gt=0.0,
        le=1.0,
        description=(
            "Share of the items' variance the ANN index's searched dimensions keep "
            "(leading principal components, at least 32; candidates rescored exactly); "
            "1: search every dimension."
        ),
    )
    serving_ann_codes: Literal["pq4", "flat"] = Field(
        "pq4",
        description=(
            "What the ANN index's lists hold of each item: 'pq4' (4 bits a searched "
            "dimension, scanned 2.3x faster, the best 300 rescored exactly) or 'flat' "
            "(floats). Catalogues under 4,096 items are always flat."
        ),
    )
    serving_cached_answers: int = Field(
        100_000,
        ge=0,
        description=(
            "Most top-K answers kept for repeated requests; an event of the user or a "
            "swap ends an answer at once (0: none)."
        ),
    )
    serving_answer_max_age_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description=(
            "How long a kept answer may go on serving while other users' events move the "
            "item biases it was ranked with (0: only until the next ingested batch, "
            "which keeps every answer exact but few answers kept under ingestion)."
        ),
    )
    server_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto", description="serve's event loop (auto: uvloop where installed)."
    )
    server_http: Literal["auto", "h11", "httptools"] = Field(
        "auto", description="serve's HTTP/1.1 parser (auto: httptools where installed)."
    )
    server_switch_interval_ms: float = Field(
        5.0,
        gt=0,
        le=100,
        description=(
            "How long a thread may hold the interpreter before another may run (Python's "
            "default, 5 ms). Ingestion, heartbeats and swaps compute in the server's threads; "
            "a shorter turn hands the request loop back sooner, but 1 ms did not lower the "
            'p99 under ingestion reliably (BENCHMARKS.md "serve").'
        ),
    )
    registry_poll_seconds: float | None = Field(
        10.0, gt=0, description="How often to look for versions other processes published."
    )

    # Alert delivery (service/alerting): off unless a webhook is given. The URL is a
    # secret (a Slack webhook URL is its own credential), so it is never shown.
    alert_webhook_url: SecretStr | None = Field(
        None,
        description="Slack-compatible webhook (http or https) that drift alerts, failed jobs "
        "and spent budgets are posted to.",
    )
    alert_webhook_cooldown_s: float = Field(
        600.0, ge=0, description="A notice like one sent this recently (seconds) is suppressed."
    )
    alert_runbook_url: str | None = Field(
        None, description="Runbook linked from each notice (with #drift, #job_failed, #budget)."
    )

    @field_validator("alert_webhook_url", "alert_runbook_url")
    @classmethod
    def _http_url(cls, value: Any) -> Any:
        shown = value.get_secret_value() if isinstance(value, SecretStr) else value
        if shown is not None and not str(shown).lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("retrain_policy", "retrain_configurator", "retrain_sync", "drift_detector")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        """A choice must name an entry of its registry (imported here, not at module
        import, so that reading settings stays cheap)."""
        choices = sorted(_registry(info.field_name or ""))
        if value not in choices:
            raise ValueError(f"unknown {info.field_name} {value!r}; choose from {choices}")
        return value

    @field_validator("public_paths", "trusted_hosts", "cors_origins", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        """Comma-separated text (a flag or a variable) as a tuple; ``none`` as empty."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return () if value is None else value

    @model_validator(mode="after")
    def _check_ranges(self) -> Self:
        if self.kafka_replica >= self.kafka_replicas:
            raise ValueError(
                f"kafka_replica ({self.kafka_replica}) must be below kafka_replicas "
                f"({self.kafka_replicas})"
            )
        if self.rating_min >= self.rating_max:
            raise ValueError(
                f"rating_min ({self.rating_min}) must be below rating_max ({self.rating_max})"
            )
        if self.retrain_runtime == "lambda" and not self.resolved_object_store_url.startswith(
            "s3://"
        ):
            raise ValueError(
                "retrain_runtime lambda needs an s3:// object_store_url: workers on AWS "
                f"cannot read {self.resolved_object_store_url}"
            )
        return self

    @property
    def event_limits(self) -> EventLimits:
        """What an ingested event may carry (HTTP and Kafka alike)."""
        from service.ingest.validation import EventLimits

        return EventLimits(
            self.rating_min, self.rating_max, self.timestamp_min, self.timestamp_ahead_seconds
        )

    @property
    def resolved_database_url(self) -> str:
        """The database URL in force: the configured one or SQLite under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'driftline.db').resolve()}"

    @property
    def resolved_object_store_url(self) -> str:
        """The object store URL in force: the configured one or ``file://`` under ``data_dir``."""
        if self.object_store_url:
            return self.object_store_url
        return f"file://{(self.data_dir / 'objects').resolve()}"


def _registry(field: str) -> Iterable[str]:
    """The names a registry-backed setting may take."""
    from configurator import CONFIGURATORS
    from drift import DETECTORS
    from retrain.policies import POLICIES
    from retrain.sync import SYNC_POLICIES

    registries: dict[str, Iterable[str]] = {
        "retrain_policy": POLICIES,
        "retrain_configurator": CONFIGURATORS,
        "retrain_sync": SYNC_POLICIES,
        "drift_detector": DETECTORS,
    }
    return registries[field]
