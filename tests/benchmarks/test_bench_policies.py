"""``driftline bench policies`` on a shortened trace: the JSON's shape and sane values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.cli import app
from benchmarks.policy_eval.runtimes import RUNTIMES
from retrain.policies import POLICIES

PUBLISHED = {
    "cost_usd",
    "mean_accuracy",
    "p10_accuracy",
    "retrain_s",
    "incorporation_latency_s",
    "recovery_s",
}
HEADLINE = {
    "wits_cost_ratio_vm_at_090",
    "wits_cost_ratio_vm_at_095",
    "wits_cost_ratio_autoscaled_at_090",
    "berkeley_retrain_speedup_vs_cost_aware",
}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from benchmarks.bench.policies import run_policies

    report = tmp_path_factory.mktemp("report")
    return run_policies(
        limit=15_000, seeds=3, minutes=12, report=report, traces=("wits", "berkeley")
    )


@pytest.mark.slow
def test_every_trace_policy_and_runtime_reports_the_published_figures(result: dict) -> None:
    assert set(result["traces"]) == {"wits", "berkeley"}
    for block in result["traces"].values():
        assert set(block) == set(POLICIES)
        for runtimes in block.values():
            assert set(runtimes) == set(RUNTIMES)
            for figures in runtimes.values():
                assert set(figures) >= PUBLISHED
                assert all(math.isfinite(figures[k]) and figures[k] >= 0 for k in PUBLISHED)
                assert 0.0 <= figures["hit_rate_at_10"] <= 1.0
    assert set(result["headline"]) == HEADLINE


@pytest.mark.slow
def test_best_effort_is_the_yardstick_and_vms_bill_for_being_up(result: dict) -> None:
    for block in result["traces"].values():
        for runtime in RUNTIMES:
            best = block["best-effort"][runtime]
            assert best["mean_accuracy"] == pytest.approx(1.0)
            assert best["recovery_s"] == 0.0
            assert block["never"][runtime]["retrain_s"] == 0.0
            assert block["never"][runtime]["mean_accuracy"] < 1.0
        assert block["never"]["sim"]["cost_usd"] == 0.0
        assert block["best-effort"]["sim"]["cost_usd"] > block["never"]["sim"]["cost_usd"]
        assert block["never"]["vm"]["cost_usd"] == block["best-effort"]["vm"]["cost_usd"] > 0
        # Batching 5 minutes of data makes larger jobs than retraining whenever idle.
        assert block["cost-aware"]["sim"]["retrain_s"] > block["best-effort"]["sim"]["retrain_s"]
        assert (
            block["best-effort"]["sim"]["incorporation_latency_s"]
            < block["cost-aware"]["sim"]["incorporation_latency_s"]
            < block["never"]["sim"]["incorporation_latency_s"]
        )


@pytest.mark.slow
def test_the_comparisons_carry_bootstrap_intervals_and_the_report_its_plots(result: dict) -> None:
    ratio = result["comparisons"]["wits"]["cost_ratio_vm_at_090"]
    low, high = ratio["ci95"]
    # A seed where adwin's laxest threshold never retrains and still holds 0.90 has no
    # finite ratio (the VM's bill over nothing): seed 2 on MovieLens' first 15,000 events.
    assert low <= ratio["mean"] <= high and 2 <= ratio["seeds_reaching"] <= 3
    report = Path(result["report"])
    assert "## Headline" in report.read_text()
    for name in ("policies_fig7_retrain_time.png", "policies_fig8_cost_accuracy.png"):
        assert (report.parent / name).read_bytes().startswith(b"\x89PNG")


def test_the_cli_passes_minutes_and_report_only_to_benches_that_take_them() -> None:
    runner = CliRunner()
    answer = runner.invoke(app, ["bench", "drift", "--minutes", "3"])
    assert answer.exit_code != 0 and "takes no minutes" in answer.output
    answer = runner.invoke(app, ["bench", "drift", "--stream", "generated"])
    assert answer.exit_code != 0 and "takes no stream" in answer.output


@pytest.mark.slow
def test_the_cli_prints_one_json_object_last(tmp_path: Path) -> None:
    runner = CliRunner()
    answer = runner.invoke(
        app,
        ["bench", "policies", "--json", "--limit", "6000", "--seeds", "1", "--minutes", "6"],
    )
    assert answer.exit_code == 0, answer.output
    parsed = json.loads(answer.output.strip().splitlines()[-1])
    assert set(parsed["headline"]) >= HEADLINE


def test_recovery_is_compared_as_seconds_summed_over_seeds_and_a_tie_is_no_loss() -> None:
    from benchmarks.bench.policies import pooled_ratio

    # A seed where adwin never fell behind counts for cost-aware's seconds, not out.
    pooled = pooled_ratio([100.0, 50.0, 90.0], [0.0, 50.0, 30.0])
    assert pooled["mean"] == pytest.approx(3.0) and pooled["seeds_reaching"] == 3
    low, high = pooled["ci95"]
    assert low <= 3.0 <= high
    # Neither fell behind on any seed: nothing to compare, not a ratio of 0.
    assert pooled_ratio([0.0, 0.0], [0.0, 0.0]) == {
        "mean": None,
        "ci95": None,
        "seeds_reaching": 0,
        "note": "tie: neither fell behind",
    }
    assert pooled_ratio([0.0, 0.0], [12.0, 0.0])["mean"] == 0.0  # cost-aware never did


def test_the_generated_stream_brings_each_trace_arrival_as_one_event() -> None:
    from benchmarks.policy_eval.stream import DRIFT_FRACTIONS, generated, true_arrivals
    from benchmarks.traces import make_trace

    trace = make_trace("berkeley", seed=1, period_s=240)  # four minutes: ~18,000 arrivals
    onsets_s = tuple(f * 240 for f in DRIFT_FRACTIONS)
    laid = generated()(trace, 1, onsets_s)
    count = true_arrivals(trace)
    assert count == round(trace.cumulative(240)) and abs(count - 74.95 * 240) < 1
    assert len(laid.stream) == laid.times.size == count and laid.weight == 1.0
    assert 0 < laid.times[0] < laid.times[-1] < 240 and (np.diff(laid.times) > 0).all()
    for onset, at in zip(laid.onsets, onsets_s, strict=True):  # the first event from then
        assert laid.times[onset - 1] < at <= laid.times[onset]
    # Capped, each event stands for the arrivals it replaces.
    capped = generated(limit=3_000)(trace, 1, onsets_s)
    assert len(capped.stream) == 3_000 and capped.weight == pytest.approx(count / 3_000)


def test_a_policies_run_on_the_generated_stream_reports_recovery_at_the_true_rate() -> None:
    from benchmarks.bench.policies import run_policies
    from benchmarks.policy_eval.stream import true_arrivals
    from benchmarks.traces import make_trace

    result = run_policies(stream="generated", seeds=1, minutes=6, traces=("berkeley",))
    laid = result["setup"]["traces"]["berkeley"]
    assert result["setup"]["stream"] == "generated"
    assert laid["events"] == true_arrivals(make_trace("berkeley", seed=0, period_s=360))
    assert laid["weight"] == 1.0
    block = result["traces"]["berkeley"]
    for policy in ("adwin", "cost-aware"):
        figures = block[policy]["sim"]
        assert 0.0 <= figures["recovery_s"] <= 240 and 0.0 <= figures["reaction_s"] <= 240
    assert block["adwin"]["sim"]["jobs"] >= 1  # the detector saw a drift
    recovery = result["comparisons"]["berkeley"]["recovery_speedup_vs_cost_aware"]
    assert recovery["mean"] is not None or recovery["note"]


def test_the_generated_stream_reads_no_dataset(tmp_path: Path) -> None:
    from benchmarks.bench.policies import run_policies

    with pytest.raises(ValueError, match="reads no dataset"):
        run_policies(dataset=tmp_path / "ratings.csv", stream="generated", traces=())
    with pytest.raises(ValueError, match="unknown stream"):
        run_policies(stream="recorded", traces=())
