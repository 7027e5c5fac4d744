"""Fitting the generator to a ratings file: parameters only, and a stream like the data."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.datasets import load_ratings
from benchmarks.streams import DEFAULT_FIT, GeneratorConfig, generate_stream, load_fit
from benchmarks.streams.fit import fit_ratings
from benchmarks.streams.stats import compare, stream_statistics
from tests.support.synthetic import stationary_stream


def test_a_fit_is_parameters_that_make_a_stream_like_its_data(tmp_path: Path) -> None:
    rows = stationary_stream(n_users=150, n_items=300, n_events=6_000, seed=2)
    path = tmp_path / "ratings.tsv"
    path.write_text(
        "".join(f"{e['user_id']}\t{e['item_id']}\t{e['rating']}\t{e['timestamp']}\n" for e in rows)
    )
    fit = fit_ratings(path, factors=4, source="synthetic")
    fit.save(tmp_path / "fit.json")
    assert load_fit(tmp_path / "fit.json") == fit
    text = (tmp_path / "fit.json").read_text()
    assert "u1" not in text and "i1" not in text  # no id of the source survives
    ours = stream_statistics(generate_stream(GeneratorConfig(events=6_000, fit=fit)))
    theirs = stream_statistics(load_ratings(path))
    assert compare(ours, theirs)["histogram_tv_distance"] < 0.1
    assert abs(ours["rating_mean"] - theirs["rating_mean"]) < 0.15


def test_the_shipped_fit_is_small_and_names_its_source() -> None:
    document = json.loads(DEFAULT_FIT.read_text())
    assert DEFAULT_FIT.stat().st_size < 16_000  # distributions, not data
    assert document["source"].startswith("MovieLens ml-latest-small")
    assert document["events"] == 100_836 and document["factors"] == 8
