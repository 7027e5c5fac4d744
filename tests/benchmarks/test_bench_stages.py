"""``bench stages`` times each stage of the ingest path where it is called."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench.stages import STAGES, run_stages
from tests.support.synthetic import stationary_stream, write_ratings_tsv


def test_the_stages_add_up_to_the_path_and_river_is_beside_them(tmp_path: Path) -> None:
    dataset = write_ratings_tsv(tmp_path / "ratings.tsv", stationary_stream(n_events=4_000, seed=3))
    figures = run_stages(dataset=dataset)
    assert figures["events_timed"] == 3_200  # after the warm-up share
    stages = [figures[f"{stage}_us_per_event"] for stage in (*STAGES, "other")]
    for stage in ("store", "fold_in", "ranking", "popular", "monitor"):
        assert figures[f"{stage}_us_per_event"] > 0, stage
    assert sum(stages) == pytest.approx(figures["total_us_per_event"], abs=0.1)
    parts = figures["monitor_parts_us_per_event"]
    assert set(parts) == {"detector", "segments", "write"} and all(v > 0 for v in parts.values())
    assert sum(parts.values()) <= figures["monitor_us_per_event"]
    assert figures["river_events_per_s"] > 0
    assert figures["ratio_to_river"] == pytest.approx(
        figures["driftline_events_per_s"] / figures["river_events_per_s"]
    )
