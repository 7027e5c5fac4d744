"""GPU containers in the simulator: start-up once, per-second billing with a minimum,
throughput that grows with the batch size and an advantage that grows with the window,
and the calibration that reproduces the measured speed-ups."""

from __future__ import annotations

import math

import pytest

from functions.gpu_performance import (
    GPU_MEASURED,
    H100_MODEL,
    NUMPY_HOST_SHARE,
    calibrate_gpu,
    numpy_seconds,
)
from functions.performance import DEFAULT_MODEL
from functions.pricing import gpu_prices, gpu_types, load_prices
from functions.runtimes.sim import GpuModel, fit_gpu_model, gpu_kind, simulate_gpu_epochs


def test_every_gpu_type_has_a_list_price_a_source_and_a_date() -> None:
    book = load_prices()["gpu_container"]
    assert "list price" in book["note"].lower()
    assert set(gpu_types()) == {"a10g", "l4", "a100", "h100"}
    for name in gpu_types():
        entry = book["types"][name]
        assert entry["source"].startswith("https://aws.amazon.com/")
        assert entry["as_of"] and entry["hour_usd"] > 0
    assert gpu_prices("a10g").instance == "g5.xlarge"
    assert gpu_prices("l4").instance == "g6.xlarge"
    with pytest.raises(ValueError, match="unknown GPU type"):
        gpu_prices("tpu")


def test_a_container_is_billed_per_started_second_with_a_minute_minimum() -> None:
    prices = gpu_prices("a10g")
    per_s = prices.hour_usd / 3600
    unbilled = prices.unbilled_startup_s
    assert prices.lease_cost(unbilled + 10) == pytest.approx(60 * per_s)  # the minimum
    assert prices.lease_cost(unbilled + 120.2) == pytest.approx(121 * per_s)  # rounded up
    assert prices.lease_cost(unbilled + 121.0) == pytest.approx(121 * per_s)


def test_only_the_first_epoch_waits_for_the_containers_to_start() -> None:
    kind = gpu_kind("l4")
    run = simulate_gpu_epochs(2, 1_000_000, 4, kind, batch_size=65_536, seed=1)
    first, *rest = run.epoch_durations
    assert first > kind.startup_s
    assert all(d < kind.startup_s / 10 for d in rest)
    assert first - kind.startup_s == pytest.approx(rest[0], rel=0.3)
    assert run.held_s == [run.latency_s, run.latency_s]
    assert run.cost_usd == pytest.approx(2 * kind.prices.lease_cost(run.latency_s))


def test_throughput_grows_with_the_batch_size_and_the_advantage_with_the_window() -> None:
    model = H100_MODEL
    per_sample = [model.seconds(2_000_000, b) / 2_000_000 for b in (1024, 8192, 65_536)]
    assert per_sample[0] > per_sample[1] > per_sample[2]

    def speedup(n: int, b: int) -> float:
        return numpy_seconds(DEFAULT_MODEL, n, b) / model.seconds(n, b)

    windows = (20_000, 200_000, 2_000_000, 20_000_000)
    assert [speedup(n, 65_536) for n in windows] == sorted(speedup(n, 65_536) for n in windows)
    # Small batches are as slow on a GPU as in numpy: its per-batch seconds dominate.
    assert speedup(200_000, 1024) < 1 < speedup(2_000_000, 8192) < speedup(2_000_000, 65_536)


def test_the_calibration_reproduces_the_measured_speedups_of_the_large_windows_steps() -> None:
    host_s = DEFAULT_MODEL.compute_s_per_sample * NUMPY_HOST_SHARE
    for n, b, measured in GPU_MEASURED:
        numpy_steps = numpy_seconds(DEFAULT_MODEL, n, b, NUMPY_HOST_SHARE)
        gpu_steps = H100_MODEL.seconds(n, b) - n * host_s
        if n == 2_000_000:
            assert numpy_steps / gpu_steps == pytest.approx(measured, rel=0.01)
        else:  # the small window's shortfall is the CUDA context's start, once
            with_init = numpy_steps / (gpu_steps + H100_MODEL.cuda_init_s)
            assert with_init == pytest.approx(measured, rel=0.01)
    assert 0 < H100_MODEL.cuda_init_s < 2
    slower = calibrate_gpu(numpy_model=DEFAULT_MODEL.replace(compute_s_per_sample=4.6e-6))
    assert slower.compute_s_per_sample > H100_MODEL.compute_s_per_sample


def test_the_workers_host_part_bounds_a_gpus_speedup_on_the_worker() -> None:
    """Amdahl's law: the torch worker runs the invocation's host part on the CPU, so a
    worker is at most 1 / host share faster than numpy's, however fast the steps."""
    bound = 1.0 / NUMPY_HOST_SHARE
    for n in (2_000_000, 20_000_000):
        worker = numpy_seconds(DEFAULT_MODEL, n, 65_536) / H100_MODEL.seconds(n, 65_536)
        assert 1.0 < worker < bound
    steps_only = calibrate_gpu(host_share=0.0)
    assert steps_only.seconds(10**7, 65_536) < H100_MODEL.seconds(10**7, 65_536) / 2


def test_a_gpu_fit_recovers_the_model_that_made_the_runs() -> None:
    truth = GpuModel(compute_s_per_sample=5e-8, compute_s_per_batch=2e-3, overhead_s=0.05)
    runs = [(n, b, truth.seconds(n, b)) for n in (10**5, 10**6, 10**7) for b in (1024, 65_536)]
    fitted = fit_gpu_model(runs)
    assert fitted.compute_s_per_sample == pytest.approx(5e-8, rel=1e-6)
    assert fitted.compute_s_per_batch == pytest.approx(2e-3, rel=1e-6)
    assert fitted.overhead_s == pytest.approx(0.05, rel=1e-6)
    with pytest.raises(ValueError, match="at least two"):
        fit_gpu_model(runs[:1])


def test_other_gpu_types_scale_the_h100_and_keep_their_own_prices() -> None:
    h100, a10g = gpu_kind("h100"), gpu_kind("a10g")
    assert a10g.model.seconds(10**7, 65_536) > h100.model.seconds(10**7, 65_536)
    assert a10g.prices.hour_usd < h100.prices.hour_usd
    assert math.isclose(h100.model.compute_s_per_batch, H100_MODEL.compute_s_per_batch)
