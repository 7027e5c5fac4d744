"""Worker kinds in the search space and the epoch model: Lambda predicted as before,
GPU containers with a planned start-up and a bill for being held, the service's own
process with a time limit, and recalibration per kind."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from configurator import EpochConfig, JobContext, Observation, SearchSpace, WorkerRun
from configurator.gp import GpOptConfigurator, GpOptSettings
from configurator.kinds import IN_PROCESS_LIMIT_S, gpu_kind_model
from configurator.performance import EpochModel, latency_groups, recalibrate
from configurator.space import GPU_KINDS, IN_PROCESS, KINDS, LAMBDA, Candidates, kind_code
from functions.gpu_performance import calibrate_gpu, gpu_kind
from functions.pricing import gpu_prices, gpu_types

SMALL = SearchSpace(
    memory_mb=(512, 1769),
    workers=(1, 4, 16),
    sync_ratio=(0.75, 1.0),
    batch_size=(512, 2048),
    learning_rate=(0.025, 0.1),
    gpu_workers=(1, 2),
    gpu_batch_size=(4096, 65536),
)


def _context(samples: int, cap: float = 600.0, epochs: int = 20) -> JobContext:
    return JobContext(samples, 8, 10_000, cap, None, epochs, job_id="kinds")


def test_the_space_holds_each_kind_with_its_own_grid() -> None:
    assert len(SearchSpace()) == 35_000
    assert SearchSpace().kinds == (LAMBDA,)
    space = replace(SMALL, kinds=KINDS)
    grid = space.grid()
    lambda_rows = 2 * 3 * 2 * 2 * 2
    in_process = 2 * 2  # one worker, synchronous, Lambda's batch sizes
    gpus = len(GPU_KINDS) * 2 * 2 * 2
    assert len(space) == len(grid) == lambda_rows + in_process + gpus
    assert set(np.unique(grid.kind).astype(int)) == {kind_code(k) for k in KINDS}
    assert grid.kind[:lambda_rows].max() == 0  # Lambda first, as the Lambda-only grid
    gpu = grid.kind >= kind_code(GPU_KINDS[0])
    assert set(grid.sync_ratio[gpu]) == {1.0}
    assert set(grid.batch_size[gpu]) == {4096, 65536}
    assert set(grid.workers[grid.kind == kind_code(IN_PROCESS)]) == {1}
    for row in (0, lambda_rows, len(grid) - 1):
        config = grid.config(row)
        assert Candidates.of([config]).kind[0] == grid.kind[row]
        assert space.index(grid, config) == row
    assert space.bounds()[1, 3] == pytest.approx(np.log(65536))
    assert {f"gpu-{t}" for t in gpu_types()} == set(GPU_KINDS)


def test_a_config_names_a_known_kind_and_context_narrows_the_space() -> None:
    with pytest.raises(ValueError, match="unknown worker kind"):
        EpochConfig(1024, 0.05, kind="tpu")
    with pytest.raises(ValueError, match="kinds must be some of"):
        _context(1000).__class__(1000, kinds=("lambda", "fpga"))
    context = replace(_context(10_000), kinds=(LAMBDA, IN_PROCESS))
    gp = GpOptConfigurator(
        EpochConfig(1024, 0.05), context, GpOptSettings(background=False), replace(SMALL)
    )
    assert gp.space.kinds == (LAMBDA, IN_PROCESS)
    assert set(np.unique(gp._grid.kind).astype(int)) == {0, 1}


def test_lambda_rows_of_a_mixed_grid_are_predicted_as_in_a_lambda_grid() -> None:
    model = EpochModel.prior()
    context = _context(1_000_000)
    mixed, alone = replace(SMALL, kinds=KINDS).grid(), SMALL.grid()
    ours = model.predict_after(mixed, context, (mixed, None), same_latency=latency_groups(mixed))
    theirs = model.predict_after(alone, context, (alone, None), same_latency=latency_groups(alone))
    n = len(alone)
    for a, b in zip(ours, theirs, strict=True):
        for name in ("log_latency", "log_latency_sd", "log_cost", "log_progress", "worker_tail_s"):
            np.testing.assert_array_equal(getattr(a, name)[:n], getattr(b, name))


def test_a_gpu_epoch_waits_for_its_start_up_once_and_bills_every_container_held() -> None:
    model = EpochModel.prior()
    context = _context(10_000_000)
    config = EpochConfig(65536, 0.05, workers=2, sync_ratio=1.0, kind="gpu-l4")
    cands = Candidates.of([config])
    kind = model.kinds["gpu-l4"]
    steady, first = model.predict_after(cands, context, (config, None))
    startup = gpu_prices("l4").startup_s
    assert np.exp(first.log_latency[0]) - np.exp(steady.log_latency[0]) == pytest.approx(
        startup, rel=0.02
    )
    held = 2 * np.exp(steady.log_latency[0]) * gpu_prices("l4").hour_usd / 3600
    assert np.exp(steady.log_cost[0]) == pytest.approx(held, rel=1e-6)
    assert model.planned_startup_s(cands, None)[0] == kind.startup_s
    assert model.planned_startup_s(cands, config)[0] == 0.0
    more = Candidates.of([replace(config, workers=4)])
    assert model.planned_startup_s(more, config)[0] == kind.startup_s  # two more to start
    lam = Candidates.of([EpochConfig(1024, 0.05, workers=4, memory_mb=1769)])
    assert model.planned_startup_s(lam, None)[0] == 0.0  # Lambda's cold starts are its own


def test_a_gpu_worker_that_leaves_half_its_work_on_the_host_is_dearer_than_lambda() -> None:
    """The torch worker moves only its minibatch steps to the GPU: the rest of its
    invocation runs on the CPU of a container priced for its GPU, dearer per sample than
    Lambda on any window. A worker with all of its work on the GPU (no host part) would
    train a large window for less than half of Lambda's price, a small one not."""
    model = EpochModel.prior()
    grid = replace(SearchSpace(), kinds=KINDS).grid()

    def cheapest(model: EpochModel, samples: int, kind: str) -> float:
        (steady,) = model.predict_after(grid, _context(samples), (grid,))
        rows = np.flatnonzero(grid.kind == kind_code(kind))
        return float(np.min(steady.log_cost[rows] - steady.log_progress[rows]))

    for samples in (100_000, 10_000_000):
        assert cheapest(model, samples, "gpu-l4") > cheapest(model, samples, LAMBDA)
    steps = gpu_kind("l4", calibrate_gpu(host_share=0.0)).model
    on_device = replace(
        model.kinds["gpu-l4"],
        compute_s_per_sample=steps.per_sample_s,
        compute_s_per_batch=steps.compute_s_per_batch,
    )
    all_on_gpu = replace(model, kinds={**model.kinds, "gpu-l4": on_device})
    large, small = 10_000_000, 100_000
    assert cheapest(all_on_gpu, large, "gpu-l4") < cheapest(all_on_gpu, large, LAMBDA) - np.log(2)
    assert cheapest(all_on_gpu, small, "gpu-l4") > cheapest(all_on_gpu, small, LAMBDA)


def test_in_process_epochs_have_a_time_limit_and_containers_none() -> None:
    model = EpochModel.prior()
    grid = replace(SMALL, kinds=KINDS).grid()
    limits = model.time_limits(grid, 900.0)
    assert set(limits[grid.kind == 0]) == {900.0}
    assert set(limits[grid.kind == kind_code(IN_PROCESS)]) == {IN_PROCESS_LIMIT_S}
    assert np.isinf(limits[grid.kind >= kind_code(GPU_KINDS[0])]).all()


def test_recalibration_rescales_a_gpu_kind_from_its_own_records() -> None:
    model = EpochModel.prior()
    context = _context(4_000_000)
    config = EpochConfig(65536, 0.05, workers=1, sync_ratio=1.0, kind="gpu-a10g")
    prior = model.kinds["gpu-a10g"]
    scaled, n = prior.shard_work(Candidates.of([config]), context, context.train_samples)
    history = []
    for t in range(6):
        cold = t == 0
        seconds = 1.5 * scaled[0] + (100.0 if cold else 0.0)
        run = WorkerRun(1769, int(n[0]), seconds, cold, 65536, kind="gpu-a10g")
        history.append(Observation(config, seconds, 1.0 - 0.01 * t, 0.001, (run,), 4_000_000))
    fitted = recalibrate(model, history, context)
    gpu = fitted.kinds["gpu-a10g"]
    assert gpu.compute_s_per_sample == pytest.approx(1.5 * prior.compute_s_per_sample, rel=1e-6)
    assert gpu.startup_s == pytest.approx(100.0, rel=1e-6)
    assert fitted.worker == model.worker  # no Lambda records: Lambda's model as it was
    assert fitted.kinds["gpu-l4"] is model.kinds["gpu-l4"]


def test_a_gpu_kind_model_comes_from_the_simulator_and_the_price_file() -> None:
    kind = gpu_kind_model("gpu-h100")
    assert kind.second_usd == pytest.approx(gpu_prices("h100").hour_usd / 3600)
    assert kind.held and kind.planned_startup and np.isinf(kind.limit_s)
