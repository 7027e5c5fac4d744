"""Alerts say where, and a drift job trains on the change: the pipeline, the store and
``GET /drift/alerts/{id}``.

A scripted detector raises one alert at a known heartbeat with a known change point, so
the test knows exactly which events come after the change: the stored segments must
count them (positions and change point on the same clock), put the rise on the users
planted to carry it, and the drift job's window must hold every one of them and a
smaller sample of the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import retrain.runner
from drift.base import DriftDetector
from drift.heartbeat import Heartbeat, HeartbeatAggregator
from drift.monitor import DriftAlert
from drift.segments import SegmentBuffer
from retrain.window import RatingsWindow, changed_users
from service.settings import Settings
from service.store.alerts import add_alert, get_alert, list_alerts
from service.store.events import NewEvent, labelled_events, uniform_labelled
from service.store.jobs import get_job, list_jobs
from service.wiring import Driftline
from tests.support.pipelines import pipeline_factory
from tests.support.synthetic import stationary_stream

CHANGE = 1_200  # labelled events before the change
FIRE_AT = 1_800  # the heartbeat that completes the alert
DRIFTED = {f"u{k}" for k in range(8)}  # of 40 users


class ScriptedDetector(DriftDetector):
    """Raises one alert when a heartbeat reaches ``fire_at``, placing the change at
    ``change`` (both counted as the aggregator counts, like every detector)."""

    def __init__(self, fire_at: int, change: int) -> None:
        super().__init__()
        self.fire_at = fire_at
        self.change = change
        self.fired = False

    def update(self, x: Heartbeat) -> DriftAlert | None:
        if self.fired or x.events_seen < self.fire_at:
            return None
        self.fired = True
        return DriftAlert("rmse", 0.8, 1.2, x.events_seen, x.index, self.change, "scripted")

    def on_swap(self, continues_regime: bool = False) -> None:
        """Keeps its script through swaps."""

    def reset(self) -> None:
        self.fired = False


def _events() -> list[NewEvent]:
    """A stationary stream whose users in ``DRIFTED`` invert their taste after ``CHANGE``."""
    stream = stationary_stream(n_users=40, n_items=60, n_events=FIRE_AT, seed=5)
    return [
        NewEvent(
            e["user_id"],
            e["item_id"],
            6.0 - e["rating"] if k >= CHANGE and e["user_id"] in DRIFTED else e["rating"],
            e["timestamp"],
            e["event_id"],
        )
        for k, e in enumerate(stream)
    ]


def _settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "bootstrap_events": 300,
        "heartbeat_events": 50,
        "refresh_events": None,
        "factors": 8,
        "max_epochs": 5,
        "retrain_runtime": "inprocess",
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def make_pipeline(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    with pipeline_factory(
        lambda **overrides: _settings(tmp_path / "data", database_url, **overrides)
    ) as make:
        yield make


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> list[RatingsWindow]:
    """The windows jobs train on, as the lifecycle hands them to the training loop."""
    seen: list[RatingsWindow] = []
    train = retrain.runner.run_training

    def spy(model: Any, window: RatingsWindow, *args: Any, **kwargs: Any) -> Any:
        seen.append(window)
        return train(model, window, *args, **kwargs)

    monkeypatch.setattr(retrain.runner, "run_training", spy)
    return seen


def _replay(pipeline: Driftline, events: list[NewEvent]) -> None:
    """Ingest ``events``; once the bootstrap version serves, the scripted detector
    watches a fresh aggregator counting from there, as after a restart at that point:
    its counts then differ from the service's by ``_events_offset``."""
    for start in range(0, len(events), 100):
        if pipeline.learner.current is not None and not isinstance(
            pipeline.monitor.detector, ScriptedDetector
        ):
            assert pipeline.monitor.aggregator.pending_events == 0
            pipeline.monitor.aggregator = HeartbeatAggregator(pipeline.settings.heartbeat_events)
            pipeline.monitor.events_offset = start
            pipeline.monitor.detector = ScriptedDetector(FIRE_AT - start, CHANGE - start)
        pipeline.ingest(events[start : start + 100])
    assert (
        isinstance(pipeline.monitor.detector, ScriptedDetector) and pipeline.monitor.detector.fired
    )


def _pairs(events: list[NewEvent]) -> list[tuple[str, str, float]]:
    return sorted((e.user_id, e.item_id, float(e.rating or 0.0)) for e in events)


def test_an_alert_is_stored_with_where_its_rise_comes_from(
    make_pipeline: Callable[..., Driftline],
) -> None:
    pipeline = make_pipeline()
    _replay(pipeline, _events())
    with pipeline.db.connect() as conn:
        (row,) = list_alerts(conn)
    assert row["detector"] == "scripted"
    assert row["events_seen"] == FIRE_AT and row["change_events"] == CHANGE
    segments = row["segments"]
    # The buffer's positions and the change point run on the same clock: exactly the
    # events after the change count as after it.
    assert segments["change_events"] == CHANGE
    assert segments["events_after"] == FIRE_AT - CHANGE
    assert segments["events_before"] == CHANGE
    assert segments["mse_rise"] > 0
    assert segments["users"]["returning"]["share_of_rise"] > 0.9
    assert segments["users"]["new"]["events_after"] == 0
    top = [entry["id"] for entry in segments["top_users"]]
    assert set(top[: len(DRIFTED)]) == DRIFTED
    # Prometheus sees the same split (driftline_drift_segment_share{segment}).
    share = pipeline.metrics.drift_segment_share.labels("returning_users")._value.get()
    assert share == pytest.approx(segments["users"]["returning"]["share_of_rise"])


def test_an_alerts_segments_are_computed_again_on_the_events_after_it(
    make_pipeline: Callable[..., Driftline],
) -> None:
    """An alert raised soon after its change has few events per user behind it: the
    next heartbeat flushes compute its segments again on every event since."""
    pipeline = make_pipeline()
    _replay(pipeline, _events())
    with pipeline.db.connect() as conn:
        (row,) = list_alerts(conn)
    at_alert = row["segments"]["events_after"]
    later = [
        NewEvent(f"u{k % 40}", f"i{(7 * k) % 60}", 3.0, 2_000_000_000 + k, f"later-{k}")
        for k in range(200)
    ]
    for start in range(0, len(later), 50):
        pipeline.ingest(later[start : start + 50])
    with pipeline.db.connect() as conn:
        refreshed = get_alert(conn, row["id"])
    assert refreshed is not None
    assert refreshed["segments"]["events_after"] == at_alert + len(later)
    assert refreshed["segments"]["change_events"] == CHANGE


def test_a_drift_job_trains_on_every_event_since_the_change_and_a_smaller_older_sample(
    make_pipeline: Callable[..., Driftline], windows: list[RatingsWindow]
) -> None:
    pipeline = make_pipeline(drift_window_history_ratio=0.5, drift_window_user_change_ratio=None)
    events = _events()
    _replay(pipeline, events)
    with pipeline.db.connect() as conn:
        (alert,) = list_alerts(conn)
        job = get_job(conn, alert["retrain_job_id"])
        stored = labelled_events(conn)
    assert job is not None and job["trigger"] == "drift"
    change_id = int(stored.ids[CHANGE - 1])
    assert job["params"]["change_after_id"] == change_id
    window = windows[-1]
    recent, older = events[CHANGE:], events[:CHANGE]
    pairs = _pairs_of(window)
    # Every event since the change is in, once.
    assert pairs[-len(recent) :] == _pairs(recent)
    # Before them, a sample of the older events: half as many, each a distinct one.
    sample = pairs[: -len(recent)]
    assert len(sample) == len(recent) // 2 < len(older)
    assert len(window) == job["window_events"] == len(recent) + len(recent) // 2
    remaining = _pairs(older)
    for pair in sample:
        remaining.remove(pair)  # raises if the pair is not an older event (or is repeated)


def test_a_drift_job_learns_the_users_who_changed_from_the_change_on(
    make_pipeline: Callable[..., Driftline], windows: list[RatingsWindow]
) -> None:
    """The inverted users' older events would pull them back to the taste they left;
    those of the users the change left alone stay in the sample."""
    pipeline = make_pipeline(drift_window_history_ratio=2.0, drift_window_user_change_ratio=1.4)
    events = _events()
    _replay(pipeline, events)
    with pipeline.db.connect() as conn:
        (alert,) = list_alerts(conn)
        job = get_job(conn, alert["retrain_job_id"])
    assert job is not None and job["trigger"] == "drift"
    base = pipeline.registry.load(job["base_version"]).model
    recent_part = events[CHANGE:]
    recent = RatingsWindow(
        [e.user_id for e in recent_part],
        [e.item_id for e in recent_part],
        np.array([e.rating for e in recent_part]),
    )
    changed = changed_users(recent, base, 1.4)
    assert changed and changed <= DRIFTED
    older_users = set(windows[-1].user_ids[: -len(recent_part)])
    assert not older_users & changed
    assert older_users - DRIFTED  # the others' history is still sampled


def _pairs_of(window: RatingsWindow) -> list[tuple[str, str, float]]:
    """The window's events in its order, the recent part sorted like ``_pairs``."""
    rows = list(zip(window.user_ids, window.item_ids, window.ratings.tolist(), strict=True))
    recent = FIRE_AT - CHANGE
    return rows[:-recent] + sorted(rows[-recent:])


def test_a_drift_job_has_the_drift_deadline_and_other_jobs_the_default(
    make_pipeline: Callable[..., Driftline],
) -> None:
    pipeline = make_pipeline(latency_cap_seconds=600.0, drift_latency_cap_seconds=45.0)
    _replay(pipeline, _events())
    with pipeline.db.connect() as conn:
        (alert,) = list_alerts(conn)
        jobs = list_jobs(conn)
    caps = {job["trigger"]: job["params"]["latency_cap_s"] for job in jobs}
    assert caps["drift"] == 45.0 and caps["bootstrap"] == 600.0
    assert next(j for j in jobs if j["id"] == alert["retrain_job_id"])["trigger"] == "drift"


@pytest.mark.parametrize(
    ("persists", "history_sample", "kept"),
    [(True, 50_000, True), (False, 50_000, False), (True, 100, False)],
    ids=["persists", "switched-off", "regime-outgrew-the-history-sample"],
)
def test_the_jobs_after_a_drift_job_keep_its_change_point_until_the_regime_outgrows_it(
    make_pipeline: Callable[..., Driftline],
    windows: list[RatingsWindow],
    persists: bool,
    history_sample: int,
    kept: bool,
) -> None:
    """A refresh after the drift job would otherwise mix the new taste with a history
    sample drawn mostly from before the change; past ``history_sample`` events since
    the change the change window would outgrow the default one, so it ends."""
    pipeline = make_pipeline(drift_window_persists=persists, history_sample=history_sample)
    _replay(pipeline, _events())
    with pipeline.db.connect() as conn:
        (alert,) = list_alerts(conn)
        drift_job = get_job(conn, alert["retrain_job_id"])
    assert drift_job is not None
    change_id = drift_job["params"]["change_after_id"]
    assert change_id is not None
    later = pipeline.retrainer.request("manual")
    with pipeline.db.connect() as conn:
        job = get_job(conn, later)
    assert job is not None and job["trigger"] == "manual"
    assert job["params"]["change_after_id"] == (change_id if kept else None)
    if kept:  # every event since the change, whatever the serving version has seen
        assert _pairs_of(windows[-1])[-(FIRE_AT - CHANGE) :] == _pairs(_events()[CHANGE:])


def test_without_a_ratio_a_drift_job_keeps_the_default_window(
    make_pipeline: Callable[..., Driftline], windows: list[RatingsWindow]
) -> None:
    pipeline = make_pipeline(drift_window_history_ratio=None)
    _replay(pipeline, _events())
    with pipeline.db.connect() as conn:
        (alert,) = list_alerts(conn)
        job = get_job(conn, alert["retrain_job_id"])
    assert job is not None and job["params"]["change_after_id"] is None
    # The events since the bootstrap version, and all of the few before it.
    assert len(windows[-1]) == FIRE_AT


def test_the_older_sample_is_uniform_reproducible_and_seeded(
    make_pipeline: Callable[..., Driftline],
) -> None:
    pipeline = make_pipeline(retrain_enabled=False)
    rated = [NewEvent(f"u{k}", f"i{k}", 3.0, None, f"r{k}") for k in range(4_000)]
    implicit = [NewEvent(f"u{k}", "clicked", None, None, f"c{k}") for k in range(1_000)]
    pipeline.ingest(rated[:2_000] + implicit + rated[2_000:])
    with pipeline.db.connect() as conn:
        newest = int(labelled_events(conn).ids[-1])
        first = uniform_labelled(conn, newest, 800, seed=3)
        again = uniform_labelled(conn, newest, 800, seed=3)
        other = uniform_labelled(conn, newest, 800, seed=4)
        capped = uniform_labelled(conn, 1_000, 800, seed=3)
        everything = uniform_labelled(conn, newest, 10_000, seed=3)
    assert len(first) == 800 and len(set(first.ids.tolist())) == 800
    assert first.ids.tolist() == again.ids.tolist()
    assert first.ids.tolist() != other.ids.tolist()
    assert "clicked" not in first.item_ids
    assert (capped.ids <= 1_000).all() and len(capped) == 800
    assert len(everything) == 4_000
    # Spread over the whole history: each quarter of it holds about a quarter.
    quarters = np.histogram(first.ids, bins=4, range=(0, newest))[0]
    assert (quarters > 150).all(), quarters


# -- GET /drift/alerts/{id} ----------------------------------------------------------


def _segments() -> dict[str, Any]:
    buffer = SegmentBuffer()
    users = [f"u{k % 30}" for k in range(900)]
    items = [f"i{k % 45}" for k in range(900)]
    errors = np.where((np.arange(900) >= 600) & (np.arange(900) % 30 < 4), 3.0, 0.5)
    buffer.record(users, items, errors, after=0)
    report = buffer.report(600)
    assert report is not None
    return report


def test_an_alert_is_returned_with_its_segments(client: TestClient) -> None:
    pipeline = client.app.state.driftline  # type: ignore[attr-defined]
    segments = _segments()
    with pipeline.db.begin() as conn:
        alert_id = add_alert(
            conn,
            metric="rmse",
            before=0.8,
            after=1.1,
            events_seen=900,
            model_version=None,
            detector="adwin-event",
            change_events=600,
            segments=segments,
        )
        bare = add_alert(
            conn, metric="rmse", before=0.8, after=1.1, events_seen=950, model_version=None
        )
    answer = client.get(f"/drift/alerts/{alert_id}")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"] == alert_id and body["detector"] == "adwin-event"
    assert body["change_events"] == 600
    assert body["segments"] == segments
    assert {entry["id"] for entry in body["segments"]["top_users"]} >= {"u0", "u1", "u2", "u3"}
    plain = client.get(f"/drift/alerts/{bare}").json()
    assert plain["segments"] is None and plain["change_events"] is None
    with pipeline.db.connect() as conn:
        assert get_alert(conn, bare) is not None


def test_an_unknown_alert_is_a_404_naming_it(client: TestClient) -> None:
    answer = client.get("/drift/alerts/4242")
    assert answer.status_code == 404
    assert "4242" in answer.json()["detail"]


@pytest.mark.parametrize("alert_id", ["abc", "0", "-1", str(2**31), "1.5"])
def test_a_malformed_alert_id_is_a_422(client: TestClient, alert_id: str) -> None:
    assert client.get(f"/drift/alerts/{alert_id}").status_code == 422


def test_the_alert_route_is_documented(client: TestClient) -> None:
    route = client.get("/openapi.json").json()["paths"]["/drift/alerts/{alert_id}"]["get"]
    assert {"200", "404", "422", "503"} <= set(route["responses"])
    schema = route["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/AlertDetailPublic")
