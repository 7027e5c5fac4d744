"""Reading rating files for replays and benchmarks."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from benchmarks.datasets import load_ratings, load_titles
from benchmarks.datasets.registry import resolve
from tests.support.datasets import movielens_file


def test_movielens_csv_is_read_in_timestamp_order(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,10,4.0,300\n2,20,3.5,100\n1,30,5,200\n")
    stream = load_ratings(path)
    assert stream.user_ids == ["2", "1", "1"]
    assert stream.item_ids == ["20", "30", "10"]
    assert list(stream.ratings) == [3.5, 5.0, 4.0]


def test_tab_separated_without_header_and_gzip(tmp_path: Path) -> None:
    path = tmp_path / "ratings.tsv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("7\t70\t2\t20\n8\t80\t1\t10\n")
    stream = load_ratings(path)
    assert stream.user_ids == ["8", "7"] and list(stream.timestamps) == [10.0, 20.0]


def test_equal_timestamps_keep_file_order(tmp_path: Path) -> None:
    path = tmp_path / "ratings.tsv"
    path.write_text("a\tx\t1\t5\nb\ty\t2\t5\nc\tz\t3\t5\n")
    assert load_ratings(path).user_ids == ["a", "b", "c"]


def test_malformed_rows_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("a\tx\t1\t5\nb\ty\tgood\t6\n")
    with pytest.raises(ValueError, match="row 2"):
        load_ratings(path)
    path.write_text("a\tx\t1\n")
    with pytest.raises(ValueError, match="3 columns"):
        load_ratings(path)


def test_events_have_stable_ids_so_replays_are_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "r.tsv"
    path.write_text("a\tx\t1\t5\nb\ty\t2\t6\n")
    stream = load_ratings(path)
    assert stream.events() == load_ratings(path).events()
    assert [e["event_id"] for e in stream.events(1)] == ["ev-1"]


def test_the_movielens_copy_a_run_finds_is_complete() -> None:
    path = movielens_file()
    stream = load_ratings(path)
    assert len(stream) == 100_836
    assert (stream.timestamps[1:] >= stream.timestamps[:-1]).all()
    titles = resolve().titles
    assert titles is not None and load_titles(titles)["1"] == "Toy Story (1995)"
