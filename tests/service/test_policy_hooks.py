"""The pipeline feeds its trigger policy the clock and finished jobs, and reports it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from retrain.policies import ContinuumPolicy
from service.store.events import NewEvent
from service.store.jobs import list_jobs
from service.wiring import Driftline
from tests.support.synthetic import as_new_events, stationary_stream


@pytest.fixture
def events() -> list[NewEvent]:
    return as_new_events(stationary_stream(n_users=40, n_items=30, n_events=400, seed=5))


def test_continuum_hears_of_the_finished_job_and_reports_its_regret(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = small_pipelines(retrain_policy="continuum", continuum_weight=10**9)
    assert (
        pipeline.trigger.policy_status()["waiting_for"]
        == "first model after 200 more labelled events"
    )
    pipeline.ingest(events[:200])
    policy = pipeline.trigger.policy
    assert isinstance(policy, ContinuumPolicy)
    [(n_events, seconds)] = policy.jobs
    assert n_events == 200 and seconds > 0
    pipeline.ingest(events[200:300])
    status = pipeline.trigger.policy_status()
    assert status["name"] == "continuum"
    assert status["waiting_for"].startswith("regret ") and status["waiting_for"].endswith(
        " of threshold"
    )


def test_continuum_hears_of_each_job_once_however_often_its_version_swaps_in(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A rollback serves an old job's version again; its duration is not a new sample."""
    pipeline = small_pipelines(retrain_policy="continuum", continuum_weight=10**9)
    pipeline.ingest(events[:200])
    policy = pipeline.trigger.policy
    assert isinstance(policy, ContinuumPolicy) and len(policy.jobs) == 1
    assert pipeline.learner.current is not None
    pipeline.swapper.swap(pipeline.learner.current, trigger="rollback")
    assert len(policy.jobs) == 1


def test_cost_aware_starts_a_batch_job_once_its_interval_passed(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    pipeline = small_pipelines(retrain_policy="cost-aware", retrain_interval_s=0.5)
    pipeline.ingest(events[:200])  # the bootstrap job
    pipeline.ingest(events[200:250])  # the interval starts
    assert pipeline.trigger.policy_status()["waiting_for"].startswith("next batch in ")
    time.sleep(0.6)
    pipeline.ingest(events[250:300])
    with pipeline.db.connect() as conn:
        jobs = list_jobs(conn)
    assert sorted((j["policy"], j["trigger"]) for j in jobs) == [
        ("cost-aware", "batch"),
        ("cost-aware", "bootstrap"),
    ]


def test_no_second_bootstrap_while_the_first_version_waits_for_its_swap(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A bootstrap job has published but its version is not swapped in yet (the swap
    follows the job's end): events arriving meanwhile start no second bootstrap."""
    from functions.mf import BiasedMF

    pipeline = small_pipelines(retrain_policy="periodic", periodic_events=1_000)
    model = BiasedMF(factors=8, seed=1)
    model.fit(
        [e.user_id for e in events], [e.item_id for e in events], [e.rating for e in events], 1
    )
    pipeline.registry.publish(model, last_event_id=1, job_id=None, rmse=0.9)
    assert pipeline.learner.current is None
    pipeline.ingest(events[:250])
    with pipeline.db.connect() as conn:
        assert list_jobs(conn) == []


def test_a_scheduled_job_waits_until_the_published_version_serves(
    small_pipelines: Callable[..., Driftline], events: list[NewEvent]
) -> None:
    """A job has published a version that is not serving yet: a periodic job that falls
    due meanwhile is not started on the version being replaced, and the count of events
    starts again from the new version once it serves. (With the rollout guard the
    version runs in shadow first: tests/service/test_rollout_guard.py.)"""
    pipeline = small_pipelines(retrain_policy="periodic", periodic_events=60, guard_enabled=False)
    pipeline.ingest(events[:200])  # the bootstrap job, swapped in
    assert pipeline.learner.current is not None
    replaced = pipeline.learner.current.version
    pipeline.registry.publish(
        pipeline.learner.current.model, last_event_id=200, job_id=None, rmse=0.9
    )
    pipeline.retrainer.published.set()  # as a finishing job announces its version

    def triggers() -> list[str]:
        with pipeline.db.connect() as conn:
            return sorted(job["trigger"] for job in list_jobs(conn))

    pipeline.ingest(events[200:320])  # 120 events: due, but a version is on its way
    assert triggers() == ["bootstrap"]
    assert pipeline.learner.current.version != replaced  # the batch's end swapped it in
    pipeline.ingest(events[320:350])  # 30 since the swap
    assert triggers() == ["bootstrap"]
    pipeline.ingest(events[350:390])  # 70 since the swap
    assert triggers() == ["bootstrap", "periodic"]
