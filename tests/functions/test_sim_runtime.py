"""The sim runtime: Lambda workers in virtual time, timed by a calibrated performance model."""

from __future__ import annotations

import math
import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, as_completed, wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from functions.artifacts import model_to_bytes, sha256_hex
from functions.handler import WorkerTask
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.pricing import lambda_prices
from functions.runtimes import ERROR, OK, RUNTIMES, TIMEOUT, InvocationRecord, open_runtime
from functions.runtimes.sim import (
    PerformanceModel,
    SimRuntime,
    Simulation,
    UncostablePayload,
    Work,
    calibrate,
    fit_performance_model,
    simulate_epochs,
)
from functions.shards import write_shard

MODEL = PerformanceModel(
    compute_s_per_sample=1e-5, compute_s_per_batch=2e-3, overhead_s=0.2, cold_start_s=0.8
)
NOISY = MODEL.replace(jitter_sigma=0.1, straggler_p=0.2, straggler_slowdown=(3.0, 5.0))


def _records(model: PerformanceModel, seed: int, memory_mb: int = 1769) -> list[InvocationRecord]:
    """What a calibration run of the local runtime gives, timed by `model` plus noise."""
    rng = np.random.default_rng(seed)
    records = []
    for samples in (1_000, 5_000, 20_000, 80_000):
        for batch_size in (128, 1024):
            for rep in range(12):
                cold = rep == 0
                slowdown = float(rng.uniform(3, 5)) if rep % 5 == 4 else 1.0
                work = Work.for_shard(samples, batch_size)
                noise = math.exp(0.02 * rng.standard_normal())
                duration = model.duration_s(work, memory_mb, cold, slowdown) * noise
                records.append(
                    InvocationRecord(
                        f"r{len(records)}",
                        cold_start=cold,
                        memory_mb=memory_mb,
                        duration_s=duration,
                        result={"samples": samples, "samples_trained": samples},
                        labels={"batch_size": batch_size, "slowdown": slowdown},
                    )
                )
    records.append(InvocationRecord("failed", status=ERROR, duration_s=99.0))  # ignored
    return records


# -- the model and its calibration ---------------------------------------------------------


def test_calibration_recovers_a_known_model_from_synthetic_records() -> None:
    fit = fit_performance_model(_records(MODEL, seed=1))
    model = fit.model
    assert fit.records == 96
    assert set(fit.columns) == {
        "overhead_s",
        "compute_s_per_sample",
        "compute_s_per_batch",
        "cold_start_s",
    }
    assert model.compute_s_per_sample == pytest.approx(1e-5, rel=0.03)
    assert model.compute_s_per_batch == pytest.approx(2e-3, rel=0.1)
    assert model.overhead_s == pytest.approx(0.2, rel=0.05)
    assert model.cold_start_s == pytest.approx(0.8, rel=0.05)
    assert model.jitter_sigma == pytest.approx(0.02, abs=0.01)
    assert fit.relative_rmse < 0.05 and fit.r_squared > 0.99
    assert calibrate(_records(MODEL, seed=1)) == model


def test_calibration_counts_a_separately_reported_initialisation_as_cold_start() -> None:
    records = _records(MODEL, seed=1)
    for record in records:
        if record.cold_start:  # as the local runtime and Lambda report it: init apart
            record.init_duration_s, record.duration_s = 0.6, record.duration_s - 0.6
    fit = fit_performance_model(records)
    assert fit.model.cold_start_s == pytest.approx(0.8, rel=0.05)
    folded = fit_performance_model(_records(MODEL, seed=1)).model
    for name in ("overhead_s", "compute_s_per_sample", "compute_s_per_batch", "cold_start_s"):
        assert getattr(fit.model, name) == pytest.approx(getattr(folded, name), rel=1e-9)


def test_calibration_of_lambda_records_divides_out_the_cpu_share() -> None:
    # At 512 MB Lambda gives 0.29 vCPU; the fitted compute is per sample at one vCPU.
    model = calibrate(_records(MODEL, seed=2, memory_mb=512), cpu_scaled=True)
    assert model.compute_s_per_sample == pytest.approx(1e-5, rel=0.03)
    unscaled = calibrate(_records(MODEL, seed=2, memory_mb=512))
    assert unscaled.compute_s_per_sample == pytest.approx(1e-5 * 1769 / 512, rel=0.03)


def test_calibration_keeps_what_the_records_cannot_tell_and_refuses_one_size() -> None:
    warm = [r for r in _records(MODEL, seed=3) if r.ok and not r.cold_start]
    base = PerformanceModel(compute_s_per_sample=0.0, cold_start_s=0.5, straggler_p=0.1)
    fit = fit_performance_model(warm, base=base)
    assert "cold_start_s" not in fit.columns
    assert fit.model.cold_start_s == 0.5 and fit.model.straggler_p == 0.1
    one_size = [r for r in warm if r.result["samples"] == 5_000 and r.labels["batch_size"] == 128]
    with pytest.raises(ValueError, match="two amounts of work"):
        calibrate(one_size)
    with pytest.raises(ValueError, match="at least two"):
        calibrate(warm[:1])


def test_the_model_validates_its_parameters_and_round_trips() -> None:
    for bad in (
        {"compute_s_per_sample": -1.0},
        {"compute_s_per_sample": 1e-6, "bandwidth_bytes_per_s": 0.0},
        {"compute_s_per_sample": 1e-6, "straggler_p": 1.5},
        {"compute_s_per_sample": 1e-6, "straggler_slowdown": (0.5, 2.0)},
        {"compute_s_per_sample": 1e-6, "straggler_slowdown": (3.0, 2.0)},
        {"compute_s_per_sample": 1e-6, "overhead_s": math.nan},
    ):
        with pytest.raises(ValueError):
            PerformanceModel(**bad)
    assert PerformanceModel.from_dict(NOISY.as_dict()) == NOISY
    assert NOISY.mb_per_vcpu == lambda_prices().mb_per_vcpu == 1769


def test_memory_below_one_vcpu_slows_compute_in_proportion_and_above_gains_nothing() -> None:
    work = Work.for_shard(100_000, 1_000)
    full = MODEL.compute_s(work, 1769)
    assert full == pytest.approx(100_000 * 1e-5 + 100 * 2e-3)
    assert MODEL.compute_s(work, 1769 // 2) == pytest.approx(full * 1769 / (1769 // 2))
    assert MODEL.compute_s(work, 128) == pytest.approx(full * 1769 / 128)
    assert MODEL.compute_s(work, 3538) == MODEL.compute_s(work, 10_240) == full
    assert MODEL.vcpus(10_240) == pytest.approx(10_240 / 1769)
    threaded = MODEL.replace(worker_vcpus=4.0)  # a worker that could use more cores
    assert threaded.compute_s(work, 3538) == pytest.approx(full / 2)
    with SimRuntime(MODEL) as sim:  # overhead and cold start are not scaled
        small = sim.submit({}, 442, 900, samples=100_000).result()
        large = sim.submit({}, 1769, 900, samples=100_000).result()
    assert small.cold_start and large.cold_start
    assert small.duration_s - 1.0 == pytest.approx((large.duration_s - 1.0) * 1769 / 442)


# -- the runtime ---------------------------------------------------------------------------


def test_sim_is_a_registered_runtime() -> None:
    assert "sim" in RUNTIMES
    with open_runtime("sim", model=MODEL, seed=3) as runtime:
        assert isinstance(runtime, SimRuntime)
        assert runtime.submit({}, 1024, 60, samples=10).result().ok


def test_futures_complete_in_virtual_time_order_when_waited_on() -> None:
    with SimRuntime(MODEL) as sim:
        sizes = [40_000, 10_000, 30_000, 20_000]
        futures = [sim.submit({}, 1769, 900, samples=n, worker=w) for w, n in enumerate(sizes)]
        assert sim.clock.now == 0.0 and not any(f.done() for f in futures)
        done, pending = wait(futures, return_when=FIRST_COMPLETED)
        assert [f.result().labels["worker"] for f in done] == [1] and len(pending) == 3
        assert sim.clock.now == pytest.approx(0.8 + 0.2 + 0.1)
        order = [f.result().labels["worker"] for f in as_completed(pending)]
        assert order == [3, 2, 0]
        assert sim.clock.now == pytest.approx(1.0 + 0.4)
        later = sim.submit({}, 1769, 900, samples=10_000)  # starts at the current time
        record = later.result()  # result() advances the simulation
        assert not record.cold_start and record.queued_s == 0.0
        assert sim.clock.now == pytest.approx(1.4 + 0.2 + 0.1)
        assert record.result is None and record.status == OK
        wait([sim.submit({}, 1769, 900, samples=1) for _ in range(3)], return_when=ALL_COMPLETED)
        assert sim.pending == 0 and len(sim.records) == 8


def test_invocations_beyond_the_concurrency_cap_queue_unbilled_on_warm_containers() -> None:
    with SimRuntime(MODEL, concurrency=2) as sim:
        records = [f.result() for f in [sim.submit({}, 1769, 900, samples=0) for _ in range(4)]]
    assert [r.queued_s for r in records] == pytest.approx([0.0, 0.0, 1.0, 1.0])
    assert [r.cold_start for r in records] == [True, True, False, False]
    assert [r.duration_s for r in records] == pytest.approx([1.0, 1.0, 0.2, 0.2])
    assert sim.clock.now == pytest.approx(1.2)


def test_cold_starts_per_memory_size_and_after_the_keep_warm_time() -> None:
    with SimRuntime(MODEL, keep_warm_s=300) as sim:
        first = sim.submit({}, 1024, 60, samples=0).result()
        second = sim.submit({}, 1024, 60, samples=0).result()
        other = sim.submit({}, 2048, 60, samples=0).result()
        sim.advance_to(sim.clock.now + 301)
        reclaimed = sim.submit({}, 1024, 60, samples=0).result()
    assert first.cold_start and not second.cold_start
    assert other.cold_start and reclaimed.cold_start


def test_billing_matches_functions_pricing() -> None:
    prices = lambda_prices()
    model = PerformanceModel(compute_s_per_sample=0.0, overhead_s=1.2345)
    with SimRuntime(model) as sim:
        record = sim.submit({}, 1024, 60, samples=0).result()
        assert record.billed_ms == 1235
        assert record.cost_usd == pytest.approx(1.235 * prices.gb_second_usd + prices.request_usd)
        many = [sim.submit({}, m, 900, samples=50_000) for m in (128, 700, 1769, 10_240)]
        sim.run()
    for future in many:
        r = future.record
        assert r.billed_ms == prices.billed_ms(r.duration_s * 1000)
        assert r.cost_usd == prices.invocation_cost(r.duration_s * 1000, r.memory_mb)


def test_stragglers_are_seeded_reproducible_and_drawn_as_configured() -> None:
    def durations(seed: int) -> list[float]:
        with SimRuntime(NOISY, seed=seed) as sim:
            futures = [sim.submit({}, 1769, 900, samples=10_000) for _ in range(2_000)]
            return [f.result().duration_s for f in futures]

    assert durations(5) == durations(5)
    assert durations(5) != durations(6)
    run = simulate_epochs("bsp", 500, 10_000, 4, NOISY, seed=5)
    assert [r.duration_s for r in run.records] == [
        r.duration_s for r in simulate_epochs("bsp", 500, 10_000, 4, NOISY, seed=5).records
    ]
    slowdowns = np.array([r.labels["slowdown"] for r in run.records])
    stragglers = slowdowns[slowdowns > 2.0]  # jitter alone stays far below 3x
    assert len(stragglers) / len(slowdowns) == pytest.approx(0.2, abs=0.02)
    assert stragglers.min() > 3.0 * 0.6 and stragglers.max() < 5.0 * 1.6
    assert np.mean(slowdowns) == pytest.approx(NOISY.mean_slowdown(), rel=0.05)


def test_overrunning_workers_stop_early_or_time_out() -> None:
    slow = MODEL.replace(straggler_p=1.0, straggler_slowdown=(10.0, 10.0))
    with SimRuntime(slow, stop_early=False) as sim:
        timed_out = sim.submit({}, 1769, 30, samples=500_000).result()
        after = sim.submit({}, 1769, 30, samples=0).result()
    assert timed_out.status == TIMEOUT and timed_out.error == "task timed out"
    assert timed_out.duration_s == 30 and timed_out.billed_ms == 30_000
    assert after.cold_start  # the timed-out container was discarded
    with SimRuntime(slow) as sim:
        stopped = sim.submit({"time_margin_s": 5.0}, 1769, 30, samples=500_000).result()
        hopeless = sim.submit({}, 1769, 1, samples=500_000).result()  # fixed part > limit
    assert stopped.ok and stopped.labels["stopped_early"]
    assert stopped.duration_s == pytest.approx(25.0)
    assert 0 < stopped.labels["samples_trained"] < 500_000
    assert hopeless.status == TIMEOUT


def test_thousand_workers_simulate_in_seconds() -> None:
    started = time.perf_counter()
    with SimRuntime(NOISY, seed=1) as sim:
        futures = [sim.submit({}, 1769, 900, samples=20_000, worker=w) for w in range(1_000)]
        done, pending = wait(futures)
        assert len(done) == 1_000 and not pending
    run = simulate_epochs(750, 1_000, 20_000, 5, NOISY, seed=1)
    elapsed = time.perf_counter() - started
    assert len(run.epochs) == 5 and all(e.fresh == 750 for e in run.epochs)
    assert elapsed < 20  # a smoke bound for shared machines; about 0.5 s on a laptop


# -- epochs --------------------------------------------------------------------------------


def _finishes(run: Simulation, epoch: int) -> list[float]:
    """When the workers launched at the start of `epoch` finished, from its start."""
    return sorted(r.queued_s + r.duration_s for r in run.records if r.labels["epoch"] == epoch)


def test_a_bsp_epoch_lasts_as_long_as_its_slowest_worker() -> None:
    run = simulate_epochs("bsp", 64, 20_000, 4, NOISY, seed=2)
    for timing in run.epochs:
        assert timing.launched == timing.fresh == 64 and timing.stale == 0
        assert timing.duration_s == pytest.approx(max(_finishes(run, timing.epoch)))
    assert run.latency_s == pytest.approx(sum(run.epoch_durations))
    assert run.cost_usd == pytest.approx(sum(r.cost_usd for r in run.records))
    assert run.cost_usd == pytest.approx(sum(e.cost_usd for e in run.epochs))


def test_a_selective_epoch_ends_at_the_kappa_th_order_statistic() -> None:
    workers, kappa = 64, 48
    run = simulate_epochs(kappa, workers, 20_000, 3, NOISY, seed=2)
    first = run.epochs[0]
    assert first.duration_s == pytest.approx(_finishes(run, 0)[kappa - 1])
    assert first.fresh == kappa
    # The next epoch starts a fresh worker on every shard, the stragglers' included,
    # and applies the stragglers' updates, stale, as they arrive.
    second = run.epochs[1]
    stragglers = sum(1 for end in _finishes(run, 0) if end > first.duration_s)
    assert stragglers == workers - kappa
    assert second.launched == workers
    assert second.stale > 0
    # Every update of the job is applied exactly once or still in flight at the end.
    applied = sum(e.fresh + e.stale for e in run.epochs)
    assert applied <= len(run.records)


def test_asp_epochs_are_lambda_arrivals_and_beat_bsp_with_stragglers() -> None:
    asp = simulate_epochs("asp", 32, 20_000, 5, NOISY, seed=4)
    bsp = simulate_epochs("bsp", 32, 20_000, 5, NOISY, seed=4)
    assert all(e.fresh + e.stale == 32 for e in asp.epochs)
    assert asp.latency_s < bsp.latency_s
    assert simulate_epochs(32, 32, 20_000, 5, NOISY, seed=4).epoch_durations == pytest.approx(
        bsp.epoch_durations
    )
    with pytest.raises(ValueError, match="kappa"):
        simulate_epochs(33, 32, 20_000, 1, NOISY)


def test_the_coordinators_overhead_delays_the_epoch_while_workers_run_on() -> None:
    plain = simulate_epochs("bsp", 8, 20_000, 3, MODEL)
    slowed = simulate_epochs("bsp", 8, 20_000, 3, MODEL, sync_overhead_s=0.5)
    assert slowed.epoch_durations == pytest.approx([d + 0.5 for d in plain.epoch_durations])


# -- worker events and the coordinator -----------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> FileObjectStore:
    return FileObjectStore(tmp_path / "objects")


def _event(store: FileObjectStore, samples: int, **overrides: object) -> dict:
    rng = np.random.default_rng(0)
    model = BiasedMF(factors=4, seed=0)
    model.grow([f"u{i}" for i in range(30)], [f"i{i}" for i in range(40)])
    snapshot = model_to_bytes(model)
    store.put("snapshots/j/000000.npz", snapshot)
    key = f"shards/j/{samples:05d}-of-00001.npz"
    users, items = rng.integers(0, 30, samples), rng.integers(0, 40, samples)
    write_shard(store, key, users, items, rng.uniform(1, 5, samples))
    task = WorkerTask(
        store_url=store.url,
        job_id="j",
        epoch=0,
        worker=0,
        snapshot_key="snapshots/j/000000.npz",
        shard_key=key,
        delta_key="deltas/j/000000/00000.npz",
        batch_size=100,
        learning_rate=0.05,
        regularization=0.01,
        snapshot_sha256=sha256_hex(snapshot),
    )
    return {**task.as_event(), **overrides}


def test_the_work_of_a_worker_event_comes_from_its_shard_in_the_store(
    store: FileObjectStore,
) -> None:
    event = _event(store, 2_500, local_epochs=2)
    with SimRuntime(MODEL) as sim:
        record = sim.submit(event, 1769, 900).result()
        overridden = sim.submit(event, 1769, 900, samples=100).result()
        missing = sim.submit({**event, "shard_key": "shards/j/nope.npz"}, 1769, 900).result()
        with pytest.raises(UncostablePayload):
            sim.submit({"batch_size": 10}, 1769, 900)
    assert record.labels["samples_trained"] == 5_000
    work = Work(5_000, batches=50)
    assert record.duration_s == pytest.approx(MODEL.duration_s(work, 1769, cold=True))
    assert overridden.labels["samples_trained"] == 200  # 100 samples, two local epochs
    assert missing.status == ERROR and "nope" in missing.error
    assert not store.exists(event["delta_key"])  # deltas only when asked for


def test_the_coordinator_runs_unchanged_on_the_simulator(store: FileObjectStore) -> None:
    from configurator.space import EpochConfig
    from retrain.coordinator import DistributedBackend
    from retrain.sync import SyncPolicy
    from retrain.window import RatingsWindow

    rng = np.random.default_rng(1)
    window = RatingsWindow(
        [f"u{x}" for x in rng.integers(0, 30, 900)],
        [f"i{x}" for x in rng.integers(0, 40, 900)],
        rng.uniform(1, 5, 900),
    )
    model = BiasedMF(factors=4, seed=0)
    model.grow(window.user_ids, window.item_ids)
    with SimRuntime(NOISY, seed=1, write_deltas=True) as sim:
        backend = DistributedBackend(
            sim, store, store.url, "job", SyncPolicy.selective(0.5), timeout_s=60
        )
        backend.prepare(model, window)
        config = EpochConfig(batch_size=64, learning_rate=0.05, workers=4, memory_mb=1769)
        ends = []
        for _ in range(3):
            backend.run_epoch(config)
            ends.append(sim.clock.now)
        backend.result()
    assert 0 < ends[0] < ends[1] < ends[2]
    assert len(backend.stats.used) >= 6
    assert all(r.result is None for r in backend.stats.invocations)


def _window_and_model(seed: int = 1) -> tuple[Any, BiasedMF]:
    from retrain.window import RatingsWindow

    rng = np.random.default_rng(seed)
    window = RatingsWindow(
        [f"u{x}" for x in rng.integers(0, 30, 900)],
        [f"i{x}" for x in rng.integers(0, 40, 900)],
        rng.uniform(1, 5, 900),
    )
    model = BiasedMF(factors=4, seed=0)
    model.global_mean = float(window.ratings.mean())
    model.grow(window.user_ids, window.item_ids)
    return window, model


def _bsp_losses(runtime: Any, store: FileObjectStore, epochs: int) -> list[float]:
    from configurator.space import EpochConfig
    from retrain.coordinator import DistributedBackend
    from retrain.sync import SyncPolicy

    window, model = _window_and_model()
    backend = DistributedBackend(runtime, store, store.url, "job", SyncPolicy.bsp(), timeout_s=60)
    backend.prepare(model, window)
    config = EpochConfig(batch_size=64, learning_rate=0.05, workers=4, memory_mb=1769)
    return [backend.run_epoch(config).loss for _ in range(epochs)]


def test_executed_workers_train_for_real_and_match_the_in_process_runtime(
    tmp_path: Path,
) -> None:
    from functions.handler import handler
    from tests.retrain.test_checkpoints import InlineRuntime

    reference = _bsp_losses(InlineRuntime(), FileObjectStore(tmp_path / "inline"), 3)
    with SimRuntime(NOISY, seed=1, execute=handler) as sim:
        losses = _bsp_losses(sim, FileObjectStore(tmp_path / "sim"), 3)
        records = list(sim.records)
    assert losses == pytest.approx(reference, rel=1e-9)
    assert losses[-1] < losses[0]
    assert all(r.ok and r.result["samples_trained"] == r.result["samples"] for r in records)
    assert all(r.duration_s != r.result["duration_s"] for r in records)  # virtual, not real


def test_an_executed_worker_that_raises_fails_its_invocation(store: FileObjectStore) -> None:
    def broken(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError(f"cannot train {event['worker']} in {context.memory_limit_in_mb} MB")

    with SimRuntime(MODEL, execute=broken) as sim:
        record = sim.submit(_event(store, 500), 1769, 900).result()
    assert record.status == ERROR and record.error == "RuntimeError: cannot train 0 in 1769 MB"
    with pytest.raises(ValueError, match="exclude each other"):
        SimRuntime(MODEL, write_deltas=True, execute=broken)


@pytest.mark.parametrize("charge", [False, True])
def test_the_callers_own_time_is_charged_to_virtual_time_when_asked(
    store: FileObjectStore, charge: bool
) -> None:
    with SimRuntime(MODEL, charge_caller=charge) as sim:
        first = sim.submit({}, 1769, 900, samples=100)
        time.sleep(0.2)  # the caller's own work, between two calls into the runtime
        second = sim.submit({}, 1769, 900, samples=100)
        wait([first, second])
        time.sleep(0.2)
        sim.run()
    assert (second.record.queued_s, first.result().duration_s) == (0.0, second.result().duration_s)
    ends = sim.clock.now - second.result().duration_s
    if charge:
        assert 0.2 <= ends < 1.5  # the first sleep delayed the second launch...
        assert sim.clock.now >= 0.4  # ...and the second one moved the clock on
    else:
        assert ends == 0.0 and sim.clock.now == second.result().duration_s
