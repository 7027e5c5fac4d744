"""``driftline bench configurator`` on a small space: every method, every figure, and
the yardsticks behaving as yardsticks (the oracle has no regret, the static default
never adapts)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench.configurator import (
    METHODS,
    Run,
    _Ledger,
    _violations_by_epoch,
    run_configurator,
    scenarios,
)
from benchmarks.gpopt.progress import (
    RATIOS,
    WORKERS,
    ProgressTable,
    measure_progress,
    phase_decay,
)
from configurator.space import SearchSpace
from retrain.sync import SyncPolicy

SPACE = SearchSpace(
    memory_mb=(512, 1769, 3538),
    workers=(1, 2, 4, 8, 16, 32),
    sync_ratio=(0.5, 1.0),
    batch_size=(256, 1024),
    learning_rate=(0.025, 0.1),
)


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict:
    progress = measure_progress(SPACE, window=2_000, workers=(2, 8), ratios=(0.5, 1.0))
    plot = tmp_path_factory.mktemp("bench") / "regret.png"
    result = run_configurator(
        seeds=1,
        epochs=5,
        target_epochs=4,
        sizes=(10_000, 100_000),
        space=SPACE,
        progress=progress,
        decision_timing=False,
        plot=plot,
        processes=1,
    )
    json.dumps(result)  # what --json prints
    return result


@pytest.mark.slow
def test_every_method_reports_regret_violations_and_cost(figures: dict) -> None:
    assert figures["candidates"] == len(SPACE)
    assert figures["scenarios"] == [s.name for s in scenarios((10_000, 100_000))]
    for method in METHODS:
        assert set(figures["regret"][method]) == {"1", "3", "5"}
        assert 0.0 <= figures["violations"][method] <= 1.0
        assert set(figures["violations_by_epoch"][method]) == {"1", "2-5"}
        assert figures["cost_vs_oracle"][method] > 0.0
        assert figures["job_cost_usd"][method] > 0.0
    assert Path(figures["regret_plot"]).stat().st_size > 0


@pytest.mark.slow
def test_the_oracle_has_no_regret_and_the_static_default_never_moves(figures: dict) -> None:
    assert all(r == 0.0 for r in figures["regret"]["oracle"].values())
    assert figures["cost_vs_oracle"]["oracle"] == 1.0
    assert figures["cost_vs_static"]["static"] == 1.0
    assert figures["cost_vs_static_same_loss"]["static"] == 1.0
    static = figures["regret_curve"]["static"]
    assert len(set(static)) == 1  # one config, one regret, every epoch


@pytest.mark.slow
def test_gp_opt_predicts_its_latency_with_an_interval(figures: dict) -> None:
    assert figures["interval_coverage"] is not None
    assert 0.0 <= figures["interval_coverage"] <= 1.0
    assert figures["gp_saving_vs_static"] is not None


def _job(losses: list[float], costs: list[float]) -> Run:
    n = len(losses)
    return Run([0.0] * n, [False] * n, costs, [1.0] * n, losses, [None] * n)


def test_costs_are_paired_job_by_job_and_the_static_default_is_met_at_its_own_loss() -> None:
    """The static default seldom reaches the oracle's loss, so it is charged its whole
    job; the same-loss ratio asks what the method paid to get where static ended."""
    ledger = _Ledger(("gp", "static", "oracle"), target_epoch=2)
    ledger.add(
        {
            "oracle": _job([0.8, 0.6, 0.5], [2.0, 2.0, 2.0]),
            "gp": _job([0.85, 0.7, 0.6], [1.0, 1.0, 1.0]),
            "static": _job([0.95, 0.9, 0.85], [1.0, 1.0, 1.0]),
        },
        cap=10.0,
    )
    ledger.add(  # a warm job: no static default to pair with
        {"oracle": _job([0.8, 0.6], [2.0, 2.0]), "gp": _job([0.8, 0.6], [9.0, 9.0])}, cap=10.0
    )
    figures = ledger.figures()
    assert figures["cost_vs_oracle"]["gp"] == pytest.approx((3.0 / 4.0 + 18.0 / 4.0) / 2)
    assert figures["target_missed"] == {"gp": 0, "static": 1, "oracle": 0}
    assert figures["cost_vs_static"]["gp"] == pytest.approx(3.0 / 3.0)
    assert figures["cost_vs_static_same_loss"]["gp"] == pytest.approx(1.0 / 3.0)
    assert figures["gp_saving_vs_static_same_loss"] == pytest.approx(2.0 / 3.0)
    assert figures["deadline_met"]["static"] == 0.0


def test_late_epochs_are_reported_by_the_stretch_of_the_job_they_fell_in() -> None:
    first_late = Run([0.0] * 25, [True] + [False] * 24, [1.0] * 25, [1.0] * 25, [1.0] * 25, [])
    end_late = Run([0.0] * 25, [False] * 20 + [True] * 5, [1.0] * 25, [1.0] * 25, [1.0] * 25, [])
    shares = _violations_by_epoch([first_late, end_late])
    assert shares == {"1": 0.5, "2-5": 0.0, "6-10": 0.0, "11-20": 0.0, "21+": 0.5}
    assert set(_violations_by_epoch([_job([1.0] * 3, [1.0] * 3)])) == {"1", "2-5"}


def test_decision_times_are_measured_next_to_the_naive_prediction() -> None:
    from benchmarks.bench.configurator import decision_times

    times = decision_times(SPACE, observations=20, candidates=200, repeats=3)
    assert 0.0 < times["decision_ms_p50"] <= times["decision_ms_p99"] <= times["decision_ms_max"]
    assert times["decisions_timed"] == 3
    assert times["naive_decision_ms_p99"] > 0.0
    assert times["decision_observations"] == 20


def test_the_truths_phase_follows_the_loss_fallen_not_the_epochs_run() -> None:
    """A job repeating one config meets the measured decay; a job that explored with a
    config progressing half as much has more gap left, progresses more when it comes
    back, and converges to the same floor instead of trailing for good."""
    table = ProgressTable(
        np.array([1_000.0]), (1024,), (0.05,), (1.0,), np.full((1, 1, 1, 1), 0.1), 0.9, 0.0
    )
    reach = table.reach(0.1)
    fast = 0.0
    for epoch in range(40):
        assert table.phase(fast, reach) == pytest.approx(0.9**epoch)
        fast += 0.1 * table.phase(fast, reach)
    slow = 0.0
    for epoch in range(40):
        slow += (0.05 if epoch < 5 else 0.1) * table.phase(slow, reach)
        if epoch == 4:
            assert table.phase(slow, reach) > 0.9**5
    assert slow == pytest.approx(fast, rel=0.02)
    assert table.phase(reach * 2, reach) == 0.0
    flat = ProgressTable(table.shards, (1024,), (0.05,), (1.0,), table.values, 1.0, 0.0)
    assert flat.reach(0.1) == float("inf")


def test_an_epochs_noise_is_the_same_in_every_process() -> None:
    """Methods, and runs, meet the same luck: the scenario's part of the noise seed does
    not depend on the interpreter's string-hash salt."""
    code = (
        "from benchmarks.bench.configurator import noise_key, scenarios;"
        "print([noise_key(s) for s in scenarios()])"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": salt},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for salt in ("1", "2")
    }
    assert len(keys) == 1


def test_every_measured_sync_ratio_runs_as_a_whole_kappa() -> None:
    """A ratio some measured λ rounds up to another κ is refused: at λ = 2, κ/λ ¾ ran
    κ = 2 of 2 and the table read it as synchronous. The defaults cover the search
    space's ratios, each a whole κ at every measured λ."""
    with pytest.raises(ValueError, match="κ/λ 0.75 at λ = 2 runs κ = 2"):
        measure_progress(SPACE, window=2_000, workers=(2, 8), ratios=(0.75, 1.0))
    assert set(SearchSpace().sync_ratio) <= set(RATIOS)
    for workers in WORKERS:
        for ratio in RATIOS:
            assert SyncPolicy.selective(ratio).kappa(workers) == ratio * workers


def test_the_phase_decay_is_read_from_synchronous_configs() -> None:
    """Second epochs of κ < λ fold in the first's late updates and can outgrow it;
    the decay comes from the synchronous configs alone."""
    ratios = (0.5, 1.0)
    first = np.full((2, 1, 1, 2), 0.10)
    second = np.stack([np.full((2, 1, 1), 0.12), np.full((2, 1, 1), 0.09)], axis=-1)
    assert phase_decay(first, second, ratios) == pytest.approx(0.9)
    assert phase_decay(first, second, (0.5, 0.75)) == pytest.approx(math.sqrt(1.2 * 0.9))
