"""``bench store`` times the SQLite store, alone and beside a retrain, with its baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

import service.store.events as event_store
from benchmarks.bench.store import LEGS, run_store
from tests.support.synthetic import stationary_stream, write_ratings_tsv


def test_each_insert_is_timed_quiet_and_beside_a_retrain(tmp_path: Path) -> None:
    dataset = write_ratings_tsv(tmp_path / "ratings.tsv", stationary_stream(n_events=4_000, seed=5))
    kept = event_store._sqlite_insert_rows
    figures = run_store(dataset=dataset)
    assert event_store._sqlite_insert_rows is kept  # the baseline was swapped back
    assert figures["events_per_stretch"] == 800
    for insert, condition in LEGS:
        store = figures[f"{insert}_{condition}_store_us_per_event"]
        assert 0 < store < figures[f"{insert}_{condition}_ingest_us_per_event"]
    for condition in ("quiet", "beside_retrain"):
        assert figures[f"{condition}_store_speedup"] == pytest.approx(
            figures[f"executemany_{condition}_store_us_per_event"]
            / figures[f"multi_row_{condition}_store_us_per_event"],
            abs=0.01,
        )
