"""Drift settings: prequential evaluation and the detector that watches it."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from service.settings.choices import check_registered


class DriftSettings(BaseModel):
    """Prequential evaluation (every labelled event scored before it is learnt, its
    errors grouped into heartbeats) and drift detection on those errors."""

    heartbeat_events: int = Field(
        500, ge=1, description="Labelled events whose errors make one heartbeat (an RMSE)."
    )
    heartbeat_seconds: float | None = Field(
        None,
        gt=0,
        description=(
            "A heartbeat also closes once this many seconds have passed with errors "
            "pending, so a quiet stream still reports its accuracy (none: by count only)."
        ),
    )
    drift_detector: str = Field(
        "page-hinkley", description="Which drift detector: a name in drift.DETECTORS."
    )
    adwin_delta: float = Field(
        0.002,
        gt=0,
        lt=1,
        description=(
            "Significance level of the adwin detectors (kswin's alpha): smaller, fewer "
            "false alerts and later ones."
        ),
    )
    min_relative_drop: float = Field(
        0.1, ge=0, description="Smallest relative rise of the error that counts as drift."
    )
    min_heartbeats: int = Field(
        5,
        ge=1,
        description=(
            "adwin-heartbeat's grace period: no change is declared on fewer heartbeats "
            "either side of it."
        ),
    )
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

    @field_validator("drift_detector")
    @classmethod
    def _registered_detector(cls, value: str) -> str:
        return check_registered("drift_detector", value)
