"""The worker-kind scenarios of ``driftline bench configurator``, in simulation: GP-OPT
keeps a 10^7-rating window on Lambda (the torch worker's host part makes a GPU
container dearer per sample), puts a small window with a loose deadline in the service's
own process and one with a tight deadline on Lambda, as the oracle does; and the
truth's progress follows a worker's SGD steps."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench.configurator import QUICK, QUICK_METHODS, _Plan
from benchmarks.bench.configurator_kinds import (
    KIND_METHODS,
    KindJob,
    KindScenario,
    kind_figures,
    kind_scenarios,
    run_kind_task,
)
from benchmarks.gpopt.kinds import KindTruth, kind_of_job
from benchmarks.gpopt.progress import ProgressTable
from configurator import EpochConfig, JobContext, SearchSpace
from configurator.space import Candidates

SPACE = SearchSpace(
    memory_mb=(512, 1024, 1769),
    workers=(1, 2, 4, 8, 16, 32, 64),
    sync_ratio=(0.75, 1.0),
    batch_size=(256, 1024, 4096),
    learning_rate=(0.05, 0.2),
)


def _progress() -> ProgressTable:
    """Progress saturating in a worker's SGD steps, as the measured table does."""
    shards = np.array([312.0, 1250.0, 5000.0])
    batch, lr, ratios = SPACE.batch_size, SPACE.learning_rate, (0.75, 1.0)
    values = np.zeros((3, len(batch), len(lr), len(ratios)))
    for index in np.ndindex(values.shape):
        w, b, r, s = index
        steps = np.ceil(shards[w] / batch[b])
        gained = 1 - np.exp(-lr[r] * steps / 0.5)
        values[index] = 0.05 * gained * (ratios[s] + (1 - ratios[s]) * 0.3)
    return ProgressTable(shards, batch, lr, ratios, values, 0.95, 0.02)


def _kinds(scenario: KindScenario, epochs: int = 8) -> dict[str, str]:
    ((done, _),) = run_kind_task(scenario, (0,), epochs, ("gp", "oracle"), SPACE, _progress())
    return {name: kind_of_job(run.configs) for name, run in done.items()}


@pytest.mark.slow
def test_gp_opt_keeps_a_ten_million_rating_window_on_lambda_as_the_oracle_does() -> None:
    kinds = _kinds(KindScenario("kinds-1e7-loose", 10_000_000, None), epochs=40)
    assert kinds["oracle"] == "lambda"
    assert kinds["gp"] == kinds["oracle"]


@pytest.mark.slow
def test_gp_opt_trains_a_small_window_in_process_or_on_lambda_by_its_deadline() -> None:
    assert _kinds(KindScenario("kinds-1e5-loose", 100_000, None)) == {
        "gp": "inprocess",
        "oracle": "inprocess",
    }
    tight = _kinds(KindScenario("kinds-1e5-tight", 100_000, 0.1))
    assert tight == {"gp": "lambda", "oracle": "lambda"}


def test_the_scenarios_span_three_windows_each_tight_and_loose() -> None:
    names = [s.name for s in kind_scenarios()]
    assert names == [f"kinds-1e{k}-{d}" for k in (5, 6, 7) for d in ("tight", "loose")]
    assert KIND_METHODS == ("gp", "gp_lambda", "oracle", "oracle_lambda")


def test_the_truths_progress_follows_a_workers_steps_past_the_measured_window() -> None:
    truth = KindTruth(JobContext(10_000_000, 8, 10_334, 1.0, None, 10), _progress())
    gpu = EpochConfig(65536, 0.2, workers=1, sync_ratio=1.0, kind="gpu-l4")
    lam = EpochConfig(4096, 0.2, workers=16, sync_ratio=1.0, memory_mb=1769)
    few = EpochConfig(65536, 0.05, workers=1, sync_ratio=1.0, kind="gpu-l4")
    gpu_p, lam_p = truth.mean_progress(Candidates.of([gpu, lam]))
    assert gpu_p == pytest.approx(lam_p, rel=0.05)  # both take over a hundred steps
    small = KindTruth(JobContext(100_000, 8, 10_334, 1.0, None, 10), _progress())
    two_steps = small.mean_progress(Candidates.of([few]))[0]
    assert two_steps < 0.5 * truth.mean_progress(Candidates.of([few]))[0]


def test_kind_figures_compare_each_job_with_the_oracles_and_lambda_only_gp_opt() -> None:
    job = KindJob(KindScenario("kinds-1e6-loose", 1_000_000, None), _progress(), SPACE, 4)
    done = {name: job.run(job.method(name), 0) for name in ("oracle", "oracle_lambda")}
    done["gp"], done["gp_lambda"] = done["oracle"], done["oracle_lambda"]
    figures = kind_figures({"kinds-1e6-loose": [(done, job.context.latency_cap_s)]})
    one = figures["kinds-1e6-loose"]
    assert one["cost_vs_oracle"]["oracle"] == 1.0
    assert one["gp_kind_matches_oracle"] == 1.0
    assert one["gp_lambda_cost_vs_gp"] == pytest.approx(
        sum(done["oracle_lambda"].costs) / sum(done["oracle"].costs)
    )
    assert job.context.latency_cap_s == pytest.approx(600.0)


def test_quick_takes_its_own_defaults_unless_told_otherwise() -> None:
    plan = _Plan.of(True, None, None, None, None)
    assert (plan.seeds, plan.epochs, plan.methods) == (*QUICK, QUICK_METHODS)
    assert not plan.decision_timing
    assert _Plan.of(True, 3, 25, None, None).seeds == 3
    full = _Plan.of(False, None, None, None, None)
    assert (full.seeds, full.epochs, full.decision_timing) == (30, 50, True)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # minutes of CPU: past the suite's 300 s on a busy machine
def test_bench_configurator_quick_finishes_with_both_kinds_of_scenario() -> None:
    """``--quick`` on two processes, kept to one Lambda size, one kind size and five
    epochs: both kinds of scenario run and report (BENCHMARKS.md gives the full
    ``--quick``'s figures and time)."""
    from benchmarks.bench.configurator import run_configurator, scenarios

    figures = run_configurator(
        quick=True,
        epochs=5,
        sizes=(10_000,),
        kind_sizes=(100_000,),
        processes=2,
        show_progress=False,
    )
    assert figures["seeds"] == QUICK[0] and figures["epochs"] == 5
    assert set(figures["regret"]) == set(QUICK_METHODS)
    assert figures["scenarios"] == [s.name for s in scenarios((10_000,))]
    assert set(figures["kinds"]) == {s.name for s in kind_scenarios((100_000,))}
    assert figures["kinds"]["kinds-1e5-loose"]["oracle_kind"] == "inprocess"
    assert figures["bench_seconds"] < 900
