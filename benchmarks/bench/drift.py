"""``driftline bench drift``: every detector on planted drifts, and what retraining buys.

For each stream (MovieLens ml-latest-small in timestamp order, and a synthetic stream
without sessions) and each scenario of ``benchmarks.scenarios`` the stream goes twice
through the service's pipeline in-process, jobs inline, so the run is reproducible:

* **Driftline**: the default settings; the default detector's alerts start drift jobs,
  as in the service. Every other detector of ``drift.DETECTORS`` watches the same
  errors beside it (same heartbeats, same swaps) without starting anything, so all are
  measured on one run; their alerts count, the default's also retrain.
* **fold-in only**: ``RETRAIN_POLICY=never``; the bootstrap version and the online
  fold-in follow the stream alone.

river's ``BiasedMF`` learns each batch after Driftline; the never-retrained model is the
pipeline's static track. RMSE and hit-rate@10 are over the events from the onset on.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.baselines import RiverTrack
from benchmarks.bench.prequential import _batch
from benchmarks.datasets import MOVIELENS_SMALL, RatingStream, load_ratings
from benchmarks.scenarios import SCENARIOS, PlantedDrift, plant, synthetic_stream
from drift import DETECTORS, DriftAlert, DriftDetector, Heartbeat, make_detector
from drift.detectors import DEFAULT_DETECTOR
from service.settings import Settings
from service.store.alerts import list_alerts, list_heartbeats
from service.wiring import Driftline, build_driftline

#: An alert this many events after the onset still counts as detecting it (the
#: gradual scenario ramps over 20,000 events); a later one is a miss.
DETECTION_WINDOW = 20_000


class ShadowedDetector(DriftDetector):
    """The pipeline's detector, with others watching the same heartbeats silently.

    Only the primary's alerts reach the pipeline (and so start jobs); every detector's
    alerts are kept, by name, for the benchmark.
    """

    def __init__(self, primary: DriftDetector, shadows: dict[str, DriftDetector]) -> None:
        super().__init__()
        self.primary = primary
        self.shadows = shadows
        self.alerts: dict[str, list[DriftAlert]] = {name: [] for name in shadows}

    def update(self, x: Heartbeat) -> DriftAlert | None:
        for name, shadow in self.shadows.items():
            alert = shadow.update(x)
            if alert is not None:
                self.alerts[name].append(alert)
        alert = self.primary.update(x)
        self._drift_detected = alert is not None
        return alert

    def on_swap(self, continues_regime: bool = False) -> None:
        self.primary.on_swap(continues_regime)
        for shadow in self.shadows.values():
            shadow.on_swap(continues_regime)

    def reset(self) -> None:
        self.primary.reset()
        for shadow in self.shadows.values():
            shadow.reset()


def _settings(tmp: str, **overrides: Any) -> Settings:
    return Settings(data_dir=Path(tmp), retrain_runtime="inprocess", **overrides)


def _detectors(settings: Settings) -> dict[str, DriftDetector]:
    return {
        name: make_detector(
            name,
            delta=settings.adwin_delta,
            min_relative_drop=settings.min_relative_drop,
            min_heartbeats=settings.min_heartbeats,
            rating_range=(settings.rating_min, settings.rating_max),
        )
        for name in sorted(DETECTORS)
    }


def _replay(
    pipeline: Driftline, stream: RatingStream, size: int, river: RiverTrack | None, since: int = 0
) -> tuple[np.ndarray, float | None]:
    """Replay ``stream``; river's predictions and its hit-rate@10 from ``since`` on."""
    predictions = []
    at_onset = (0.0, 0)
    for start in range(0, len(stream), size):
        stop = min(start + size, len(stream))
        pipeline.ingest(_batch(stream, start, stop))
        if river is None:
            continue
        if start <= since < stop or (start == 0 and since == 0):
            at_onset = _river_hits(river)
        predictions.append(
            river.process(
                stream.user_ids[start:stop],
                stream.item_ids[start:stop],
                stream.ratings[start:stop],
                stream.timestamps[start:stop],
            )
        )
    if river is None:
        return np.empty(0), None
    hits, count = _river_hits(river)
    ranked = count - at_onset[1]
    rate = (hits - at_onset[0]) / ranked if ranked else None
    return np.concatenate(predictions), rate


def _river_hits(river: RiverTrack) -> tuple[float, int]:
    """Hits and ranked events of river so far."""
    tracker = river.ranker.tracker
    count = tracker.count("river")
    return (tracker.hit_rate("river") or 0.0) * count, count


def _segment_figures(pipeline: Driftline, since: int) -> dict[str, float | None]:
    """RMSE (and hit-rate where heartbeats carry it) of the heartbeats after ``since``."""
    with pipeline.db.connect() as conn:
        beats = [b for b in list_heartbeats(conn) if b["events_seen"] > since]
    if not beats:
        return {"rmse": None, "static_rmse": None, "hit_rate": None, "static_hit_rate": None}
    events = np.array([b["events"] for b in beats], dtype=np.float64)

    def pooled_rmse(key: str) -> float:
        values = np.array([b[key] for b in beats], dtype=np.float64)
        return float(np.sqrt((values**2 * events).sum() / events.sum()))

    def pooled_rate(key: str) -> float | None:
        rows = [b for b in beats if b.get(key) is not None and b.get("ranked_events")]
        if not rows:
            return None
        weights = np.array([b["ranked_events"] for b in rows], dtype=np.float64)
        rates = np.array([b[key] for b in rows], dtype=np.float64)
        return float((rates * weights).sum() / weights.sum())

    return {
        "rmse": pooled_rmse("rmse"),
        "static_rmse": pooled_rmse("static_rmse"),
        "hit_rate": pooled_rate("hit_rate"),
        "static_hit_rate": pooled_rate("static_hit_rate"),
    }


def _detector_figures(alerts: list[DriftAlert], onset: int | None, events: int) -> dict:
    """Delay, false alarms per 100,000 events before the onset (all of the control)."""
    clean = events if onset is None else onset
    false = [a for a in alerts if onset is None or a.events_seen < onset]
    hits = [
        a.events_seen - onset
        for a in alerts
        if onset is not None and onset <= a.events_seen <= onset + DETECTION_WINDOW
    ]
    return {
        "alerts": len(alerts),
        "false_alarms": len(false),
        "false_alarms_per_100k": 100_000 * len(false) / max(clean, 1),
        "detected": bool(hits) if onset is not None else None,
        "delay_events": hits[0] if hits else None,
    }


def _run_scenario(planted: PlantedDrift, batch_size: int) -> dict[str, Any]:
    stream, onset = planted.stream, planted.onset
    since = onset if onset is not None else 0
    with tempfile.TemporaryDirectory(prefix="driftline-drift-") as tmp:
        settings = _settings(tmp)
        pipeline = build_driftline(settings, background_retrain=False)
        shadows = {
            name: d for name, d in _detectors(settings).items() if name != settings.drift_detector
        }
        watched = ShadowedDetector(pipeline.monitor.detector, shadows)
        pipeline.monitor.detector = watched
        river = RiverTrack(ranking=pipeline.learner.ranking.sampler)
        river_predictions, river_hit_rate = _replay(pipeline, stream, batch_size, river, since)
        driftline = _segment_figures(pipeline, since)
        primary_alerts = _alerts_of(pipeline)
        pipeline.retrainer.close()
        pipeline.db.dispose()
    with tempfile.TemporaryDirectory(prefix="driftline-foldin-") as tmp:
        foldin_pipeline = build_driftline(
            _settings(tmp, retrain_policy="never"), background_retrain=False
        )
        _replay(foldin_pipeline, stream, batch_size, None)
        foldin = _segment_figures(foldin_pipeline, since)
        foldin_pipeline.retrainer.close()
        foldin_pipeline.db.dispose()
    detectors = {
        name: _detector_figures(a, onset, len(stream)) for name, a in watched.alerts.items()
    }
    detectors[settings.drift_detector] = _detector_figures(primary_alerts, onset, len(stream))
    river_errors = (stream.ratings[since:] - river_predictions[since:]) ** 2
    return {
        "onset": onset,
        "events": len(stream),
        "detectors": detectors,
        "driftline_rmse": driftline["rmse"],
        "foldin_only_rmse": foldin["rmse"],
        "static_rmse": driftline["static_rmse"],
        "river_rmse": float(np.sqrt(river_errors.mean())) if river_errors.size else None,
        "driftline_hit_rate": driftline["hit_rate"],
        "foldin_only_hit_rate": foldin["hit_rate"],
        "static_hit_rate": driftline["static_hit_rate"],
        "river_hit_rate": river_hit_rate,
    }


def _alerts_of(pipeline: Driftline) -> list[DriftAlert]:
    with pipeline.db.connect() as conn:
        rows = list_alerts(conn, limit=100_000)
    return [
        DriftAlert(
            metric=row["metric"],
            before=row["before"],
            after=row["after"],
            events_seen=row["events_seen"],
            heartbeat_index=-1,
            change_events=row.get("change_events"),
            detector=row.get("detector") or "",
        )
        for row in sorted(rows, key=lambda r: r["events_seen"])
    ]


def _streams(dataset: Path | None, limit: int | None) -> dict[str, RatingStream]:
    synthetic = synthetic_stream()
    return {
        "movielens": load_ratings(dataset or MOVIELENS_SMALL, limit=limit),
        "synthetic": synthetic.head(limit),
    }


def _summary(results: dict[str, dict[str, dict]]) -> dict[str, Any]:
    """Per detector: planted drifts detected, median delay on the sudden scenarios,
    false alarms per 100,000 control events (every stream pooled)."""
    summary: dict[str, Any] = {}
    names = sorted(
        {name for stream in results.values() for s in stream.values() for name in s["detectors"]}
    )
    for name in names:
        planted = [
            s["detectors"][name]
            for stream in results.values()
            for key, s in stream.items()
            if key != "control"
        ]
        sudden = [
            s["detectors"][name]["delay_events"]
            for stream in results.values()
            for key, s in stream.items()
            if key == "sudden" and s["detectors"][name]["delay_events"] is not None
        ]
        controls = [stream["control"] for stream in results.values() if "control" in stream]
        alarms = sum(c["detectors"][name]["false_alarms"] for c in controls)
        control_events = sum(c["events"] for c in controls)
        summary[name] = {
            "detected": sum(bool(p["detected"]) for p in planted),
            "planted": len(planted),
            "median_sudden_delay_events": statistics.median(sudden) if sudden else None,
            "control_false_alarms_per_100k": 100_000 * alarms / max(control_events, 1),
        }
    return summary


def run_drift(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 500
) -> dict[str, Any]:
    """Every scenario on every stream; ``scenarios`` is keyed by scenario then stream."""
    results: dict[str, dict[str, dict]] = {}
    for stream_name, stream in _streams(dataset, limit).items():
        results[stream_name] = {
            name: _run_scenario(plant(name, stream), batch_size) for name in SCENARIOS
        }
    scenarios: dict[str, Any] = {}
    for name in SCENARIOS:
        per_stream = {stream: results[stream][name] for stream in results}
        movielens = per_stream["movielens"]
        scenarios[name] = {
            **{detector: figures for detector, figures in movielens["detectors"].items()},
            **{key: value for key, value in movielens.items() if key != "detectors"},
            "streams": per_stream,
        }
    return {
        "default_detector": DEFAULT_DETECTOR,
        "detection_window_events": DETECTION_WINDOW,
        "scenarios": scenarios,
        "summary": _summary(results),
    }
