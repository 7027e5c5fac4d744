"""Rollout settings: the guard between a published version and serving (decision 0010)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator


class RolloutSettings(BaseModel):
    """Guarded rollout: a published version runs in shadow beside the serving one, is
    promoted only when a paired comparison on the same live events finds it not worse,
    and is watched after promotion, with an automatic rollback when the version it
    replaced does clearly better (docs/decisions/0010-guarded-rollout.md)."""

    guard_enabled: bool = Field(
        True,
        description="Run each published version in shadow before it serves, and watch it "
        "after; off: every published version serves at once.",
    )
    guard_observe_only: bool = Field(
        False,
        description="The guard measures without deciding: every version is promoted at "
        "once and watched, never held or rolled back (to compare the guard with none).",
    )
    shadow_events: int | None = Field(
        None,
        ge=1,
        description="Labelled events a shadow compares before it decides. None: as many "
        "as the comparison needs to reach SHADOW_CONFIDENCE, at most SHADOW_MAX_EVENTS.",
    )
    shadow_min_events: int = Field(
        2_000,
        ge=1,
        description="Fewest labelled events a shadow compares before it promotes a "
        "version (a drift job's version clearly better may go at SHADOW_EARLY_EVENTS).",
    )
    shadow_early_events: int = Field(
        500,
        ge=1,
        description="Fewest labelled events after which a drift job's version that is "
        "clearly better than the serving one (its RMSE interval below zero) is promoted, "
        "and after which a watch may roll back.",
    )
    shadow_max_events: int = Field(
        10_000,
        ge=1,
        description="Most labelled events a shadow compares; then SHADOW_TIMEOUT_RULE decides. "
        "A scheduled job waits while a version is in shadow: more than REFRESH_EVENTS puts "
        "the next refresh off.",
    )
    shadow_max_s: float = Field(
        3_600.0,
        gt=0,
        description="Most seconds a shadow runs; then SHADOW_TIMEOUT_RULE decides.",
    )
    shadow_tolerance: float = Field(
        0.005,
        ge=0,
        lt=1,
        description="How much worse a version's RMSE may be than the serving one's, "
        "relative (0.005: 0.5 %), and still be promoted.",
    )
    shadow_ranking_tolerance: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="How much lower a version's hit-rate@10 may be than the serving "
        "one's, relative (0.05: 5 %), before it counts against the version.",
    )
    shadow_ranking_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of the ranking sample (RANKING_SAMPLE) a version in shadow is "
        "ranked on beside the serving one, for the paired hit-rate@10 and NDCG@10 (a "
        "nested sample). Ranking costs in proportion to the catalogue: lower it for "
        "catalogues far larger than MovieLens' 10,000 items.",
    )
    shadow_confidence: float = Field(
        0.95,
        gt=0.5,
        lt=1,
        description="Confidence of the paired comparison's intervals (users as the unit).",
    )
    shadow_timeout_rule: Literal["estimate", "promote", "hold"] = Field(
        "estimate",
        description="What a shadow that reached SHADOW_MAX_EVENTS or SHADOW_MAX_S "
        "undecided gets: estimate (promoted if its estimates are within the tolerances, "
        "else held), promote, or hold.",
    )
    watch_events: int = Field(
        5_000,
        ge=0,
        description="Labelled events after a promotion during which the version it "
        "replaced runs in shadow; the guard rolls back if that one does clearly better "
        "(0: no watch).",
    )

    @model_validator(mode="after")
    def _check_shadow_lengths(self) -> Self:
        if self.shadow_min_events > self.shadow_max_events:
            raise ValueError(
                f"shadow_min_events ({self.shadow_min_events}) must not exceed "
                f"shadow_max_events ({self.shadow_max_events})"
            )
        return self
