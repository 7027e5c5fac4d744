"""Stack settings: the service's address and process, and what it is wired to."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class StackSettings(BaseModel):
    """Where the service runs and what it is wired to: its address and server process,
    the database, the object store, Kafka, logging, the registry poll and alert delivery."""

    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    data_dir: Path = Field(
        Path("data"), description="Directory of the embedded SQLite file and file:// object store."
    )
    database_url: str | None = Field(
        None, description="Any SQLAlchemy URL; default: SQLite (WAL) under data_dir."
    )
    object_store_url: str | None = Field(
        None, description="Where model artifacts live; default: file:// under data_dir."
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    gc_young_threshold: int = Field(
        50_000,
        ge=0,
        description=(
            "Net new container objects between collections of the garbage collector's "
            "youngest generation (Python's default is 700, too few for a batch from many "
            "distinct users: it collects several times a batch); 0 leaves Python's setting."
        ),
    )

    # Kafka ingestion (off unless a bootstrap server is given).
    kafka_bootstrap: str | None = Field(None, description="HOST:PORT of a Kafka broker.")
    kafka_topic: str = Field("events", description="Topic to consume.")
    kafka_group: str = Field(
        "driftline",
        min_length=1,
        description="Consumer group the consume replicas join; Kafka shares the topic's "
        "partitions among its members.",
    )
    kafka_session_timeout_ms: int = Field(
        10_000,
        ge=1_000,
        le=300_000,
        description="How long the group waits for a silent replica (killed, hung) before "
        "giving its partitions to the others; heartbeats go every sixth of it.",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=(
            "consume: serve Prometheus metrics on HOST:this port (serve has /metrics); "
            "none: not exported."
        ),
    )

    # The server process.
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
