"""Selective-synchronous DSGD on workers of the in-process (thread) runtime."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest

from configurator import EpochConfig, StaticConfigurator
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.runtimes import Runtime
from retrain.convergence import ConvergenceRule
from retrain.coordinator import DistributedBackend
from retrain.job import run_training
from retrain.sync import SyncPolicy
from retrain.window import RatingsWindow
from tests.support.synthetic import stationary_stream

WORKERS = 3


@pytest.fixture(scope="module")
def window() -> RatingsWindow:
    events = stationary_stream(n_users=60, n_items=80, n_events=3_000, seed=4)
    return RatingsWindow(
        [e["user_id"] for e in events],
        [e["item_id"] for e in events],
        np.array([e["rating"] for e in events]),
    )


def _model(window: RatingsWindow) -> BiasedMF:
    model = BiasedMF(factors=4, learning_rate=0.05, regularization=0.05, seed=0)
    model.global_mean = float(window.ratings.mean())
    model.grow(window.user_ids, window.item_ids)
    return model


def _backend(
    tmp_path: Path, runtime: Runtime, policy: SyncPolicy, **kwargs: object
) -> DistributedBackend:
    root = tmp_path / "objects"
    return DistributedBackend(
        runtime, FileObjectStore(root), f"file://{root}", "job-1", policy, **kwargs
    )


def _config() -> EpochConfig:
    return EpochConfig(batch_size=128, learning_rate=0.05, workers=WORKERS, memory_mb=512)


def test_bsp_averages_every_worker_and_the_loss_falls(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    backend = _backend(tmp_path, make_runtime(), SyncPolicy.bsp())
    backend.prepare(_model(window), window)
    losses = [backend.run_epoch(_config()).loss for _ in range(4)]
    assert losses[-1] < losses[0]
    assert len(backend.stats.used) == 4 * WORKERS
    assert {u.staleness for u in backend.stats.used} == {0}
    assert all(r.ok and r.cost_usd > 0 for r in backend.stats.invocations)


def test_selective_sync_does_not_wait_for_a_straggler_and_uses_its_update_later(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    factors = iter([30.0] + [1.0] * 1000)  # the very first invocation is a straggler
    runtime = make_runtime(concurrency=2 * WORKERS, slowdown=lambda: next(factors))
    backend = _backend(tmp_path, runtime, SyncPolicy.selective(2 / 3))
    backend.prepare(_model(window), window)
    first = backend.run_epoch(_config())
    assert first.details["kappa"] == 2 and first.details["in_flight"] == 1
    straggler = next(worker for worker, epoch in backend.in_flight if epoch == 0)
    backend.run_epoch(_config())
    # Every shard, the straggler's included, started again on the new snapshot.
    used = {u.worker for u in backend.stats.used if u.computed_on == 1}
    assert used | {w for w, epoch in backend.in_flight if epoch == 1} == set(range(WORKERS))
    deadline = time.monotonic() + 90
    late = []
    while not late:
        assert time.monotonic() < deadline, "the straggler's update never arrived"
        backend.run_epoch(_config())
        late = [u for u in backend.stats.used if u.computed_on == 0 and u.staleness > 0]
    assert [u.worker for u in late] == [straggler]
    slow = max(backend.stats.invocations, key=lambda r: r.duration_s)
    assert first.duration_s < slow.duration_s  # the epoch did not wait for it


def test_asp_applies_updates_as_they_arrive(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    backend = _backend(tmp_path, make_runtime(), SyncPolicy.asp())
    model = _model(window)
    backend.prepare(model, window)
    losses = [backend.run_epoch(_config()).loss for _ in range(3)]
    assert losses[-1] < losses[0]
    assert len(backend.stats.used) == 3 * WORKERS


def test_a_finished_job_hands_over_its_stragglers_and_deletes_its_objects(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    factors = iter([40.0] + [1.0] * 1000)  # the very first invocation is a straggler
    runtime = make_runtime(concurrency=2 * WORKERS, slowdown=lambda: next(factors))
    backend = _backend(tmp_path, runtime, SyncPolicy.selective(2 / 3))
    backend.prepare(_model(window), window)
    backend.run_epoch(_config())
    pending = backend.pending_invocations()
    assert len(pending) == 1 and not pending[0].done()  # returned without waiting
    billed = len(backend.stats.invocations)
    wait(pending, timeout=60)
    backend.finish_stragglers()
    assert len(backend.stats.invocations) == billed + 1 and not backend.pending_invocations()

    store = backend.store
    assert {key.split("/")[0] for key in store.list()} == {
        "checkpoints",
        "deltas",
        "shards",
        "snapshots",
    }
    store.put("deltas/job-10/000000/00000.pack", b"another job's")
    deleted = backend.cleanup(keep_checkpoint=True)
    assert store.list() == [
        "checkpoints/job-1/latest.json",
        "checkpoints/job-1/window.npz",
        "deltas/job-10/000000/00000.pack",
    ]
    assert backend.cleanup() == 2 and deleted > 2 * WORKERS
    assert store.list() == ["deltas/job-10/000000/00000.pack"]


def test_a_worker_that_times_out_is_retried_and_the_job_goes_on(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    factors = iter([10_000.0] + [1.0] * 1000)  # the first worker overruns its 3 s
    runtime = make_runtime(slowdown=lambda: next(factors))
    backend = _backend(tmp_path, runtime, SyncPolicy.bsp(), timeout_s=3.0, max_retries=1)
    backend.prepare(_model(window), window)
    outcome = backend.run_epoch(_config())
    assert [f["status"] for f in backend.stats.failures] == ["timeout"]
    assert len(backend.stats.used) == WORKERS  # the retry's update was used
    assert outcome.cost_usd > 0


def test_a_job_runs_end_to_end_through_the_coordinator(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    backend = _backend(tmp_path, make_runtime(), SyncPolicy.selective(2 / 3))
    result = run_training(
        _model(window),
        window,
        backend,
        StaticConfigurator(_config()),
        ConvergenceRule(max_epochs=4),
    )
    assert len(result.epochs) == 4 and result.cost_usd > 0
    assert result.epochs[-1].loss < result.epochs[0].loss
    assert result.holdout_rmse is not None and result.holdout_rmse < 1.2
    assert result.epochs[0].config["workers"] == WORKERS


def test_asp_retries_a_failed_worker_once_instead_of_also_relaunching_it(
    window: RatingsWindow, tmp_path: Path, make_runtime: Callable[..., Runtime]
) -> None:
    factors = iter([10_000.0] + [1.0] * 1000)  # the first worker overruns its 3 s
    runtime = make_runtime(slowdown=lambda: next(factors))
    backend = _backend(tmp_path, runtime, SyncPolicy.asp(), timeout_s=3.0, max_retries=1)
    backend.prepare(_model(window), window)
    deadline = time.monotonic() + 60
    while not backend.stats.failures:
        assert time.monotonic() < deadline, "the slow worker never timed out"
        backend.run_epoch(_config())
        in_flight = [worker for worker, _ in backend.in_flight]
        assert len(in_flight) == len(set(in_flight)) == WORKERS  # one invocation per shard
    assert [f["status"] for f in backend.stats.failures] == ["timeout"]
