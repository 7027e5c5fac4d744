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
* **without the guard**: the default settings but ``GUARD_OBSERVE_ONLY``, each version
  serving at publication (as before the rollout guard), its predecessor measured
  beside it (``benchmarks.bench.rollout``); the Driftline run above has the guard on.
* **without refreshes**: the default settings but ``REFRESH_EVENTS=none``, so only drift
  alerts start jobs and no scheduled swap ever comes. Detection must not depend on
  refreshes, so each mode of ``REFRESH_MODES`` reports its default detector's alerts
  (``refresh_modes``); this one runs with the guard on only, to keep the run's length.

river's ``BiasedMF`` learns each batch after Driftline; the never-retrained model is the
pipeline's static track. RMSE and hit-rate@10 are over the events from the onset on.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.baselines import RiverTrack
from benchmarks.bench.prequential import pipeline_events
from benchmarks.bench.rollout import UNGUARDED, guard_figures, summarise_over_target
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings
from benchmarks.scenarios import SCENARIOS, PlantedDrift, plant, synthetic_stream
from drift import DETECTORS, DriftAlert, DriftDetector, Heartbeat, make_detector
from drift.detectors import DEFAULT_DETECTOR
from service.settings import Settings
from service.store.alerts import list_alerts, list_heartbeats
from service.wiring import Driftline, build_driftline

#: An alert this many events after the onset still counts as detecting it (the
#: gradual scenario ramps over 20,000 events); a later one is a miss.
DETECTION_WINDOW = 20_000

#: Settings of each refresh mode the default detector is measured in: scheduled
#: refreshes (``REFRESH_EVENTS``'s default) and none (jobs on drift alerts only).
REFRESH_MODES: dict[str, dict[str, Any]] = {"default": {}, "none": {"refresh_events": None}}


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
        pipeline.ingest(pipeline_events(stream, start, stop))
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
        guarded = guard_figures(pipeline)
        pipeline.retrainer.close()
        pipeline.db.dispose()
    with _replayed(stream, batch_size, **UNGUARDED) as unguarded_pipeline:
        unguarded = _segment_figures(unguarded_pipeline, since)
        unguarded_figures = guard_figures(unguarded_pipeline)
    with _replayed(stream, batch_size, **REFRESH_MODES["none"]) as no_refresh_pipeline:
        without_refresh = _segment_figures(no_refresh_pipeline, since)
        without_refresh_alerts = _alerts_of(no_refresh_pipeline)
    with _replayed(stream, batch_size, retrain_policy="never") as foldin_pipeline:
        foldin = _segment_figures(foldin_pipeline, since)
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
        "unguarded_rmse": unguarded["rmse"],
        "unguarded_hit_rate": unguarded["hit_rate"],
        "guard": {"on": guarded, "off": unguarded_figures},
        "refresh_modes": {
            "default": detectors[settings.drift_detector],
            "none": {
                **_detector_figures(without_refresh_alerts, onset, len(stream)),
                "rmse": without_refresh["rmse"],
                "hit_rate": without_refresh["hit_rate"],
            },
        },
    }


@contextlib.contextmanager
def _replayed(stream: RatingStream, batch_size: int, **overrides: Any) -> Iterator[Driftline]:
    """A pipeline with the default settings and ``overrides`` that has learnt ``stream``,
    jobs inline; closed on exit."""
    with tempfile.TemporaryDirectory(prefix="driftline-drift-") as tmp:
        pipeline = build_driftline(_settings(tmp, **overrides), background_retrain=False)
        try:
            _replay(pipeline, stream, batch_size, None)
            yield pipeline
        finally:
            pipeline.retrainer.close()
            pipeline.db.dispose()


def _alerts_of(pipeline: Driftline) -> list[DriftAlert]:
    with pipeline.db.connect() as conn:
        rows = list_alerts(conn, limit=100_000, kind="drift")
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
        "movielens": open_ratings(dataset, limit=limit)[0],
        "synthetic": synthetic.head(limit),
    }


def _summary(results: dict[str, dict[str, dict]]) -> dict[str, Any]:
    """Per detector: planted drifts detected, median delay on the sudden scenarios,
    false alarms per 100,000 control events (every stream pooled)."""
    names = sorted(
        {name for stream in results.values() for s in stream.values() for name in s["detectors"]}
    )
    return {name: _detection(results, lambda s, n=name: s["detectors"][n]) for name in names}


def _refresh_summary(results: dict[str, dict[str, dict]]) -> dict[str, Any]:
    """The default detector's detection in each refresh mode, as ``_summary`` has it."""
    return {
        mode: _detection(results, lambda s, m=mode: s["refresh_modes"][m]) for mode in REFRESH_MODES
    }


def _detection(
    results: dict[str, dict[str, dict]], figures_of: Callable[[dict], dict]
) -> dict[str, Any]:
    """Planted drifts found, median delay on the sudden scenarios and false alarms per
    100,000 control events, of the figures ``figures_of`` picks from each run."""
    runs = [(key, s, figures_of(s)) for stream in results.values() for key, s in stream.items()]
    planted = [figures for key, _, figures in runs if key != "control"]
    sudden = [
        figures["delay_events"]
        for key, _, figures in runs
        if key == "sudden" and figures["delay_events"] is not None
    ]
    controls = [(s, figures) for key, s, figures in runs if key == "control"]
    alarms = sum(figures["false_alarms"] for _, figures in controls)
    control_events = sum(s["events"] for s, _ in controls)
    return {
        "detected": sum(bool(p["detected"]) for p in planted),
        "planted": len(planted),
        "median_sudden_delay_events": statistics.median(sudden) if sudden else None,
        "control_false_alarms_per_100k": 100_000 * alarms / max(control_events, 1),
    }


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
    runs = [scenario for stream in results.values() for scenario in stream.values()]
    return {
        "default_detector": DEFAULT_DETECTOR,
        "detection_window_events": DETECTION_WINDOW,
        "scenarios": scenarios,
        "summary": _summary(results),
        "refresh_modes": _refresh_summary(results),
        "guard": {
            side: summarise_over_target([run["guard"][side] for run in runs])
            for side in ("on", "off")
        },
    }
