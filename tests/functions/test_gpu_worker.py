"""The torch worker computes the numpy worker's update (CUDA if present, else CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from functions.handler import parse_event, run_worker
from functions.shards import read_delta
from tests.functions.test_handler import Problem, problem  # noqa: F401 - fixture

torch = pytest.importorskip("torch")


def test_the_torch_worker_writes_the_numpy_workers_delta(problem: Problem) -> None:  # noqa: F811
    from functions.gpu import TorchTrainer, default_device

    everything = np.ones(len(problem.ratings), dtype=bool)
    shard = problem.shard(0, 1, everything)
    numpy_event = problem.event(shard, delta_key="deltas/job-1/000000/numpy.npz")
    torch_event = problem.event(shard, delta_key="deltas/job-1/000000/torch.npz")
    numpy_result, numpy_model = run_worker(parse_event(numpy_event))
    torch_result, torch_model = run_worker(parse_event(torch_event), trainer=TorchTrainer)

    assert torch_result["loss_after"] < torch_result["loss_before"]
    assert torch_result["loss_after"] == pytest.approx(numpy_result["loss_after"], rel=1e-9)
    np.testing.assert_allclose(torch_model.user_factors, numpy_model.user_factors, atol=1e-10)
    np.testing.assert_allclose(torch_model.item_bias, numpy_model.item_bias, atol=1e-10)
    ours, theirs = (
        read_delta(problem.store, k) for k in (torch_event["delta_key"], numpy_event["delta_key"])
    )
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], atol=1e-10)
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_torch_trainer_scores_and_steps_the_shard_as_numpys(problem: Problem) -> None:  # noqa: F811
    from functions.gpu import TorchTrainer
    from functions.trainers import NumpyTrainer

    model = problem.model()
    u, i, r = problem.users, problem.items, problem.ratings
    ours, theirs = TorchTrainer(model.copy(), u, i, r), NumpyTrainer(model.copy(), u, i, r)
    assert ours.mse() == pytest.approx(theirs.mse(), rel=1e-12)
    for mine, reference in zip(ours.rows(), theirs.rows(), strict=True):
        np.testing.assert_array_equal(mine, reference)
    order = np.random.default_rng(3).permutation(len(r))
    ours.shuffle(order)
    theirs.shuffle(order)
    for start in range(0, len(r), 7):
        stop = min(start + 7, len(r))
        assert ours.step(start, stop) == pytest.approx(theirs.step(start, stop), rel=1e-9)
    assert ours.mse() == pytest.approx(theirs.mse(), rel=1e-9)
    ours.sync()
    np.testing.assert_allclose(ours.model.item_factors, theirs.model.item_factors, atol=1e-10)


def test_the_gpu_handler_has_lambdas_signature(problem: Problem) -> None:  # noqa: F811
    from functions.gpu import handler

    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    result = handler(problem.event(shard), None)
    assert result["samples"] == len(problem.ratings) and not result["stopped_early"]


@pytest.mark.slow
def test_the_gpu_runtime_runs_the_torch_worker_in_worker_processes(
    problem: Problem,  # noqa: F811
) -> None:
    from functions.runtimes import open_runtime

    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    with open_runtime("gpu") as runtime:
        record = runtime.submit(problem.event(shard), memory_mb=2048, timeout_s=120).result()
    assert record.ok, record.error
    assert record.result["loss_after"] < record.result["loss_before"]
