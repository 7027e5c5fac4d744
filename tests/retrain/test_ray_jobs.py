"""Distributed retraining jobs on the ray runtime, against a local Ray instance: the same
job as on the other runtimes, selective sync, failures, checkpoints and resume."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.handler import handler
from functions.runtimes import ERROR, TIMEOUT, RayRuntime
from retrain.coordinator import SyncPolicy
from retrain.window import RatingsWindow
from tests.retrain.test_checkpoints import (
    WORKERS,
    InlineRuntime,
    _backend,
    _config,
    _model,
    _run_job,
    _store,
    _window,
    check_a_dropped_coordinator_resumes,
)

ray = pytest.importorskip("ray")


def fails_worker_0_of_epoch_0(event: dict, context: Any) -> dict:
    """The worker handler, except that one shard's first epoch always fails."""
    if event["worker"] == 0 and event["epoch"] == 0:
        raise ValueError("shard 0 is unreadable")
    return handler(event, context)


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One small local instance for the module, whatever RAY_ADDRESS says."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def window() -> RatingsWindow:
    return _window()


@pytest.fixture
def make_runtime() -> Iterator[Callable[..., RayRuntime]]:
    opened: list[RayRuntime] = []

    def make(**kwargs: Any) -> RayRuntime:
        opened.append(RayRuntime(**kwargs))
        return opened[-1]

    yield make
    for runtime in opened:
        runtime.close()


def test_a_bsp_job_on_ray_ends_with_the_model_of_the_same_job_in_process(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., RayRuntime]
) -> None:
    policy = SyncPolicy.bsp()
    reference = _run_job(_backend(InlineRuntime(), _store(tmp_path / "a"), policy), window, 3)
    backend = _backend(make_runtime(), _store(tmp_path / "b"), policy)
    result = _run_job(backend, window, 3)
    assert [e.loss for e in result.epochs] == pytest.approx(
        [e.loss for e in reference.epochs], rel=1e-9
    )
    assert result.epochs[-1].loss < result.epochs[0].loss
    invocations = backend.stats.invocations
    assert len(invocations) == 3 * WORKERS and all(r.ok and r.cost_usd > 0 for r in invocations)
    assert any(r.cold_start for r in invocations)


def test_selective_sync_on_ray_does_not_wait_for_a_straggler_and_folds_it_in_later(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., RayRuntime]
) -> None:
    factors = iter([30.0] + [1.0] * 1000)  # the very first invocation is a straggler
    backend = _backend(
        make_runtime(slowdown=lambda: next(factors)), _store(tmp_path), SyncPolicy.selective(2 / 3)
    )
    backend.prepare(_model(window), window)
    first = backend.run_epoch(_config())
    assert first.details["kappa"] == 2 and first.details["in_flight"] == 1
    (straggler,) = [worker for worker, epoch in backend.in_flight if epoch == 0]
    losses = [first.loss]
    deadline = time.monotonic() + 90
    late: list[Any] = []
    while not late:
        assert time.monotonic() < deadline, "the straggler's update never arrived"
        losses.append(backend.run_epoch(_config()).loss)
        late = [u for u in backend.stats.used if u.computed_on == 0 and u.staleness > 0]
    assert [u.worker for u in late] == [straggler]
    slow = max(backend.stats.invocations, key=lambda r: r.duration_s)
    assert first.duration_s < slow.duration_s  # the epoch did not wait for it
    assert losses[-1] < losses[0]


def test_a_worker_past_its_time_limit_on_ray_is_retried_and_the_job_goes_on(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., RayRuntime]
) -> None:
    factors = iter([10_000.0] + [1.0] * 1000)  # the first worker overruns its 3 s
    runtime = make_runtime(slowdown=lambda: next(factors))
    backend = _backend(runtime, _store(tmp_path), SyncPolicy.bsp(), timeout_s=3.0, max_retries=1)
    backend.prepare(_model(window), window)
    outcome = backend.run_epoch(_config())
    assert [f["status"] for f in backend.stats.failures] == [TIMEOUT]
    assert len(backend.stats.used) == WORKERS  # the retry's update was used
    assert outcome.cost_usd > 0


def test_a_failing_worker_on_ray_is_reported_with_its_error_and_dropped(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., RayRuntime]
) -> None:
    runtime = make_runtime(handler="tests.retrain.test_ray_jobs:fails_worker_0_of_epoch_0")
    backend = _backend(runtime, _store(tmp_path), SyncPolicy.bsp(), max_retries=1)
    result = _run_job(backend, window, 2)
    failures = backend.stats.failures
    assert [(f["worker"], f["epoch"], f["status"]) for f in failures] == [(0, 0, ERROR)] * 2
    assert all("ValueError: shard 0 is unreadable" in f["error"] for f in failures)
    assert len(result.epochs) == 2 and result.epochs[-1].loss < result.epochs[0].loss


def test_a_coordinator_dropped_mid_job_resumes_on_ray_workers(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., RayRuntime]
) -> None:
    check_a_dropped_coordinator_resumes(make_runtime, window, tmp_path)
