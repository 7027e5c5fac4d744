"""A planted drift travels through predictions, heartbeats and the monitor."""

import ast
from pathlib import Path

import numpy as np
import pytest

import drift
from drift import DriftAlert, DriftMonitor, HeartbeatAggregator, PrequentialTracker
from tests.support.synthetic import ItemMeanBaseline, planted_drift_stream, stationary_stream

FIT_EVENTS = 5_000
DRIFT_AT = 10_000
# Small heartbeats: ADWIN's delay is counted in heartbeats, and the stream is short.
EVERY_EVENTS = 50


def monitor_stream(events: list[dict]) -> tuple[list[DriftAlert], PrequentialTracker]:
    """Fit on the first events, then evaluate the rest prequentially and monitor it."""
    model = ItemMeanBaseline().fit(events[:FIT_EVENTS])
    tracker = PrequentialTracker()
    aggregator = HeartbeatAggregator(every_events=EVERY_EVENTS)
    monitor = DriftMonitor()
    alerts = []
    for start in range(FIT_EVENTS, len(events), 1_000):
        batch = events[start : start + 1_000]
        truth = np.array([e["rating"] for e in batch])
        predicted = model.predict(batch)
        tracker.record("static", truth, predicted)
        for beat in aggregator.add((truth - predicted) ** 2):
            alert = monitor.update(beat)
            if alert is not None:
                alerts.append(alert)
    return alerts, tracker


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_drift_raises_an_alert_after_the_drift_and_none_before(seed: int) -> None:
    events = planted_drift_stream(drift_at=DRIFT_AT, seed=seed)
    alerts, tracker = monitor_stream(events)
    assert alerts, "the planted drift went unnoticed"
    seen = [FIT_EVENTS + alert.events_seen for alert in alerts]
    assert min(seen) > DRIFT_AT
    assert min(seen) <= DRIFT_AT + 6_000
    assert alerts[0].after >= 1.3 * alerts[0].before
    assert tracker.count("static") == len(events) - FIT_EVENTS


def test_stationary_stream_raises_no_alert() -> None:
    alerts, _ = monitor_stream(stationary_stream(seed=0))
    assert alerts == []


def imported_roots(path: Path) -> set[str]:
    """Top-level names of the modules a source file imports."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_drift_package_imports_nothing_about_http_sql_or_other_packages() -> None:
    # Checked on our source, not on sys.modules: river itself loads sqlalchemy when it
    # is installed (river.stream.iter_sql), which is no dependency of ours.
    forbidden = {"fastapi", "starlette", "httpx", "requests", "sqlalchemy", "alembic", "sqlite3"}
    forbidden |= {"service", "retrain", "configurator", "functions"}
    sources = sorted(Path(drift.__file__).parent.glob("*.py"))
    assert sources
    for source in sources:
        assert imported_roots(source) & forbidden == set(), source.name


def test_public_names_are_exported() -> None:
    for name in drift.__all__:
        assert hasattr(drift, name)
