"""The ``driftline`` command line as a user runs it: real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.synthetic import stationary_stream


def _driftline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
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


def test_bench_rejects_an_unknown_name() -> None:
    result = _driftline("bench", "nonsense", "--json")
    assert result.returncode != 0
    assert "unknown benchmark" in result.stderr


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
    two = figures["kafka_2_replicas_events_per_s"]
    assert two is None or two > 0  # None: the replicas finished before the clock started
    for key in (
        "kafka_events_per_s",
        "kafka_read_only_events_per_s",
        "http_events_per_s",
        "store_only_events_per_s",
    ):
        assert figures[key] > 0, figures
    assert 0 < figures["http_p50_ms"] <= figures["http_p99_ms"]


@pytest.mark.slow
def test_bench_sync_compares_the_three_policies(tmp_path: Path) -> None:
    dataset = _write_tsv(tmp_path / "ratings.tsv", 2_000)
    result = _driftline("bench", "sync", "--json", "--dataset", str(dataset))
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for policy in ("bsp", "asp", "selective"):
        assert figures[f"{policy}_epochs"] >= 1
        assert 0 < figures[f"{policy}_final_rmse"] < 2
        assert figures[f"{policy}_cost_usd"] > 0
    assert figures["bsp_time_to_target_s"] is not None  # BSP set the target itself
    for workers in (64, 256):  # the simulated rows: virtual seconds
        prefix = f"sim{workers}_"
        assert figures[f"{prefix}bsp_epochs"] == 6 and figures[f"{prefix}bsp_reached_target"]
        for policy in ("bsp", "asp", "selective"):
            reached = figures[f"{prefix}{policy}_time_to_target_s"]
            assert reached is None or 0 < reached <= figures[f"{prefix}{policy}_elapsed_s"]
            assert figures[f"{prefix}{policy}_cost_usd"] > 0
            assert 0 < figures[f"{prefix}{policy}_final_rmse"] < 2
        assert figures[f"{prefix}speedup_selective_vs_bsp"] > 0
