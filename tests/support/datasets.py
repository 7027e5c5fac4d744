"""MovieLens for tests that replay it: the copy a run finds, or its generated stand-in.

No data set ships with Driftline (``benchmarks.datasets.registry``). CI points
``DRIFTLINE_DATASETS`` at its shared copy; elsewhere these helpers fall back to the
stream generated from the MovieLens fit, or skip a test that needs the real data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench.prequential import pipeline_events
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings, resolve
from service.store.events import NewEvent

__all__ = ["movielens_events", "movielens_file", "movielens_or_generated", "ratings_file"]


def movielens_or_generated(limit: int | None = None) -> RatingStream:
    """MovieLens ml-latest-small in timestamp order, or the generated stream like it."""
    return open_ratings(limit=limit)[0]


def movielens_events(start: int, stop: int) -> list[NewEvent]:
    """Events ``start``..``stop`` of ``movielens_or_generated`` as the pipeline takes
    them, with the benchmarks' stable ids (``ev-<position>``)."""
    return pipeline_events(movielens_or_generated(limit=stop), start, stop)


def movielens_file() -> Path:
    """The MovieLens ratings file a run finds; skips the test when there is none."""
    found = resolve()
    if found.ratings is None:
        pytest.skip(found.describe())
    return found.ratings


def ratings_file(folder: Path, limit: int | None = None) -> Path:
    """A ratings file to replay: MovieLens where found, else the generated stream as CSV."""
    found = resolve()
    if found.ratings is not None:
        return found.ratings
    stream = movielens_or_generated(limit)
    path = folder / "generated.csv"
    rows = zip(stream.user_ids, stream.item_ids, stream.ratings.tolist(), strict=True)
    stamps = stream.timestamps.tolist()
    lines = [f"{u},{i},{r},{t!r}" for (u, i, r), t in zip(rows, stamps, strict=True)]
    path.write_text("userId,movieId,rating,timestamp\n" + "\n".join(lines) + "\n")
    return path
