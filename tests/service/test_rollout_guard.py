"""The rollout guard in the pipeline: a published version runs in shadow, is promoted or
held by the paired comparison, is watched after promotion and rolled back on its own;
the registry tells every replica what serves.

Versions are published straight into the registry (as a job does) and jobs are off,
so each test decides what the candidate is worth: a copy of the serving model (not
worse), the model with its global mean pushed up (clearly worse), or a fitted model
beside a serving one that is off (clearly better).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from functions.mf import BiasedMF
from service.alerting.webhook import Notice
from service.app import create_app
from service.settings import Settings
from service.store.alerts import list_alerts
from service.store.events import NewEvent
from service.store.jobs import create_job, list_jobs
from service.wiring import Driftline
from tests.support.pipelines import pipeline_factory, replica_factory, small_settings
from tests.support.synthetic import as_new_events, stationary_stream

#: The guard's lengths, small enough for a test stream.
GUARD = {
    "shadow_min_events": 1_000,
    "shadow_early_events": 250,
    "shadow_max_events": 6_000,
    "watch_events": 1_000,
    "retrain_enabled": False,
}
BATCH = 250


@pytest.fixture(scope="module")
def events() -> list[NewEvent]:
    return as_new_events(stationary_stream(n_users=60, n_items=80, n_events=20_000, seed=21))


def _number(name: str) -> int:
    return int(name[1:])


@pytest.fixture(scope="module")
def turning(events: list[NewEvent]) -> list[NewEvent]:
    """The stream's first 1,000 events, then 2,000 of users u0-u29 on items i0-i39,
    then those of users u30-u59 on items i40-i79 (about 5,000): a version ``_scrambled``
    for the second group is about as good as one that is not on the first group's
    events and clearly worse on the second's."""
    rest = events[1_000:]
    first = [e for e in rest if _number(e.user_id) < 30 and _number(e.item_id) < 40]
    second = [e for e in rest if _number(e.user_id) >= 30 and _number(e.item_id) >= 40]
    return events[:1_000] + first[:2_000] + second


@pytest.fixture
def make(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    def settings(**overrides: Any) -> Settings:
        return small_settings(tmp_path / "data", database_url, **{**GUARD, **overrides})

    with pipeline_factory(settings) as factory:
        yield factory


class Notices:
    """Records the notices a pipeline's guard sends."""

    def __init__(self) -> None:
        self.sent: list[Notice] = []

    def notify(self, notice: Notice) -> bool:
        self.sent.append(notice)
        return True

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...


def _fit(events: list[NewEvent], seed: int = 1) -> BiasedMF:
    model = BiasedMF(factors=8, seed=seed)
    model.fit(
        [e.user_id for e in events],
        [e.item_id for e in events],
        [float(e.rating or 0.0) for e in events],
        epochs=5,
        batch_size=64,
    )
    return model


def _shifted(model: BiasedMF, by: float) -> BiasedMF:
    """``model`` with its global mean ``by`` off: the fold-in's user biases absorb it
    within a few ratings of each user."""
    off = model.copy()
    off.global_mean += by
    return off


def _scrambled(model: BiasedMF, *, later_only: bool = False) -> BiasedMF:
    """A copy of ``model`` with large random factors, which the fold-in cannot undo
    quickly: clearly worse than the fitted one. ``later_only``: only those of users
    u30-u59 and items i40-i79 (``turning``'s second group)."""
    off = model.copy()
    rng = np.random.default_rng(0)
    sides = ((off.user_factors, off.user_ids, 30), (off.item_factors, off.item_ids, 40))
    for factors, ids, first_later in sides:
        rows = [
            row for row, name in enumerate(ids) if not later_only or _number(name) >= first_later
        ]
        factors[rows] = rng.normal(0.0, 0.5, (len(rows), factors.shape[1]))
    return off


def _publish(pipeline: Driftline, model: BiasedMF, job_id: int | None = None) -> str:
    """Publish ``model`` as a job does, and look as the registry follower does."""
    version = pipeline.registry.publish(
        model, last_event_id=pipeline.learner.applied, job_id=job_id, rmse=None
    ).version
    pipeline.swapper.follow_registry()
    assert pipeline.guard is not None
    pipeline.guard.follow()
    return version


def _serving_first(pipeline: Driftline, events: list[NewEvent], model: BiasedMF) -> str:
    pipeline.ingest(events[:1_000])
    first = _publish(pipeline, model)
    assert pipeline.learner.serving.version == first  # nothing served: no shadow
    return first


def _feed(pipeline: Driftline, events: list[NewEvent], until: Callable[[], bool]) -> int:
    """Ingest batches from event 1,000 on until ``until()``; the position reached."""
    for start in range(1_000, len(events), BATCH):
        pipeline.ingest(events[start : start + BATCH])
        if until():
            return start + BATCH
    raise AssertionError("the stream ended first")


def _row(pipeline: Driftline, version: str) -> dict[str, Any]:
    row = pipeline.registry.rollout(version)
    assert row is not None
    return row


def _drift_job(pipeline: Driftline) -> int:
    with pipeline.db.begin() as conn:
        return create_job(conn, policy="adwin", trigger="drift", runtime="thread", params={})


def test_a_version_not_worse_serves_only_from_its_promotion_and_is_watched(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make()
    model = _fit(events[:1_000])
    first = _serving_first(pipeline, events, model)
    second = _publish(pipeline, model.copy())
    assert pipeline.learner.serving.version == first
    assert pipeline.registry.target().version == first  # type: ignore[union-attr]
    assert pipeline.learner.shadow is not None and pipeline.learner.shadow.version == second
    assert _row(pipeline, second)["state"] == "shadow"

    _feed(pipeline, events, lambda: pipeline.learner.serving.version == second)
    row = _row(pipeline, second)
    assert row["state"] == "watch" and row["compared_with"] == first
    shadow = row["shadow"]
    assert shadow["decision"] == "promote" and shadow["events_compared"] == 1_000
    # The same model in both states: every prediction and every rank the same.
    assert shadow["rmse_diff"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert shadow["ranked_events"] > 0 and shadow["hit_rate_diff"]["estimate"] == 0.0
    assert "not worse than the serving version" in shadow["reason"]
    change = pipeline.registry.target()
    assert change is not None and (change.version, change.trigger) == (second, "promote")
    assert pipeline.learner.shadow is not None and pipeline.learner.shadow.version == first

    _feed(pipeline, events, lambda: _row(pipeline, second)["state"] == "kept")
    watch = _row(pipeline, second)["watch"]
    assert watch["decision"] == "keep" and watch["compared_with"] == first
    assert watch["events_compared"] == 1_000
    assert pipeline.learner.shadow is None and pipeline.learner.serving.version == second
    assert [i.trigger for i in pipeline.registry.serving_intervals()] == ["publish", "promote"]


def test_a_clean_stop_keeps_the_running_watch_s_figures_for_the_restart(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A running comparison's figures are saved every 1,000 events; ``/models`` shows
    the newest. A stop saves them, so a restart shows what was shown, and the restarted
    comparison's live figures do not replace them until it has compared more."""
    pipeline = make(watch_events=5_000)
    model = _fit(events[:1_000])
    _serving_first(pipeline, events, model)
    second = _publish(pipeline, model.copy())
    at = _feed(pipeline, events, lambda: pipeline.learner.serving.version == second)
    for start in range(at, at + 2 * BATCH, BATCH):
        pipeline.ingest(events[start : start + BATCH])
    shown = pipeline.reads.rollouts()[second]["watch"]
    assert shown["decision"] is None and 0 < shown["events_compared"] < 1_000
    assert _row(pipeline, second)["watch"] is None  # not saved yet
    pipeline.shut_down(grace_s=0.0)
    assert _row(pipeline, second)["watch"]["events_compared"] == shown["events_compared"]

    restarted = make(watch_events=5_000)
    restarted.restore()
    restarted.guard.follow()  # type: ignore[union-attr]
    assert restarted.learner.shadow is not None  # the watch runs afresh
    assert restarted.reads.rollouts()[second]["watch"] == shown


def test_a_worse_version_is_held_with_its_figures_and_the_next_job_builds_on_the_serving_one(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make()
    assert pipeline.guard is not None
    notices = Notices()
    pipeline.guard.notifier = notices
    model = _fit(events[:1_000])
    first = _serving_first(pipeline, events, model)
    held = _publish(pipeline, _scrambled(model))
    _feed(pipeline, events, lambda: _row(pipeline, held)["state"] == "held")
    shadow = _row(pipeline, held)["shadow"]
    assert shadow["decision"] == "hold" and shadow["events_compared"] <= 500
    assert shadow["rmse_diff"]["low"] > 0.005
    assert shadow["reason"].startswith("worse on RMSE than the serving version: RMSE +")
    assert pipeline.learner.serving.version == first and pipeline.learner.shadow is None
    assert pipeline.registry.target().version == first  # type: ignore[union-attr]
    [notice] = notices.sent
    assert (notice.kind, notice.key) == ("version_held", held)
    assert "driftline_version_held_total 1.0" in pipeline.metrics.render().decode()

    job_id = pipeline.retrain_now()
    with pipeline.db.connect() as conn:
        [job] = [j for j in list_jobs(conn) if j["id"] == job_id]
    assert job["base_version"] == first
    # Its version comes to shadow beside the serving one, not beside the held one.
    assert pipeline.learner.shadow is not None
    assert _row(pipeline, job["model_version"])["compared_with"] == first


def test_a_promoted_version_worse_on_the_live_stream_is_rolled_back_by_the_guard(
    make: Callable[..., Driftline], turning: list[NewEvent]
) -> None:
    pipeline = make(ranking_sample=0.0, watch_events=3_000)
    assert pipeline.guard is not None
    notices = Notices()
    pipeline.guard.notifier = notices
    model = _fit(turning[:1_000])
    first = _serving_first(pipeline, turning, model)
    # Not worse on the first group's events, clearly worse on the second's: promoted,
    # then the stream turns against it.
    second = _publish(pipeline, _scrambled(model, later_only=True))
    promoted_at = _feed(pipeline, turning, lambda: pipeline.learner.serving.version == second)
    assert promoted_at < 3_000  # on the first group's events
    assert _row(pipeline, second)["shadow"]["decision"] == "promote"
    _feed(pipeline, turning, lambda: pipeline.learner.serving.version == first)

    [rollback] = pipeline.registry.rollbacks()
    assert (rollback["actor"], rollback["from_version"], rollback["to_version"]) == (
        "guard",
        second,
        first,
    )
    row = _row(pipeline, second)
    assert row["state"] == "rolled_back"
    assert row["watch"]["decision"] == "roll_back" and row["watch"]["rmse_diff"]["low"] > 0.005
    with pipeline.db.connect() as conn:
        [alert] = list_alerts(conn, kind="rollback")
        assert list_alerts(conn, kind="drift") == []
    assert (alert["metric"], alert["model_version"], alert["detector"]) == ("rmse", second, "guard")
    assert alert["after"] > alert["before"]
    assert [n.kind for n in notices.sent] == ["version_rolled_back"]
    metrics = pipeline.metrics.render().decode()
    assert "driftline_version_rolled_back_total 1.0" in metrics
    assert "driftline_model_rollbacks_total 1.0" in metrics
    assert pipeline.learner.shadow is None
    intervals = [(i.version, i.trigger) for i in pipeline.registry.serving_intervals()]
    assert intervals == [(first, "publish"), (second, "promote"), (first, "rollback")]
    job_id = pipeline.retrain_now()
    with pipeline.db.connect() as conn:
        assert {j["id"]: j["base_version"] for j in list_jobs(conn)}[job_id] == first


@pytest.mark.parametrize("drift", [True, False])
def test_a_drift_version_clearly_better_is_promoted_early(
    make: Callable[..., Driftline], events: list[NewEvent], drift: bool
) -> None:
    pipeline = make()
    fitted = _fit(events[:1_000])
    _serving_first(pipeline, events, _scrambled(fitted))  # the serving version is off
    job_id = _drift_job(pipeline) if drift else None
    better = _publish(pipeline, fitted, job_id=job_id)
    _feed(pipeline, events, lambda: pipeline.learner.serving.version == better)
    shadow = _row(pipeline, better)["shadow"]
    assert shadow["drift"] is drift
    if drift:  # at the first look past SHADOW_EARLY_EVENTS
        assert shadow["events_compared"] == 250
    else:  # not before SHADOW_MIN_EVENTS
        assert shadow["events_compared"] >= 1_000
    assert shadow["rmse_diff"]["high"] < 0
    expected = "a drift version clearly better" if drift else "not worse than the serving"
    assert shadow["reason"].startswith(expected)


def test_a_newer_version_supersedes_the_one_in_shadow(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make()
    model = _fit(events[:1_000])
    _serving_first(pipeline, events, model)
    older = _publish(pipeline, model.copy())
    pipeline.ingest(events[1_000:1_250])
    newer = _publish(pipeline, model.copy())
    older_row = _row(pipeline, older)
    assert older_row["state"] == "held"
    assert older_row["shadow"]["reason"] == f"superseded by {newer}"
    assert older_row["shadow"]["events_compared"] == 250
    assert pipeline.learner.shadow is not None and pipeline.learner.shadow.version == newer


def test_observe_only_promotes_at_once_and_only_notes_a_rollback(
    make: Callable[..., Driftline], turning: list[NewEvent]
) -> None:
    pipeline = make(guard_observe_only=True, ranking_sample=0.0, watch_events=2_000)
    model = _fit(turning[:1_000])
    first = _serving_first(pipeline, turning, model)
    second = _publish(pipeline, _scrambled(model))
    assert pipeline.learner.serving.version == second
    assert _row(pipeline, second)["shadow"]["reason"] == "observe only: promoted at once"
    _feed(pipeline, turning, lambda: _row(pipeline, second)["state"] == "kept")
    watch = _row(pipeline, second)["watch"]
    assert watch["decision"] == "keep" and watch["compared_with"] == first
    assert watch["reason"] == "observe only, kept after 2,000 events"
    assert watch["would_roll_back"].startswith("the previous version does clearly better")
    assert pipeline.learner.serving.version == second and pipeline.registry.rollbacks() == []


def test_a_shadow_past_its_time_is_decided_without_events(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make(shadow_max_s=0.01, shadow_timeout_rule="hold")
    model = _fit(events[:1_000])
    _serving_first(pipeline, events, model)
    candidate = _publish(pipeline, model.copy())
    assert pipeline.guard is not None
    time.sleep(0.02)
    pipeline.guard.tick()
    shadow = _row(pipeline, candidate)["shadow"]
    assert _row(pipeline, candidate)["state"] == "held"
    assert shadow["decision"] == "hold" and "undecided in time (hold rule)" in shadow["reason"]


def test_a_scheduled_job_waits_while_a_version_is_in_shadow(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make(retrain_enabled=True, retrain_policy="periodic", periodic_events=100)
    pipeline.ingest(events[:200])  # the bootstrap job, swapped in
    assert pipeline.learner.current is not None
    _publish(pipeline, pipeline.learner.current.model.copy())
    pipeline.ingest(events[200:500])  # 300 events: due, but a version is in shadow
    with pipeline.db.connect() as conn:
        assert sorted(j["trigger"] for j in list_jobs(conn)) == ["bootstrap"]


def test_a_manual_rollback_during_a_shadow_compares_the_candidate_with_what_serves_now(
    make: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make(guard_enabled=True)
    model = _fit(events[:1_000])
    pipeline.ingest(events[:1_000])
    first = _publish(pipeline, model)
    pipeline.registry.guarded = False  # a second version served at once, as with no guard
    second = _publish(pipeline, model.copy())
    pipeline.registry.guarded = True
    third = _publish(pipeline, model.copy())
    assert pipeline.learner.shadow is not None and pipeline.learner.shadow.version == third
    assert pipeline.learner.serving.version == second
    pipeline.ingest(events[1_000:1_500])
    pipeline.swapper.rollback(first, actor="operator")
    pipeline.ingest(events[1_500:1_750])
    assert pipeline.guard is not None
    status = pipeline.guard.status()
    assert status is not None and status["compared_with"] == first
    assert status["events_compared"] == 250


def test_replicas_serve_what_the_leader_decides_and_one_starting_in_a_shadow_serves_the_old(
    tmp_path: Path, database_url: str, events: list[NewEvent]
) -> None:
    with replica_factory(tmp_path / "data", database_url, **GUARD) as make_replica:
        leader = make_replica("a")
        follower = make_replica("b")
        assert leader.leadership.is_leader and not follower.leadership.is_leader
        model = _fit(events[:1_000])
        first = _serving_first(leader, events, model)
        follower.tail.look()
        follower.swapper.follow_registry()
        assert follower.learner.serving.version == first

        second = _publish(leader, model.copy())
        assert follower.guard is not None
        follower.guard.follow()  # a follower runs no shadow: the leader decides
        assert follower.learner.shadow is None and not follower.swapper.follow_registry()
        joined = make_replica("c")  # starts during the shadow
        assert joined.learner.serving.version == first

        _feed(leader, events, lambda: leader.learner.serving.version == second)
        for replica in (follower, joined):
            replica.tail.look()
            assert replica.swapper.follow_registry() is True
            assert replica.learner.serving.version == second


def test_a_new_leader_runs_the_shadow_the_registry_holds(
    tmp_path: Path, database_url: str, events: list[NewEvent]
) -> None:
    from service.store.leases import release_lease

    with replica_factory(tmp_path / "data", database_url, **GUARD) as make_replica:
        leader = make_replica("a")
        follower = make_replica("b")
        model = _fit(events[:1_000])
        _serving_first(leader, events, model)
        candidate = _publish(leader, model.copy())
        follower.tail.look()
        follower.swapper.follow_registry()
        with leader.db.begin() as conn:
            release_lease(conn, leader.leadership.claimant)
        assert follower.leadership.claim() and not leader.leadership.claim()
        assert leader.learner.shadow is None  # stood by
        assert follower.guard is not None
        follower.guard.follow()
        assert follower.learner.shadow is not None
        assert follower.learner.shadow.version == candidate


def test_models_and_the_dashboard_show_the_version_in_shadow(
    settings: Settings, events: list[NewEvent]
) -> None:
    settings = settings.model_copy(update={**GUARD, "shadow_min_events": 5_000})
    model = _fit(events[:1_000])
    body = [
        {"user_id": e.user_id, "item_id": e.item_id, "rating": e.rating, "event_id": e.event_id}
        for e in events[:2_000]
    ]
    with TestClient(create_app(settings)) as client:
        pipeline: Driftline = client.app.state.driftline  # type: ignore[attr-defined]
        assert client.post("/ingest", json={"events": body[:1_000]}).status_code == 200
        first = _publish(pipeline, model)
        candidate = _publish(pipeline, model.copy())
        for start in range(1_000, 2_000, BATCH):
            client.post("/ingest", json={"events": body[start : start + BATCH]})
        models = client.get("/models").json()
        assert models["current"] == first
        guard = {v["version"]: v["guard"] for v in models["versions"]}
        assert guard[first] is None
        shown = guard[candidate]
        assert shown["state"] == "shadow" and shown["compared_with"] == first
        assert shown["events_compared"] == 1_000 and shown["decision"] is None
        assert set(shown["rmse_diff"]) == {"estimate", "low", "high"}
        assert shown["shadow"]["role"] == "candidate"

        page = client.get("/dashboard/versions").text
        assert f'<tr data-version="{candidate}" class="shadow">' in page
        assert 'data-state="shadow"><b>in shadow</b>' in page
        assert "shadow: 1,000 events against " + first in page
        overview = client.get("/dashboard").text
        assert f'<b id="rollout-version">{candidate}</b>' in overview
        kinds = [e.kind for e in pipeline.feed.since(0)]
        assert "rollout" in kinds


def test_the_rollback_alert_is_listed_with_its_kind(
    make: Callable[..., Driftline], turning: list[NewEvent]
) -> None:
    from service.api.schemas import AlertPublic

    pipeline = make(ranking_sample=0.0, watch_events=3_000)
    model = _fit(turning[:1_000])
    _serving_first(pipeline, turning, model)
    second = _publish(pipeline, _scrambled(model, later_only=True))
    _feed(pipeline, turning, lambda: pipeline.learner.serving.version == second)
    _feed(pipeline, turning, lambda: pipeline.learner.serving.version != second)
    with pipeline.db.connect() as conn:
        [row] = list_alerts(conn)
    assert AlertPublic(**row).kind == "rollback"


def test_alerts_stored_before_the_guard_are_drift_alerts(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from service.store.database import MIGRATIONS, make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0014")
        conn.execute(
            text(
                "INSERT INTO drift_alerts (detected_at, metric, before, after, events_seen) "
                "VALUES (0, 'rmse', 0.8, 1.0, 100)"
            )
        )
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kind FROM drift_alerts")).scalar_one() == "drift"
        assert conn.execute(text("SELECT count(*) FROM model_rollouts")).scalar_one() == 0
    engine.dispose()


def test_held_and_rolled_back_versions_are_notices_with_their_runbook_anchors() -> None:
    from service.alerting import version_held_notice, version_rolled_back_notice
    from service.alerting.webhook import slack_message

    held = slack_message(
        version_held_notice("v0003", "v0002", "worse than the serving version"), "https://r/b"
    )
    assert held["text"] == (
        "Driftline: Model version held: Model v0003 was held in shadow and does not serve: "
        "worse than the serving version."
    )
    assert (
        held["blocks"][-1]["elements"][0]["text"]
        == "<https://r/b#version_held|Runbook: what to do>"
    )
    back = version_rolled_back_notice("v0004", "v0003", "the previous version does clearly better")
    assert (back.kind, back.key) == ("version_rolled_back", "v0004")
    assert "rolled back to v0003 by the rollout guard" in slack_message(back, None)["text"]
