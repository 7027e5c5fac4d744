"""``driftline bench gpu`` on tiny windows: both workers timed per epoch at each batch
size, their losses equal, a crossover reported, a GPU model fitted."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.bench.gpu import crossover, run_gpu, synthetic_window

pytest.importorskip("torch")


def test_bench_gpu_times_both_workers_and_finds_their_losses_equal() -> None:
    figures = run_gpu(windows=[20_000, 5_000], batch_sizes=(512, 4096), steps=3, warmup=1)
    json.dumps(figures)  # what --json prints
    assert figures["windows"] == [5_000, 20_000]
    assert figures["device"] in {"cpu", "cuda", "cuda:0"}
    assert len(figures["results"]) == 4
    for row in figures["results"]:
        assert row["numpy_s_per_epoch"] > 0 and row["torch_s_per_epoch"] > 0
        assert row["speedup"] == pytest.approx(row["numpy_s_per_epoch"] / row["torch_s_per_epoch"])
        assert row["steps_timed"] == min(3, math.ceil(row["window"] / row["batch_size"]))
        assert row["torch_loss_after_steps"] == pytest.approx(
            row["numpy_loss_after_steps"], rel=1e-9
        )
    smallest = [r for r in figures["results"] if r["window"] == 5_000]
    for row in smallest:  # whole epochs on the smallest window
        assert row["torch_loss_after_epochs"] == pytest.approx(
            row["numpy_loss_after_epochs"], rel=1e-9
        )
    assert set(figures["crossover_by_batch"]) == {"512", "4096"}
    assert figures["fitted_gpu_model"]["compute_s_per_batch"] >= 0


def test_the_crossover_is_interpolated_in_log_window() -> None:
    rows = [
        {"window": 10_000, "speedup": 0.5},
        {"window": 1_000_000, "speedup": 2.0},
    ]
    assert crossover(rows) == pytest.approx(100_000)
    assert crossover([{"window": 10, "speedup": 1.5}]) == "below"
    assert crossover([{"window": 10, "speedup": 0.5}, {"window": 100, "speedup": 0.9}]) is None


def test_a_synthetic_window_has_a_model_that_covers_its_rows() -> None:
    model, users, items, ratings = synthetic_window(30_000)
    assert len(users) == len(items) == len(ratings) == 30_000
    assert users.max() < model.n_users and items.max() < model.n_items
    assert ratings.min() >= 1.0 and ratings.max() <= 5.0


def test_driftline_bench_gpu_takes_its_windows_and_prints_json_last() -> None:
    from typer.testing import CliRunner

    from benchmarks.cli import app

    result = CliRunner().invoke(app, ["bench", "gpu", "--json", "--windows", "4000"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["windows"] == [4000]
    refused = CliRunner().invoke(app, ["bench", "drift", "--windows", "4000"])
    assert refused.exit_code != 0
