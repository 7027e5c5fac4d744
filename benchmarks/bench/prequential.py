"""``driftline bench prequential``: accuracy and hot-path speed against river, same run.

The stream goes through the service's own pipeline in-process (event store, fold-in,
heartbeats, ADWIN, retraining) batch by batch, and river's ``BiasedMF`` learns the same
batch right after, so both see the same machine load. Retraining jobs run inline so
the run is reproducible; hot-path throughput excludes the time spent inside them (the
service runs them off the ingestion path), which ``retrain_s`` reports. Hit-rate@10 and
NDCG@10 are measured on the pipeline's fixed sample of liked events (``RANKING_SAMPLE``),
the same events for river, whose ranking time is left out of its speed.

Two speeds are reported: ``driftline_events_per_s`` is the whole ingest path (the
event store's transaction included) and ``learning_path_events_per_s`` the learning
path alone, everything after the store: evaluation, fold-in, the ranking sample, the
static track, popular items, the drift monitor and the trigger. River keeps no store,
so the learning path is what compares with its learn rate like for like
(``learning_path_ratio_to_river``); ``driftline bench ingest`` holds storage to its own
target. ``learning_path_us_per_event`` splits the learning path into its stages, timed
where the path calls them, with the part a version in shadow adds to the fold-in and
the ranking.

The stream runs twice: with the rollout guard (the default; the figures above) and
without it (``unguarded``: each version serves at publication), side by side, with what
the guard decided and each promoted version's accuracy against its predecessor's
(``benchmarks.bench.rollout``); ``shadow_cost`` times the learning path with a version
in shadow against without one.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.baselines import RiverTrack
from benchmarks.bench.rollout import UNGUARDED, guard_figures, shadow_cost
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings
from benchmarks.stage_clock import StageClock
from service.serving.model import ServingModel
from service.settings import Settings
from service.store.alerts import list_alerts
from service.store.events import NewEvent
from service.store.jobs import count_jobs
from service.stream.shadow import ShadowTrack
from service.wiring import Driftline, build_driftline

#: The learning path's stages in ``learning_path_us_per_event``, added up to the path;
#: ``shadow_fold_in`` and ``shadow_ranking`` are the version in shadow's part of
#: ``fold_in`` and ``ranking``, inside them.
LEARNING_PATH_STAGES = (
    "fold_in",
    "ranking",
    "popular",
    "static_track",
    "monitor",
    "guard",
    "trigger",
)


def pipeline_events(
    stream: RatingStream, start: int, stop: int, prefix: str = "ev"
) -> list[NewEvent]:
    """Events ``start``..``stop`` of ``stream`` as the pipeline takes them, with ids stable
    across replays."""
    return [
        NewEvent(
            stream.user_ids[i],
            stream.item_ids[i],
            float(stream.ratings[i]),
            float(stream.timestamps[i]),
            f"{prefix}-{i}",
        )
        for i in range(start, stop)
    ]


def replay_beside_river(
    pipeline: Driftline, river: RiverTrack, stream: RatingStream, size: int, first: int = 0
) -> float:
    """Seconds the pipeline spent ingesting events ``first`` on, retraining included;
    river learns the same batches after it."""
    spent = 0.0
    for start in range(first, len(stream), size):
        stop = min(start + size, len(stream))
        batch = pipeline_events(stream, start, stop)
        began = time.perf_counter()
        pipeline.ingest(batch)
        spent += time.perf_counter() - began
        river.process(
            stream.user_ids[start:stop],
            stream.item_ids[start:stop],
            stream.ratings[start:stop],
            stream.timestamps[start:stop],
        )
    return spent


def run_prequential(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 500
) -> dict[str, Any]:
    stream, found = open_ratings(dataset, limit=limit)
    result = _run(stream, batch_size)
    unguarded = _run(stream, batch_size, **UNGUARDED)
    return {
        "dataset": found.label,
        **result,
        "unguarded": {
            key: value
            for key, value in unguarded.items()
            if key.startswith(("driftline_", "learning_path", "alerts", "retrains", "model_"))
            or key in ("guard", "static_rmse")
        },
        "shadow_cost": shadow_cost(stream, batch_size),
    }


def _run(stream: RatingStream, batch_size: int, **overrides: Any) -> dict[str, Any]:
    """One replay through a pipeline with the default settings and ``overrides``."""
    with (
        tempfile.TemporaryDirectory(prefix="driftline-bench-") as tmp,
        StageClock().restoring() as clock,
    ):
        settings = Settings(data_dir=Path(tmp), retrain_runtime="inprocess", **overrides)
        pipeline = build_driftline(settings, background_retrain=False)
        pipeline.kernels_ready.wait()  # loaded at start, as a server does
        clock.wrap("store", pipeline.writer, "store_all")
        # What the registry follower does in a server (load each published version, swap
        # to it or start its shadow), done inline here after a job.
        clock.wrap("publication", pipeline, "_serve_inline_publication")
        time_learning_path(pipeline, clock)
        river = RiverTrack(ranking=pipeline.learner.ranking.sampler)
        spent = replay_beside_river(pipeline, river, stream, batch_size)
        # Jobs and what follows their publication run inline here; the service runs both
        # off the ingest path (the job thread, the registry follower), so both are
        # excluded: the training, and the loading, swapping and shadow starts.
        training_s = pipeline.retrainer.training_seconds
        retrain_s = training_s + clock.seconds["publication"]
        with pipeline.db.connect() as conn:
            alerts = len(list_alerts(conn, limit=100_000, kind="drift"))
            retrains = count_jobs(conn, status="succeeded")
        versions = len(pipeline.registry.versions())
        summary = pipeline.learner.tracker.summary()
        ranking = pipeline.learner.ranking.tracker
        guard = guard_figures(pipeline)
        pipeline.retrainer.close()
        pipeline.db.dispose()
    learning_s = spent - retrain_s - clock.seconds["store"]
    clock.seconds["trigger"] -= training_s  # the jobs ran inside the trigger's check
    return {
        "events": len(stream),
        "batch_size": batch_size,
        "driftline_rmse": summary["driftline"]["rmse"],
        "static_rmse": summary["static"]["rmse"],
        "river_rmse": river.rmse,
        "ranking_sample": settings.ranking_sample,
        "ranked_events": ranking.count("driftline"),
        "driftline_hit_rate": ranking.hit_rate("driftline"),
        "static_hit_rate": ranking.hit_rate("static"),
        "river_hit_rate": river.hit_rate,
        "driftline_ndcg": ranking.ndcg("driftline"),
        "static_ndcg": ranking.ndcg("static"),
        "river_ndcg": river.ndcg,
        "alerts": alerts,
        "retrains": retrains,
        "model_versions": versions,
        "driftline_events_per_s": len(stream) / (spent - retrain_s),
        "learning_path_events_per_s": len(stream) / learning_s,
        "learning_path_ratio_to_river": len(stream) / learning_s / river.events_per_s,
        "learning_path_us_per_event": _per_event(clock.seconds, learning_s, len(stream)),
        "store_s": clock.seconds["store"],
        "driftline_with_retraining_events_per_s": len(stream) / spent,
        "retrain_s": retrain_s,
        "ranking_s": pipeline.learner.ranking.seconds,
        "river_events_per_s": river.events_per_s,
        "river_us_per_event": 1e6 / river.events_per_s,
        "guard": guard,
    }


def time_learning_path(pipeline: Driftline, clock: StageClock) -> None:
    """Time the learning path's stages where the path calls them (``bench stages`` too).
    The fold-in is timed on its classes, each version swapped in and each shadow being a
    new object: wrap inside ``StageClock.restoring``."""
    learner = pipeline.learner
    clock.wrap("fold_in", ServingModel, "predict_then_learn_vectors")
    clock.wrap("shadow_fold_in", ShadowTrack, "predict_then_learn")
    clock.wrap("ranking", learner.ranking, "rank")
    clock.wrap("shadow_ranking", learner.ranking, "_shadow_ranks")
    clock.wrap("popular", learner.popular, "add")
    clock.wrap("static_track", learner, "_static_predict")
    clock.wrap("monitor", pipeline.monitor, "observe")
    clock.wrap("trigger", pipeline.trigger, "observe_events")
    clock.wrap("trigger", pipeline.trigger, "after_batch")
    if pipeline.guard is not None:
        clock.wrap("guard", pipeline.guard, "observe")
        clock.wrap("guard", pipeline.guard, "act")


def _per_event(seconds: dict[str, float], learning_s: float, events: int) -> dict[str, float]:
    """µs per event of each stage of the learning path, ``other`` the rest of it (the
    learner's and the path's own code), and the shadow's parts."""
    stages = {stage: seconds[stage] for stage in LEARNING_PATH_STAGES}
    stages["other"] = learning_s - sum(stages.values())
    stages["shadow_fold_in"] = seconds["shadow_fold_in"]
    stages["shadow_ranking"] = seconds["shadow_ranking"]
    return {stage: round(1e6 * spent / events, 3) for stage, spent in stages.items()}
