"""Stream settings: what an ingested event may carry and how many arrive at once."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator

from service.settings.limits import EventLimits


class StreamSettings(BaseModel):
    """What the event stream accepts, over HTTP and Kafka alike: the rating scale, the
    timestamps and the size of a batch."""

    rating_min: float = Field(
        0.5, description="Lowest rating an event may carry; predictions are clipped to it."
    )
    rating_max: float = Field(
        5.0, description="Highest rating an event may carry; predictions are clipped to it."
    )
    max_batch_events: int = Field(
        10_000, ge=1, description="Most events one POST /ingest may carry."
    )
    ingest_coalesce_events: int = Field(
        2_000,
        ge=0,
        description=(
            "Most events of POST /ingest batches waiting at once that are stored in one "
            "transaction and learnt as one batch (each request still gets its own "
            "answer); 0 or 1 stores every batch alone."
        ),
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest POST /ingest body accepted, in bytes."
    )
    timestamp_min: float = Field(
        631_152_000.0,
        description="Earliest event timestamp accepted, seconds since 1970 (default: 1990).",
    )
    timestamp_ahead_seconds: float = Field(
        86_400.0, ge=0, description="How far past the server's clock a timestamp may be."
    )

    @model_validator(mode="after")
    def _check_ratings(self) -> Self:
        if self.rating_min >= self.rating_max:
            raise ValueError(
                f"rating_min ({self.rating_min}) must be below rating_max ({self.rating_max})"
            )
        return self

    @property
    def event_limits(self) -> EventLimits:
        """What an ingested event may carry (HTTP and Kafka alike)."""
        return EventLimits(
            self.rating_min, self.rating_max, self.timestamp_min, self.timestamp_ahead_seconds
        )
