"""``driftline bench generator``: the generated stream's figures beside the data set's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_generator_prints_both_streams_figures_and_the_generator_speed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "bench", "generator", "--json", "--limit", "3000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 <= figures["histogram_tv_distance"] < 0.5
    for key in ("driftline_rmse", "river_rmse"):
        assert 0.0 < figures["generated_prequential"][key] < 2.0
    if "real_prequential" in figures:  # MovieLens found: the same run on it
        assert figures["real"]["events"] == figures["generated"]["events"] == 3_000
    else:  # the figures the fit recorded, beside a stream as long as MovieLens
        assert figures["real"]["events"] == figures["generated"]["events"] == 100_836
    assert figures["drawn_events_per_s"] > figures["csv_events_per_s"] > 10_000
