"""``driftline bench prequential``: accuracy and hot-path speed against river, same run.

The stream goes through the service's own pipeline in-process (event store, fold-in,
heartbeats, ADWIN, retraining), batch by batch; retraining jobs run inline so the run
is reproducible. Hot-path throughput excludes the time spent inside retraining jobs,
which the service runs off the ingestion path; ``retrain_s`` reports that time.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from service.app import build_pipeline
from service.baselines import RiverTrack
from service.datasets import MOVIELENS_SMALL, load_ratings
from service.settings import Settings
from service.store.alerts import list_alerts
from service.store.events import NewEvent
from service.store.jobs import count_jobs


def run_prequential(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 500
) -> dict[str, Any]:
    stream = load_ratings(dataset or MOVIELENS_SMALL, limit=limit)
    with tempfile.TemporaryDirectory(prefix="driftline-bench-") as tmp:
        pipeline = build_pipeline(Settings(data_dir=Path(tmp)), background_retrain=False)
        started = time.perf_counter()
        for start in range(0, len(stream), batch_size):
            stop = min(start + batch_size, len(stream))
            batch = [
                NewEvent(
                    stream.user_ids[i],
                    stream.item_ids[i],
                    float(stream.ratings[i]),
                    float(stream.timestamps[i]),
                    f"ev-{i}",
                )
                for i in range(start, stop)
            ]
            pipeline.ingest(batch)
        wall = time.perf_counter() - started
        retrain_s = pipeline.retrainer.training_seconds
        with pipeline.db.connect() as conn:
            alerts = len(list_alerts(conn, limit=100_000))
            retrains = count_jobs(conn, status="succeeded")
        versions = len(pipeline.registry.versions())
        summary = pipeline.tracker.summary()
        pipeline.db.dispose()
    river = RiverTrack()
    for start in range(0, len(stream), batch_size):
        stop = start + batch_size
        river.process(
            stream.user_ids[start:stop], stream.item_ids[start:stop], stream.ratings[start:stop]
        )
    hot = wall - retrain_s
    return {
        "dataset": str(dataset or MOVIELENS_SMALL.name),
        "events": len(stream),
        "batch_size": batch_size,
        "driftline_rmse": summary["driftline"]["rmse"],
        "static_rmse": summary["static"]["rmse"],
        "river_rmse": river.rmse,
        "alerts": alerts,
        "retrains": retrains,
        "model_versions": versions,
        "driftline_events_per_s": len(stream) / hot,
        "driftline_wall_events_per_s": len(stream) / wall,
        "retrain_s": retrain_s,
        "river_events_per_s": river.events_per_s,
    }
