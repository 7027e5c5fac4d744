"""Security settings: who may call the service, from where, and how much."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

#: A list setting, given as comma-separated text in a flag or a ``DRIFTLINE_*`` variable.
Names = Annotated[tuple[str, ...], NoDecode]

#: The names a service bound to loopback is reached by (Host header, without the port).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class SecuritySettings(BaseModel):
    """Access control, request hardening and abuse limits (README: Security). Limits are
    per API key, or per client address when the service is open."""

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
    ingest_item_window_seconds: float = Field(
        3600.0, gt=0, description="The window of INGEST_ITEM_CAP, in seconds."
    )

    @field_validator("public_paths", "trusted_hosts", "cors_origins", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        """Comma-separated text (a flag or a variable) as a tuple; ``none`` as empty."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return () if value is None else value
