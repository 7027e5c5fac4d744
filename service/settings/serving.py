"""Serving settings: how /recommend answers and how the online fold-in moves it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ServingSettings(BaseModel):
    """Serving: the online fold-in that keeps a version current between retrains, the
    memory it may hold, and how /recommend finds and keeps top-K answers."""

    fold_in_regularization: float = Field(
        10.0,
        gt=0,
        description=(
            "How many ratings' worth of weight a user's factor vector from the serving "
            "version carries against the user's new ratings (the online fold-in's ridge)."
        ),
    )
    fold_in_bias_regularization: float = Field(
        3.0,
        gt=0,
        description="The same for a user's online bias, which needs less evidence to move.",
    )
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
    fold_in_forgetting: float = Field(
        0.95,
        gt=0,
        le=1,
        description=(
            "Each new event of a user or item first multiplies what it has folded in so far "
            "by this (1: never forget; 0.95: about the last 20 events dominate)."
        ),
    )
    fold_in_replay_events: int = Field(
        50_000,
        ge=0,
        description=(
            "Events up to a version's last training event that are folded in again when "
            "it loads (with every event since), so its online state starts from the recent "
            "stream."
        ),
    )
    popular_window: int = Field(
        5_000,
        ge=1,
        description=(
            "Newest events whose distinct users rank the popular items, the answer for a "
            "user the model has none for."
        ),
    )
    serving_max_users: int | None = Field(
        200_000,
        ge=4096,
        description=(
            "Most users whose online fold-in is kept (about 2.5 KB each at 8 factors); the "
            "least recently seen are evicted and served from the version's vector."
        ),
    )
    serving_max_items: int | None = Field(
        1_000_000,
        ge=4096,
        description=(
            "Most items whose online bias is kept (about 200 bytes each); the least "
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
