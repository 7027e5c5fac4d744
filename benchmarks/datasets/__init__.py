"""Rating streams from files: MovieLens CSV or tab-separated ``user item rating timestamp``.

Replays need events in timestamp order; ties keep file order (a stable sort), so a
replay is the same stream every time. No data set ships with Driftline: where one is
found, or fetched, is :mod:`benchmarks.datasets.registry`.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class RatingStream:
    """``n`` ratings as parallel columns, in timestamp order."""

    user_ids: list[str]
    item_ids: list[str]
    ratings: np.ndarray
    timestamps: np.ndarray

    def __len__(self) -> int:
        return len(self.user_ids)

    def head(self, n: int | None) -> RatingStream:
        if n is None or n >= len(self):
            return self
        return RatingStream(
            self.user_ids[:n], self.item_ids[:n], self.ratings[:n], self.timestamps[:n]
        )

    def events(self, start: int = 0, stop: int | None = None, prefix: str = "ev") -> list[dict]:
        """API-ready events with ids stable across replays (so a replay is idempotent)."""
        stop = len(self) if stop is None else min(stop, len(self))
        return [
            {
                "event_id": f"{prefix}-{i}",
                "user_id": self.user_ids[i],
                "item_id": self.item_ids[i],
                "rating": float(self.ratings[i]),
                "timestamp": float(self.timestamps[i]),
            }
            for i in range(start, stop)
        ]


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _rows(path: Path) -> Iterator[list[str]]:
    with _open_text(path) as handle:
        first = handle.readline()
        if not first:
            return
        delimiter = "\t" if "\t" in first else ","
        header = [c.strip() for c in first.strip().split(delimiter)]
        if not _is_movielens_header(header):
            yield header
        yield from csv.reader(handle, delimiter=delimiter)


def _is_movielens_header(cells: list[str]) -> bool:
    return cells[:4] == ["userId", "movieId", "rating", "timestamp"]


def load_ratings(path: Path | str, limit: int | None = None) -> RatingStream:
    """Read a ratings file and return it sorted by timestamp.

    Raises ``ValueError`` naming the line of the first malformed row.
    """
    path = Path(path)
    users, items, ratings, stamps = [], [], [], []
    for line, row in enumerate(_rows(path), start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 4:
            raise ValueError(f"{path}: row {line} has {len(row)} columns, expected 4")
        try:
            ratings.append(float(row[2]))
            stamps.append(float(row[3]))
        except ValueError as exc:
            raise ValueError(f"{path}: row {line}: {exc}") from exc
        users.append(row[0].strip())
        items.append(row[1].strip())
    order = np.argsort(np.asarray(stamps), kind="stable")
    stream = RatingStream(
        [users[i] for i in order],
        [items[i] for i in order],
        np.asarray(ratings)[order],
        np.asarray(stamps)[order],
    )
    return stream.head(limit)


def load_titles(path: Path | str) -> dict[str, str]:
    """movieId → title, for showing recommendations to people."""
    with _open_text(Path(path)) as handle:
        return {row["movieId"]: row["title"] for row in csv.DictReader(handle)}
