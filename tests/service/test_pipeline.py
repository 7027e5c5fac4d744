"""The stream pipeline as ``service.app.build_pipeline`` assembles it, without HTTP.

Retraining runs inline (``background_retrain=False``) so every test is deterministic.
Every test runs on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` is set, on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrain import EpochRecord
from service.serving.model import ServingModel
from service.settings import Settings
from service.store.alerts import list_heartbeats
from service.store.events import NewEvent
from service.store.jobs import create_job, get_job, list_jobs, update_job
from service.wiring import Driftline, build_driftline
from tests.support.pipelines import pipeline_factory
from tests.support.synthetic import stationary_stream

BATCH = 100


@pytest.fixture(scope="module")
def events() -> list[NewEvent]:
    stream = stationary_stream(n_users=40, n_items=30, n_events=300, seed=1)
    return [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]


def _settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        object_store_url=None,
        bootstrap_events=200,
        heartbeat_events=50,
        factors=8,
        max_epochs=5,
        refresh_events=None,
        retrain_runtime="thread",
        retrain_configurator="static",  # epochs run the settings' batch size and λ
        **overrides,
    )


@pytest.fixture
def guard_enabled() -> bool:
    """The rollout guard is on; tests whose point is that a published version serves
    (after a restart, on another replica) parametrize it off."""
    return True


@pytest.fixture
def make_pipeline(
    tmp_path: Path, database_url: str, guard_enabled: bool
) -> Iterator[Callable[[], Driftline]]:
    """Builds pipelines on one data directory and database (a second call is a restart)."""
    with pipeline_factory(
        lambda **o: _settings(
            tmp_path / "data", database_url, **{"guard_enabled": guard_enabled, **o}
        )
    ) as make:
        yield make


#: A published version serves at once (the guard's shadow is tested on its own).
served_when_published = pytest.mark.parametrize("guard_enabled", [False])


@pytest.fixture
def served(make_pipeline: Callable[[], Driftline], events: list[NewEvent]) -> Driftline:
    """A pipeline that ingested the 300 events in batches of 100."""
    pipeline = make_pipeline()
    for start in range(0, len(events), BATCH):
        pipeline.ingest(events[start : start + BATCH])
    return pipeline


def _artifact(pipeline: Driftline, version: str) -> Path:
    key = pipeline.registry.load(version).row["artifact_key"]
    return pipeline.settings.data_dir.joinpath("objects", *key.split("/"))


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _load_failures(pipeline: Driftline) -> float:
    value = pipeline.metrics.registry.get_sample_value("driftline_model_load_failures_total")
    return 0.0 if value is None else value


def _pairs(events: list[NewEvent]) -> tuple[list[str], list[str]]:
    return [e.user_id for e in events] + ["stranger"], [e.item_id for e in events] + ["i0"]


# -- bootstrap -----------------------------------------------------------------------


def test_an_empty_pipeline_serves_no_version(make_pipeline: Callable[[], Driftline]) -> None:
    pipeline = make_pipeline()
    assert pipeline.learner.current is None
    assert pipeline.learner.serving.version is None
    assert pipeline.learner.labelled_seen == 0
    assert pipeline.registry.versions() == []


def test_no_job_starts_before_the_bootstrap_threshold(
    make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline()
    pipeline.ingest(events[:199])
    assert pipeline.learner.current is None
    with pipeline.db.connect() as conn:
        assert list_jobs(conn) == []


def test_ingesting_past_the_bootstrap_threshold_trains_and_serves_v0001(
    served: Driftline,
) -> None:
    assert served.learner.current is not None
    assert served.learner.current.version == "v0001"
    assert served.learner.serving.version == "v0001"
    assert served.learner.serving.model is served.learner.current.model
    assert served.learner.labelled_seen == 300
    with served.db.connect() as conn:
        (job,) = list_jobs(conn)
    assert job["status"] == "succeeded"
    assert job["trigger"] == "bootstrap"
    assert job["model_version"] == "v0001"
    assert job["window_events"] == 200  # the job started once the second batch was stored
    assert 1 <= len(job["epochs"]) <= 5
    assert job["stop_reason"] in {"converged", "max_epochs"}
    assert all(e["config"]["batch_size"] == served.settings.batch_size for e in job["epochs"])
    (row,) = served.registry.versions()
    assert (row["version"], row["job_id"], row["last_event_id"]) == ("v0001", job["id"], 200)


@pytest.mark.slow
def test_a_job_stops_at_its_budget(
    tmp_path: Path, database_url: str, events: list[NewEvent]
) -> None:
    settings = _settings(tmp_path / "data", database_url).model_copy(
        update={"retrain_budget_usd": 1e-9, "max_epochs": 20}
    )
    pipeline = build_driftline(settings, background_retrain=False)
    try:
        pipeline.ingest(events[:250])  # past the bootstrap threshold
        with pipeline.db.connect() as conn:
            (job,) = list_jobs(conn)
    finally:
        pipeline.retrainer.close()
        pipeline.db.dispose()
    assert job["status"] == "succeeded" and job["stop_reason"] == "budget"
    assert len(job["epochs"]) == 1  # the first epoch's workers already cost more
    assert job["params"]["budget_usd"] == 1e-9 and job["cost_usd"] > 1e-9


def test_a_job_on_the_sim_runtime_trains_for_real_and_bills_simulated_lambda_time(
    tmp_path: Path, database_url: str, events: list[NewEvent]
) -> None:
    settings = _settings(tmp_path / "data", database_url).model_copy(
        update={"retrain_runtime": "sim"}
    )
    pipeline = build_driftline(settings, background_retrain=False)
    try:
        pipeline.ingest(events[:250])
        with pipeline.db.connect() as conn:
            (job,) = list_jobs(conn)
    finally:
        pipeline.retrainer.close()
        pipeline.db.dispose()
    assert job["status"] == "succeeded" and job["runtime"] == "sim"
    losses = [e["loss"] for e in job["epochs"]]
    assert losses[-1] < losses[0]  # the workers' updates were real
    requests = [i["request_id"] for i in job["invocations"]]
    assert requests and all(r.startswith("sim-") for r in requests)
    assert job["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in job["invocations"]))
    assert (
        pipeline.learner.current is not None
        and pipeline.learner.current.version == job["model_version"]
    )


def test_the_bootstrap_model_serves_personal_recommendations(
    served: Driftline, events: list[NewEvent]
) -> None:
    user = events[0].user_id
    recommendation = served.recommender.recommend(user, 5)
    assert recommendation.source == "model"
    assert recommendation.model_version == "v0001"
    assert len(recommendation.items) == 5
    rated = {e.item_id for e in events if e.user_id == user}
    assert rated.isdisjoint(item for item, _ in recommendation.items)


def test_heartbeats_are_stored_with_the_version_that_served_them(served: Driftline) -> None:
    with served.db.connect() as conn:
        saved = list_heartbeats(conn)
    beats = served.reads.heartbeats()
    assert beats[: len(saved)] == saved  # the newest wait for the next batch's commit
    served.monitor.flush()
    with served.db.connect() as conn:
        beats = list_heartbeats(conn)
    assert [b["events_seen"] for b in beats] == [50, 100, 150, 200, 250, 300]
    assert all(b["events"] == 50 for b in beats)
    assert [b["model_version"] for b in beats] == [None] * 4 + ["v0001"] * 2
    assert all(np.isfinite(b["rmse"]) and np.isfinite(b["static_rmse"]) for b in beats)


# -- swapping versions ---------------------------------------------------------------


def test_swap_to_a_corrupted_version_keeps_the_previous_one_serving(
    served: Driftline, events: list[NewEvent]
) -> None:
    assert served.learner.current is not None
    users, items = _pairs(events)
    before = served.learner.serving.predict(users, items)
    bad = served.registry.publish(
        served.learner.current.model.copy(), last_event_id=300, job_id=None, rmse=None
    )
    _corrupt(_artifact(served, bad.version))

    assert served.swapper.swap_to(bad.version) is False
    assert served.learner.current.version == "v0001"
    assert served.learner.serving.version == "v0001"
    np.testing.assert_array_equal(served.learner.serving.predict(users, items), before)
    assert _load_failures(served) == 1.0


def test_swap_to_a_missing_artifact_keeps_the_previous_one_serving(served: Driftline) -> None:
    assert served.learner.current is not None
    bad = served.registry.publish(
        served.learner.current.model.copy(), last_event_id=300, job_id=None, rmse=None
    )
    _artifact(served, bad.version).unlink()
    assert served.swapper.swap_to(bad.version) is False
    assert served.learner.serving.version == "v0001"
    assert _load_failures(served) == 1.0


def test_swap_to_a_good_version_serves_it(served: Driftline) -> None:
    assert served.learner.current is not None
    good = served.registry.publish(
        served.learner.current.model.copy(), last_event_id=300, job_id=None, rmse=None
    )
    assert served.swapper.swap_to(good.version) is True
    assert served.learner.current.version == good.version == "v0002"
    assert served.learner.serving.version == "v0002"
    assert _load_failures(served) == 0.0


# -- restart -------------------------------------------------------------------------


def test_a_restart_restores_the_version_the_clock_and_the_static_baseline(
    served: Driftline, make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    assert served.learner.current is not None and served.learner.static is not None
    restarted = make_pipeline()
    assert restarted.learner.current is not None
    assert restarted.learner.current.version == "v0001"
    assert restarted.learner.serving.version == "v0001"
    assert restarted.learner.labelled_seen == 300
    assert restarted.learner.static is not None
    users, items = _pairs(events)
    np.testing.assert_array_equal(
        restarted.learner.static.predict(users, items), served.learner.static.predict(users, items)
    )
    # The fold-in is replayed, so serving picks up where it was (item biases only up to
    # the batch boundaries, which differ between ingestion and replay): far closer to
    # the live model than the version alone is.
    live = served.learner.serving.predict(users, items)
    replayed = np.abs(restarted.learner.serving.predict(users, items) - live)
    fresh = np.abs(ServingModel(served.learner.current.model, "v0001").predict(users, items) - live)
    assert replayed.max() < 0.2 and replayed.mean() < fresh.mean() / 5


@served_when_published
def test_after_a_restart_the_static_baseline_stays_the_first_version(
    served: Driftline, make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    assert served.learner.static is not None
    newer = served.learner.static.copy()
    newer.global_mean += 0.5
    served.registry.publish(newer, last_event_id=300, job_id=None, rmse=None)
    restarted = make_pipeline()
    assert restarted.learner.current is not None and restarted.learner.current.version == "v0002"
    assert restarted.learner.static is not None
    users, items = _pairs(events)
    np.testing.assert_array_equal(
        restarted.learner.static.predict(users, items), served.learner.static.predict(users, items)
    )


def test_a_restart_skips_a_corrupted_newest_version(
    served: Driftline, make_pipeline: Callable[[], Driftline]
) -> None:
    assert served.learner.current is not None
    bad = served.registry.publish(
        served.learner.current.model.copy(), last_event_id=300, job_id=None, rmse=None
    )
    _corrupt(_artifact(served, bad.version))
    restarted = make_pipeline()
    assert restarted.learner.current is not None
    assert restarted.learner.current.version == "v0001"


def test_a_restart_fails_jobs_that_cannot_resume_saying_why(
    served: Driftline, make_pipeline: Callable[[], Driftline]
) -> None:
    with served.db.begin() as conn:
        inprocess = create_job(
            conn, policy="adwin", trigger="drift", runtime="inprocess", params={}
        )
        update_job(conn, inprocess, status="running", last_event_id=300)
        unstarted = create_job(conn, policy="adwin", trigger="drift", runtime="local", params={})
        unsaved = create_job(conn, policy="adwin", trigger="drift", runtime="local", params={})
        update_job(conn, unsaved, status="running", last_event_id=300)
    restarted = make_pipeline()
    with restarted.db.connect() as conn:
        jobs = {j: get_job(conn, j) for j in (inprocess, unstarted, unsaved)}
    errors = {j: job["error"] for j, job in jobs.items() if job and job["status"] == "failed"}
    assert errors == {
        inprocess: "interrupted by a restart (in-process training keeps no checkpoint)",
        unstarted: "interrupted by a restart before it started",
        unsaved: "interrupted by a restart before its first checkpoint",
    }
    assert restarted.retrainer.active_job_id is None


class _Crash(BaseException):
    """The process dying: nothing in the service catches it."""


@pytest.mark.slow
@served_when_published
def test_a_restart_resumes_a_distributed_job_from_its_checkpoint(
    served: Driftline, make_pipeline: Callable[[], Driftline]
) -> None:
    assert served.learner.current is not None  # the bootstrap job ran
    recorder = served.retrainer._recorder
    record_epoch = recorder.epoch

    def crash_after_checkpointing_epoch_2(job_id: int, record: EpochRecord) -> None:
        if record.epoch == 2:  # checkpointed, not yet in the job record
            raise _Crash
        record_epoch(job_id, record)

    recorder.epoch = crash_after_checkpointing_epoch_2  # type: ignore[method-assign]
    with pytest.raises(_Crash):
        served.retrain_now()
    with served.db.connect() as conn:
        [crashed] = [j for j in list_jobs(conn) if j["status"] == "running"]
    assert [e["epoch"] for e in crashed["epochs"]] == [0, 1]

    restarted = make_pipeline()
    with restarted.db.connect() as conn:
        job = get_job(conn, crashed["id"])
    assert job is not None and job["status"] == "succeeded", job
    epochs = [e["epoch"] for e in job["epochs"]]
    assert epochs == list(range(len(epochs))) and len(epochs) > 3  # epoch 2 recovered
    assert (
        restarted.learner.current is not None
        and restarted.learner.current.version == job["model_version"]
    )
    before = [i for i in job["invocations"] if i["epoch"] is not None and i["epoch"] <= 2]
    assert len(before) >= 3 * 3  # the crashed process's invocations kept their record
    assert job["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in job["invocations"]))


def test_a_restart_before_any_version_replays_the_events_into_serving(
    make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    first = make_pipeline()
    first.ingest(events[:150])
    assert first.learner.current is None
    restarted = make_pipeline()
    assert restarted.learner.current is None
    assert restarted.learner.labelled_seen == 150
    assert restarted.learner.serving.global_mean == pytest.approx(
        float(np.mean([e.rating for e in events[:150]]))
    )


def test_a_restart_counts_labelled_events_past_the_last_heartbeat(
    make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    first = make_pipeline()
    first.ingest(events[:170])
    assert first.learner.labelled_seen == 170
    restarted = make_pipeline()
    assert restarted.learner.labelled_seen == 170


@served_when_published
def test_a_second_process_follows_versions_published_by_another(
    served: Driftline, make_pipeline: Callable[[], Driftline], events: list[NewEvent]
) -> None:
    # Another replica: it shares the database and object store, and follows the leader.
    follower = make_pipeline(replica_id="second")
    assert follower.learner.serving.version == "v0001"
    assert served.leadership.is_leader and not follower.leadership.is_leader
    assert follower.swapper.follow_registry() is False  # nothing newer yet
    served.retrain_now()
    assert served.learner.serving.version == "v0002"
    assert follower.swapper.follow_registry() is True
    assert follower.learner.serving.version == "v0002"
    assert follower.swapper.follow_registry() is False


@served_when_published
def test_a_crash_between_publishing_and_recording_publishes_one_version(
    served: Driftline, make_pipeline: Callable[[], Driftline]
) -> None:
    """kill -9 after the registry row, before the job says succeeded: the restarted
    service records the job succeeded with that version instead of publishing again."""
    recorder = served.retrainer._recorder

    def crash(*args: object, **kwargs: object) -> None:
        raise _Crash

    recorder.succeeded = crash  # type: ignore[method-assign]
    with pytest.raises(_Crash):
        served.retrain_now()
    published = served.registry.versions()
    with served.db.connect() as conn:
        [crashed] = [j for j in list_jobs(conn) if j["status"] == "running"]

    restarted = make_pipeline()
    with restarted.db.connect() as conn:
        job = get_job(conn, crashed["id"])
    assert job is not None and job["status"] == "succeeded"
    assert restarted.registry.versions() == published
    assert [v["job_id"] for v in published].count(crashed["id"]) == 1
    assert job["model_version"] == published[0]["version"]
    assert restarted.learner.serving.version == published[0]["version"]
