"""The ``driftline`` command line: argument checks in process, runs as real subprocesses."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.cli import app
from tests.support.synthetic import stationary_stream


def _driftline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _write_tsv(path: Path, n_events: int) -> Path:
    rows = stationary_stream(n_events=n_events, seed=5)
    lines = [f"{e['user_id']}\t{e['item_id']}\t{e['rating']}\t{int(e['timestamp'])}" for e in rows]
    path.write_text("\n".join(reversed(lines)) + "\n")  # out of order on purpose
    return path


@pytest.mark.slow
def test_bench_prequential_prints_one_json_object_last(tmp_path: Path) -> None:
    dataset = _write_tsv(tmp_path / "ratings.tsv", 3_000)
    result = _driftline("bench", "prequential", "--json", "--dataset", str(dataset))
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["events"] == 3_000
    for key in ("driftline_rmse", "river_rmse", "static_rmse"):
        assert 0.0 < figures[key] < 2.0, figures
    assert figures["retrains"] >= 1
    assert figures["driftline_events_per_s"] > 0 and figures["river_events_per_s"] > 0
    # The learning path is the ingest path less the store's transactions.
    assert figures["learning_path_events_per_s"] > figures["driftline_events_per_s"]
    assert figures["store_s"] > 0
    assert figures["learning_path_ratio_to_river"] == pytest.approx(
        figures["learning_path_events_per_s"] / figures["river_events_per_s"]
    )
    # The stages add up to the learning path; the shadow's parts lie inside two of them.
    stages = figures["learning_path_us_per_event"]
    whole = {key: us for key, us in stages.items() if not key.startswith("shadow_")}
    per_event = 1e6 / figures["learning_path_events_per_s"]
    assert sum(whole.values()) == pytest.approx(per_event, abs=0.01)  # rounded to 0.001
    assert all(us > 0 for key, us in whole.items() if key != "other"), stages
    assert 0 <= stages["shadow_fold_in"] < stages["fold_in"]
    assert 0 <= stages["shadow_ranking"] < stages["ranking"]


def test_bench_rejects_an_unknown_name_and_options_it_does_not_take() -> None:
    def error(*args: str) -> str:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 2, result.output
        return " ".join(result.output.replace("│", " ").split())  # unwrap rich's error box

    assert "unknown benchmark 'nonsense'" in error("bench", "nonsense", "--json")
    assert "bench prequential takes no workers" in error("bench", "prequential", "--workers", "3")


@pytest.mark.slow
def test_demo_runs_short_and_prints_the_summary() -> None:
    result = _driftline("demo", "--limit", "3000")
    assert result.returncode == 0, result.stdout + result.stderr
    for expected in ("RMSE Driftline", "RMSE river BiasedMF", "model versions", "Top 10"):
        assert expected in result.stdout


@pytest.mark.slow
def test_demo_through_kafka_stores_every_event() -> None:
    result = _driftline("demo", "--kafka", "--limit", "2000")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Kafka-protocol broker" in result.stdout
    assert "2,000" in result.stdout and "RMSE Driftline" in result.stdout


@pytest.mark.slow
def test_bench_ingest_measures_kafka_and_http(tmp_path: Path) -> None:
    dataset = _write_tsv(tmp_path / "ratings.tsv", 3_000)
    result = _driftline("bench", "ingest", "--json", "--dataset", str(dataset))
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["events"] == 3_000
    assert figures["kafka_2_replicas_events_per_s"] > 0
    for key in (
        "kafka_events_per_s",
        "kafka_read_only_events_per_s",
        "http_events_per_s",
        "store_only_events_per_s",
        "river_learn_events_per_s",
        "kafka_ratio_to_river",
        "http_ratio_to_river",
    ):
        assert figures[key] > 0, figures
    assert 0 < figures["http_p50_ms"] <= figures["http_p99_ms"]


@pytest.mark.slow
def test_bench_sync_compares_the_three_policies(tmp_path: Path) -> None:
    dataset = _write_tsv(tmp_path / "ratings.tsv", 2_000)
    # Small λ: the benchmark's own 64 and 256 take most of a minute.
    small = ("--workers", "4", "--simulated-workers", "8", "--simulated-workers", "16")
    result = _driftline("bench", "sync", "--json", "--dataset", str(dataset), *small)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["workers"] == 4 and "sim64_bsp_epochs" not in figures
    # Every policy reaches BSP's loss after 6 epochs well inside the 40 allowed (5 to 11
    # epochs here), on the local runtime and on the simulated one alike.
    for prefix in ("", "sim8_", "sim16_"):
        assert figures[f"{prefix}bsp_epochs"] == 6
        for policy in ("bsp", "asp", "selective"):
            assert figures[f"{prefix}{policy}_reached_target"], (prefix, policy)
            reached = figures[f"{prefix}{policy}_time_to_target_s"]
            assert 0 < reached <= figures[f"{prefix}{policy}_elapsed_s"]
            assert 1 <= figures[f"{prefix}{policy}_epochs"] < 40
            assert figures[f"{prefix}{policy}_cost_usd"] > 0
            assert 0 < figures[f"{prefix}{policy}_final_rmse"] < 2
        selective = figures[f"{prefix}selective_time_to_target_s"]
        for other in ("bsp", "asp"):
            expected = figures[f"{prefix}{other}_time_to_target_s"] / selective
            assert figures[f"{prefix}speedup_selective_vs_{other}"] == pytest.approx(expected)


def test_every_registered_benchmark_resolves_to_a_function_taking_the_common_options() -> None:
    from benchmarks.bench import BENCHMARKS

    for name, run in BENCHMARKS.items():
        parameters = inspect.signature(run).parameters
        assert {"dataset", "limit", "batch_size"} <= set(parameters), name
