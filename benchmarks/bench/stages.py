"""``driftline bench stages``: what each stage of the ingest path costs per event.

The learning path stores each event once, evaluates the serving model on it (RMSE, the
never-retrained track, and hit-rate@10 on a sample), folds it into its user's vector and
its item's bias, feeds the drift monitor and keeps popular items current. This bench
times each stage where it is called, per batch (no profiler in the way: a timer pair per
stage and batch), on a served version with retraining held off, so the figures are the
steady path between jobs:

* ``store``: the batch's transaction (``EventWriter.store_all``);
* ``fold_in``: predict then learn (``ServingModel.predict_then_learn_vectors``);
* ``ranking``: the ranking sample and the rated-items history (``PrequentialRanking.rank``);
* ``static_track``: the never-retrained model's predictions;
* ``tracks``: the running RMSE of both tracks;
* ``popular``: the popular items' window;
* ``monitor``: heartbeats, the detector, segments and their writes (``StreamMonitor.observe``);
* ``trigger``: the policy's bookkeeping and its check;
* ``other``: everything else ``Driftline.ingest`` does (the rest of the learner and the
  path's own code).

The monitor's parts are reported beside it (``monitor_parts``, inside ``monitor``, not
added to the total): ``detector`` (the detector's heartbeat updates), ``segments`` (the
segment buffer's counts) and ``write`` (the commit of the heartbeats the batch closed,
with the detector's state; ``StreamMonitor.flush``).

river's ``BiasedMF`` learns the same events in the same run: its events/s is the
yardstick the learning path is held to (BENCHMARKS.md "prequential").
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.baselines import RiverTrack
from benchmarks.bench.prequential import pipeline_events, replay_beside_river, time_learning_path
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings
from benchmarks.stage_clock import StageClock
from service.settings import Settings
from service.wiring import Driftline, build_driftline

#: The share of the stream ingested, and trained on, before the timed part.
WARM_SHARE = 0.2

STAGES = (
    "store",
    "fold_in",
    "ranking",
    "static_track",
    "tracks",
    "popular",
    "monitor",
    "trigger",
)

#: Parts of the ``monitor`` stage, timed inside it: (name, attribute of the monitor, method).
MONITOR_PARTS = (
    ("detector", "detector", "update"),
    ("segments", "segments", "record"),
    ("write", None, "flush"),
)


def _instrument(pipeline: Driftline, clock: StageClock) -> None:
    clock.wrap("store", pipeline.writer, "store_all")
    time_learning_path(pipeline, clock)
    clock.wrap("tracks", pipeline.learner.tracker, "record")
    monitor = pipeline.monitor
    for part, owner, method in MONITOR_PARTS:
        clock.wrap(f"monitor.{part}", monitor if owner is None else getattr(monitor, owner), method)


def steady_pipeline(
    stream: RatingStream, data_dir: Path, warm: int, batch_size: int, prefix: str = "ev"
) -> Driftline:
    """An in-process pipeline in ``data_dir`` that has ingested and trained on the first
    ``warm`` events of ``stream`` (event ids ``prefix``-numbered), its trigger then held
    off: the steady path between jobs, which only the retrains a benchmark starts itself
    interrupt."""
    settings = Settings(
        data_dir=data_dir,
        retrain_runtime="inprocess",
        bootstrap_events=len(stream) + 1,
        refresh_events=None,
    )
    pipeline = build_driftline(settings, background_retrain=False)
    pipeline.kernels_ready.wait()  # loaded at start, as a server does
    for start in range(0, warm, batch_size):
        pipeline.ingest(pipeline_events(stream, start, min(warm, start + batch_size), prefix))
    pipeline.retrain_now("bench")
    pipeline.trigger.enabled = False
    return pipeline


def run_stages(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 500
) -> dict[str, Any]:
    stream, found = open_ratings(dataset, limit=limit)
    warm = int(len(stream) * WARM_SHARE)
    with (
        tempfile.TemporaryDirectory(prefix="driftline-bench-stages-") as tmp,
        StageClock().restoring() as clock,
    ):
        pipeline = steady_pipeline(stream, Path(tmp), warm, batch_size)
        _instrument(pipeline, clock)
        river = RiverTrack(ranking=pipeline.learner.ranking.sampler)
        total = replay_beside_river(pipeline, river, stream, batch_size, first=warm)
        pipeline.db.dispose()
    events = len(stream) - warm
    per_event = {stage: clock.seconds[stage] / events * 1e6 for stage in STAGES}
    per_event["other"] = total / events * 1e6 - sum(per_event.values())
    return {
        "dataset": found.label,
        "events_timed": events,
        "batch_size": batch_size,
        **{f"{stage}_us_per_event": round(us, 2) for stage, us in per_event.items()},
        "monitor_parts_us_per_event": {
            part: round(clock.seconds[f"monitor.{part}"] / events * 1e6, 2)
            for part, _, _ in MONITOR_PARTS
        },
        "total_us_per_event": round(total / events * 1e6, 2),
        "driftline_events_per_s": events / total,
        "river_events_per_s": river.events_per_s,
        "ratio_to_river": events / total / river.events_per_s,
    }
