"""A retraining job's life as the service sees it: recorded before serving follows its
version, published once, its stragglers billed after it, its objects deleted when it ends,
or pre-empted between epochs with nothing published.

The configurator is pinned to ``static`` (RETRAIN_WORKERS every epoch): the tests count
workers, invocations and objects, which GP-OPT, the default, would choose otherwise.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from configurator import CONFIGURATORS, Configurator, EpochConfig, Observation
from functions.handler import handler as worker
from functions.objectstore import FileObjectStore
from functions.runtimes import ThreadRuntime
from functions.shards import job_prefixes, snapshot_key
from retrain import POLICIES, EpochRecord, TriggerPolicy
from retrain.lifecycle import coordinator_job
from service.app import create_app
from service.settings import Settings
from service.store.events import NewEvent
from service.store.jobs import create_job, get_job, list_jobs, update_job
from service.wiring import Driftline
from tests.support.pipelines import pipeline_factory, small_settings
from tests.support.synthetic import stationary_stream

WAIT_S = 120.0
ENDED = ("succeeded", "failed")


@pytest.fixture(scope="module")
def events() -> list[NewEvent]:
    stream = stationary_stream(n_users=40, n_items=30, n_events=300, seed=3)
    return [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]


@pytest.fixture
def make_pipeline(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    """Pipelines on one data directory and database; a second one is a restart."""
    with pipeline_factory(
        lambda **overrides: small_settings(
            tmp_path / "data",
            database_url,
            # These tests are about a job's workers and objects, not its configurator,
            # and follow a job until its version serves, which the rollout guard's
            # shadow would put off (tests/service/test_rollout_guard.py).
            **{
                "max_epochs": 3,
                "retrain_configurator": "static",
                "guard_enabled": False,
                **overrides,
            },
        )
    ) as make:
        yield make


def _job(pipeline: Driftline, job_id: int) -> dict[str, Any]:
    with pipeline.db.connect() as conn:
        job = get_job(conn, job_id)
    assert job is not None
    return job


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _job_objects(pipeline: Driftline) -> list[str]:
    """Every key in the object store other than model artifacts."""
    store = pipeline.registry.store
    return [key for key in store.list("") if not key.startswith("models/")]


def test_a_job_is_recorded_succeeded_before_serving_swaps_to_it_off_the_job_thread(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline(background=True)
    seen: list[tuple[str, str, str | None]] = []
    swap = pipeline.swapper.swap

    def watched_swap(loaded: Any, trigger: str | None = None) -> None:
        job = _job(pipeline, int(loaded.row["job_id"]))
        seen.append((threading.current_thread().name, job["status"], job["model_version"]))
        swap(loaded, trigger)

    pipeline.swapper.swap = watched_swap  # type: ignore[method-assign]
    pipeline.follower.start(None)  # woken by the retrainer only, never by polling
    pipeline.ingest(events[:200])  # the bootstrap job starts on its own thread
    _until(lambda: pipeline.learner.serving.version == "v0001", "the bootstrap version to serve")
    assert seen == [("registry-follower", "succeeded", "v0001")]


def test_a_store_error_recording_success_leaves_the_job_succeeded_with_its_version(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """The version is published, so serving follows it: the job record says so rather
    than that the job failed."""
    pipeline = make_pipeline()
    pipeline.ingest(events[:300])
    assert pipeline.learner.serving.version == "v0001"
    recorder = pipeline.retrainer._recorder
    succeeded = recorder.succeeded
    calls = []

    def flaky(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs)
        if len(calls) == 1:
            raise OSError("the database went away for a moment")
        succeeded(*args, **kwargs)

    recorder.succeeded = flaky  # type: ignore[method-assign]
    job_id = pipeline.retrain_now()
    job = _job(pipeline, job_id)
    assert job["status"] == "succeeded" and job["model_version"] == "v0002"
    assert job["stop_reason"] == "published; recorded late"
    assert pipeline.learner.serving.version == "v0002"
    assert [v["job_id"] for v in pipeline.registry.versions()].count(job_id) == 1


class _Gate:
    """A handler that holds the first invocation of one worker until released: a
    straggler that outlives its job."""

    def __init__(self, worker_index: int) -> None:
        self.worker_index = worker_index
        self.release = threading.Event()
        self.held = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self._lock:
            hold = event["worker"] == self.worker_index and not self.held.is_set()
            if hold:
                self.held.set()
        if hold:
            self.release.wait(WAIT_S)
        return worker(event, context)


def test_shutting_down_saves_the_heartbeats_once_a_running_job_has_had_its_grace(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A stopping service shares one grace between its consumer's batch and a running
    job. Past it, the heartbeats are written before the runtimes close: closing waits
    for the job's invocations in flight, and a supervisor's stop timeout may run out
    first."""
    pipeline = make_pipeline(background=True, bootstrap_events=10**6, retrain_workers=2)
    pipeline.ingest(events[:300])
    flushed = threading.Event()
    flush = pipeline.monitor.flush

    def watched_flush(*args: Any, **kwargs: Any) -> list[int]:
        ids = flush(*args, **kwargs)
        flushed.set()
        return ids

    pipeline.monitor.flush = watched_flush  # type: ignore[method-assign]
    gate = _Gate(worker_index=1)
    pipeline.retrainer._runtimes["thread"] = ThreadRuntime(handler=gate, concurrency=4)
    stopping = threading.Thread(target=pipeline.shut_down, kwargs={"grace_s": 0.5})
    try:
        job_id = pipeline.retrain_now()
        _until(gate.held.is_set, "the job's worker to be held")
        stopping.start()
        _until(flushed.is_set, "the heartbeats to be written")
        running = _job(pipeline, job_id)["status"] not in ENDED
    finally:
        gate.release.set()
        if stopping.is_alive():
            stopping.join(WAIT_S)
    assert running  # written while the job was still held: the grace ended the wait
    assert not stopping.is_alive()


def test_publishing_does_not_wait_for_stragglers_which_are_billed_when_they_finish(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline(
        background=True,
        bootstrap_events=10**6,  # no automatic job: the test starts one
        retrain_workers=4,
        retrain_sync="selective",
        retrain_sync_ratio=0.5,
    )
    pipeline.ingest(events[:300])
    gate = _Gate(worker_index=3)
    # The runtime the job opens for "thread": its worker 3 hangs until released.
    pipeline.retrainer._runtimes["thread"] = ThreadRuntime(handler=gate, concurrency=16)
    try:
        job_id = pipeline.retrain_now()
        _until(lambda: _job(pipeline, job_id)["status"] in ENDED, "the job to end")
        job = _job(pipeline, job_id)
        straggling = not gate.release.is_set() and gate.held.is_set()
        objects_at_success = _job_objects(pipeline)
    finally:
        gate.release.set()  # never leave the straggler hanging past the test
    assert job["status"] == "succeeded" and job["model_version"] == "v0001"
    assert straggling
    billed_at_success = job["invocations"]
    assert len(billed_at_success) >= 2 * 3  # κ = 2 of λ = 4, three epochs
    held = (3, 0)  # the straggler: worker 3's first invocation, still running
    assert [(i["worker"], i["epoch"]) for i in billed_at_success].count(held) == 0
    assert objects_at_success  # kept while the straggler may still read its snapshot

    pipeline.retrainer.wait(timeout=WAIT_S)
    job = _job(pipeline, job_id)
    assert [(i["worker"], i["epoch"]) for i in job["invocations"]].count(held) == 1
    assert len(job["invocations"]) > len(billed_at_success)
    assert job["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in job["invocations"]))
    assert job["cost_usd"] > sum(i["cost_usd"] for i in billed_at_success)
    assert _job_objects(pipeline) == []  # snapshots, shards, deltas, checkpoint: gone


def test_a_failed_job_leaves_no_objects_behind(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline(bootstrap_events=10**6)
    pipeline.ingest(events[:300])
    recorder = pipeline.retrainer._recorder
    record_epoch = recorder.epoch

    def fail_at_epoch_1(job_id: int, record: EpochRecord) -> None:
        if record.epoch == 1:
            raise RuntimeError("the job record refused epoch 1")
        record_epoch(job_id, record)

    recorder.epoch = fail_at_epoch_1  # type: ignore[method-assign]
    job_id = pipeline.retrain_now()
    pipeline.retrainer.wait(timeout=WAIT_S)
    job = _job(pipeline, job_id)
    assert job["status"] == "failed" and "epoch 1" in job["error"]
    assert pipeline.registry.versions() == []
    assert _job_objects(pipeline) == []


def test_a_restart_deletes_the_objects_of_the_jobs_it_fails(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    first = make_pipeline(bootstrap_events=10**6)
    first.ingest(events[:300])
    with first.db.begin() as conn:
        job_id = create_job(conn, policy="adwin", trigger="drift", runtime="thread", params={})
        update_job(conn, job_id, status="running", last_event_id=300)
    store = first.registry.store
    assert isinstance(store, FileObjectStore)
    name = coordinator_job(job_id)
    store.put(snapshot_key(name, 0), b"left by a process killed before its first checkpoint")
    for prefix in job_prefixes(name)[1:]:
        store.put(f"{prefix}000000/00000.pack", b"left behind")
    assert len(_job_objects(first)) == 3

    restarted = make_pipeline(bootstrap_events=10**6)
    job = _job(restarted, job_id)
    assert job["status"] == "failed" and "before its first checkpoint" in job["error"]
    assert _job_objects(restarted) == []


def test_retention_keeps_the_version_a_job_of_another_process_builds_on(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline(retention_versions=1)
    pipeline.ingest(events[:300])
    assert pipeline.learner.current is not None and pipeline.learner.serving.version == "v0001"
    model = pipeline.learner.current.model
    for last in (301, 302):  # v0002, v0003, published by some other process
        pipeline.registry.publish(model.copy(), last_event_id=last, job_id=None, rmse=None)
    with pipeline.db.begin() as conn:  # that process's running job builds on v0002
        job_id = create_job(conn, policy="adwin", trigger="drift", runtime="thread", params={})
        update_job(conn, job_id, status="running", base_version="v0002", last_event_id=302)
    pipeline.registry.publish(model.copy(), last_event_id=303, job_id=None, rmse=None)
    assert pipeline.swapper.follow_registry() and pipeline.learner.serving.version == "v0004"
    deleted = {v["version"] for v in pipeline.registry.versions() if v["deleted_at"]}
    # Kept: serving (v0004), the static baseline (v0001), the running job's base (v0002).
    assert deleted == {"v0003"}


def test_models_lists_the_versions_retention_deleted(settings: Settings) -> None:
    """Through the HTTP API: manual jobs publish, the follower swaps and prunes, and
    ``/models`` still lists every version, saying which artifacts are gone."""
    settings = settings.model_copy(
        update={"retention_versions": 1, "max_epochs": 2, "guard_enabled": False}
    )
    events = [
        {"event_id": f"e{i}", "user_id": f"u{i % 7}", "item_id": f"i{i % 11}", "rating": 3.0}
        for i in range(150)
    ]
    with TestClient(create_app(settings)) as client:
        client.post("/ingest", json={"events": events})
        for expected in ("v0001", "v0002", "v0003", "v0004"):
            started = client.post("/retrain")
            assert started.status_code == 202, started.text
            job_url = f"/jobs/{started.json()['job_id']}"
            _until(lambda url=job_url: client.get(url).json()["status"] in ENDED, "the job")
            assert client.get(job_url).json()["model_version"] == expected
            _until(lambda v=expected: client.get("/models").json()["current"] == v, expected)
        # The follower prunes just after it swaps, so wait for that too.
        _until(lambda: len(_deleted(client.get("/models").json())) == 2, "retention")
        models = client.get("/models").json()
    deleted = _deleted(models)
    listed = {v["version"] for v in models["versions"]}
    # Kept: the serving version (v0004) and the static baseline (v0001).
    assert listed == {"v0001", "v0002", "v0003", "v0004"} and deleted == {"v0002", "v0003"}


def _deleted(models: dict) -> set[str]:
    return {v["version"] for v in models["versions"] if v["deleted_at"] is not None}


class _Kill(BaseException):
    """kill -9: nothing in the service catches it, nothing after it runs."""


def test_jobs_killed_between_publishing_and_recording_are_settled_at_restart(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """Two jobs in a row die after publishing, before their success is recorded. The
    restart records both succeeded with the version each published (none republished),
    with the bill each one's checkpoint holds, and deletes what they left in the store."""
    first = make_pipeline()
    first.ingest(events[:300])
    assert first.learner.serving.version == "v0001"
    recorder = first.retrainer._recorder
    # Two unsettled jobs at once need records made outside the leader's fencing: in a
    # cluster the process that takes over settles the first before the second starts.
    recorder.fencing_token = None

    def kill(*args: object, **kwargs: object) -> None:
        raise _Kill

    recorder.succeeded = kill  # type: ignore[method-assign]
    killed = []
    for _ in range(2):
        with pytest.raises(_Kill):
            first.retrain_now()
        killed.append(max(j["id"] for j in recorder.active()))
    assert len(_job_objects(first)) > 0  # snapshots, deltas, checkpoints: left behind
    published = first.registry.versions()
    assert [v["version"] for v in published] == ["v0003", "v0002", "v0001"]

    restarted = make_pipeline()
    assert restarted.registry.versions() == published
    for job_id, version in zip(killed, ["v0002", "v0003"], strict=True):
        job = _job(restarted, job_id)
        assert (job["status"], job["model_version"]) == ("succeeded", version)
        assert job["stop_reason"] == "published before restart"
        assert job["invocations"] and job["cost_usd"] == pytest.approx(
            sum(i["cost_usd"] for i in job["invocations"])
        )
    assert restarted.learner.serving.version == "v0003"
    assert _job_objects(restarted) == []


@dataclasses.dataclass(frozen=True)
class _AfterHundred(TriggerPolicy):
    """A first job after 100 labelled events; alerts ignored."""

    bootstrap_events: int = 0
    refresh_events: int | None = None
    name: str = "after-hundred"

    def on_alert(self) -> str | None:
        return None

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        return "hundred" if since_version is None and labelled_seen >= 100 else None


class _Halving(Configurator):
    """Halves the batch size every epoch."""

    def __init__(
        self, default: EpochConfig, context: object = None, history: object = None
    ) -> None:
        self.default = default

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        return dataclasses.replace(self.default, batch_size=self.default.batch_size >> epoch)


def test_the_settings_pick_the_policy_and_configurator_from_their_registries(
    make_pipeline: Callable[..., Driftline],
    events: list[NewEvent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(POLICIES, "after-hundred", _AfterHundred)
    monkeypatch.setitem(CONFIGURATORS, "halving", _Halving)
    pipeline = make_pipeline(
        retrain_policy="after-hundred",
        retrain_configurator="halving",
        batch_size=64,
        max_epochs=3,
        target_loss=None,
    )
    pipeline.ingest(events[:99])
    assert pipeline.learner.current is None
    pipeline.ingest(events[99:150])
    with pipeline.db.connect() as conn:
        [job] = list_jobs(conn)
    assert (job["policy"], job["trigger"], job["status"]) == (
        "after-hundred",
        "hundred",
        "succeeded",
    )
    assert [e["config"]["batch_size"] for e in job["epochs"]] == [64, 32, 16]
    assert job["params"]["configurator"] == "halving"


def test_a_restart_sweeps_objects_of_ended_jobs_but_not_of_jobs_still_running(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A server stopped while a finished job's stragglers ran never deleted that job's
    objects; the next start deletes them, and leaves alone a job another process sharing
    the store has started since, and objects the coordinator did not name."""
    first = make_pipeline()
    first.ingest(events[:300])  # the bootstrap job: succeeded, its objects deleted
    [finished] = [v["job_id"] for v in first.registry.versions()]
    store = first.registry.store
    late = [
        snapshot_key(coordinator_job(finished), 7),
        f"{job_prefixes(coordinator_job(finished))[2]}000003/00001.pack",
        f"{job_prefixes(coordinator_job(424242))[0]}000000.pack",  # no such job
    ]
    foreign = "snapshots/bench-run/000000.pack"
    for key in [*late, foreign]:
        store.put(key, b"left behind")

    restarted = make_pipeline()  # no job to resume: every job ended
    assert _job_objects(restarted) == [foreign]
    with restarted.db.begin() as conn:  # another process starts a job and writes to it
        other = create_job(conn, policy="adwin", trigger="drift", runtime="thread", params={})
    running = snapshot_key(coordinator_job(other), 0)
    store.put(running, b"in use")
    restarted.retrainer._sweep(keep=None)
    assert sorted(_job_objects(restarted)) == sorted([foreign, running])


def _preempt_after_epoch(pipeline: Driftline, epoch: int) -> list[int | None]:
    """Ask the retrainer to pre-empt its job once epoch ``epoch`` is recorded, as a drift
    alert would; the list collects what each ask answered (the job pre-empted, or None)."""
    recorder = pipeline.retrainer._recorder
    record_epoch = recorder.epoch
    asked: list[int | None] = []

    def preempting(job_id: int, record: EpochRecord) -> None:
        record_epoch(job_id, record)
        if record.epoch == epoch:
            asked.append(pipeline.retrainer.preempt("pre-empted by drift alert 7"))

    recorder.epoch = preempting  # type: ignore[method-assign]
    return asked


def test_a_preempted_refresh_stops_after_its_epoch_publishes_nothing_and_leaves_no_objects(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = make_pipeline(
        background=True,
        bootstrap_events=10**6,  # no automatic job: the test starts one
        retrain_configurator="static",  # the job's mechanics, not the configurator's
        max_epochs=30,
    )
    pipeline.ingest(events[:300])
    asked = _preempt_after_epoch(pipeline, 1)  # an alert arrives while the refresh trains
    job_id = pipeline.retrainer.request("refresh")
    pipeline.retrainer.wait(timeout=WAIT_S)
    job = _job(pipeline, job_id)
    assert asked == [job_id]
    assert (job["status"], job["stop_reason"], job["error"]) == (
        "preempted",
        "preempted",
        "pre-empted by drift alert 7",
    )
    assert [e["epoch"] for e in job["epochs"]] == [0, 1]  # the epoch in flight finished
    assert job["model_version"] is None and job["finished_at"] is not None
    assert job["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in job["invocations"]))
    assert pipeline.registry.versions() == []
    assert _job_objects(pipeline) == []
    assert pipeline.retrainer.active_job_id is None
    # The next job starts at once and publishes as usual.
    drift_job = pipeline.retrainer.request("drift")
    pipeline.retrainer.wait(timeout=WAIT_S)
    assert _job(pipeline, drift_job)["status"] == "succeeded"


@pytest.mark.parametrize("trigger", ["bootstrap", "drift", "manual"])
def test_bootstrap_drift_and_manual_jobs_are_not_preempted(
    make_pipeline: Callable[..., Driftline], events: list[NewEvent], trigger: str
) -> None:
    pipeline = make_pipeline(bootstrap_events=10**6, retrain_configurator="static")
    pipeline.ingest(events[:300])
    asked = _preempt_after_epoch(pipeline, 0)
    job_id = pipeline.retrainer.request(trigger)  # runs inline: background=False
    job = _job(pipeline, job_id)
    assert asked == [None]
    assert job["status"] == "succeeded" and job["stop_reason"] != "preempted"
    assert len(job["epochs"]) == 3
