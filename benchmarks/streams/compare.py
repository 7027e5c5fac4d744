"""``driftline bench generator``: the generated stream beside MovieLens.

A stream generated from the fit, as long as the data set (or ``limit``), against the
data set itself when one is found (``benchmarks.datasets.registry``), or against the
figures the fit recorded of it when none is: the rating histogram (total variation
distance), the popularity and activity curves (Gini, top-1 % share, quantiles), and
the prequential RMSE and hit-rate@10 that Driftline and river's ``BiasedMF`` reach on
each (``driftline bench prequential``'s run). Last, how fast the generator draws
events, and how fast it writes them as CSV.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.datasets import RatingStream, load_ratings
from benchmarks.datasets.registry import resolve
from benchmarks.streams.generator import GeneratorConfig, StreamGenerator, generate_stream
from benchmarks.streams.params import load_fit
from benchmarks.streams.stats import compare, stream_statistics
from benchmarks.streams.writer import write_file

__all__ = ["generator_speed", "prequential_figures", "run_generator"]

PREQUENTIAL_KEYS = ("driftline_rmse", "river_rmse", "static_rmse")
HIT_RATE_KEYS = ("driftline_hit_rate", "river_hit_rate")


def prequential_figures(stream: RatingStream, batch_size: int) -> dict[str, float]:
    """``driftline bench prequential``'s accuracy figures on ``stream``."""
    from benchmarks.bench.prequential import run_prequential

    with tempfile.TemporaryDirectory(prefix="driftline-generator-") as tmp:
        path = Path(tmp) / "ratings.tsv"
        columns = (stream.ratings.tolist(), stream.timestamps.tolist())
        rows = zip(stream.user_ids, stream.item_ids, *columns, strict=True)
        path.write_text("".join(f"{u}\t{i}\t{r!r}\t{t!r}\n" for u, i, r, t in rows))
        figures = run_prequential(dataset=path, batch_size=batch_size)
    return {key: round(float(figures[key]), 4) for key in PREQUENTIAL_KEYS + HIT_RATE_KEYS}


def generator_speed(events: int = 1_000_000, seed: int = 1) -> dict[str, float]:
    """Events per second drawn (columns in memory) and written (CSV to a file)."""
    config = GeneratorConfig(events=events, seed=seed, drift="sudden")
    began = time.perf_counter()
    drawn = sum(len(chunk) for chunk in StreamGenerator(config))
    drawn_s = time.perf_counter() - began
    with tempfile.TemporaryDirectory(prefix="driftline-generator-") as tmp:
        written = write_file(StreamGenerator(config), Path(tmp) / "s.csv", "csv", "g")
    return {
        "speed_events": drawn,
        "drawn_events_per_s": round(drawn / drawn_s),
        "csv_events_per_s": round(written.achieved_rate),
    }


def run_generator(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    prequential: bool = True,
    speed_events: int = 1_000_000,
) -> dict[str, Any]:
    fit = load_fit()
    found = resolve(dataset)
    real = None if found.ratings is None else load_ratings(found.ratings, limit=limit)
    # Curves depend on a stream's length: against the fit's own figures, compare a
    # stream as long as the data set was; ``limit`` then shortens the prequential runs.
    events = len(real) if real is not None else fit.events
    generated = generate_stream(GeneratorConfig(events=events, seed=0, fit=fit))
    ours = stream_statistics(generated)
    theirs = stream_statistics(real) if real is not None else fit.reference
    result: dict[str, Any] = {
        "dataset": found.label if real is not None else f"{fit.source} (the fit's figures)",
        "events": events,
        "generated": ours,
        "real": theirs,
        **compare(ours, theirs),
    }
    if prequential:
        result["generated_prequential"] = prequential_figures(generated.head(limit), batch_size)
        if real is not None:
            result["real_prequential"] = prequential_figures(real, batch_size)
    if speed_events:
        result.update(generator_speed(speed_events))
    return result
