"""``driftline bench store``: what storing a batch costs on SQLite, alone and beside a
retrain in the same process.

The SQLite driver lets other threads run while it steps a statement, and a thread that
wants the interpreter back while another computes waits up to the switch interval
(5 ms). A store that runs one statement per row (``executemany``) pays that wait per
row whenever a retrain, the serving index's build or a request computes beside it;
the service stores a batch in a few multi-row statements instead
(``service.store.events``).

Both are timed in the same run, on the service's own pipeline (``Driftline.ingest``,
the store's transaction timed where it is called), over consecutive stretches of a
real stream: quiet, then beside an in-process retrain that runs back to back. The
baseline, ``executemany`` of the same rows in the same transaction, is swapped in for
its stretches. ``store_us_per_event`` is the store's transaction; ``ingest_us_per_event``
the whole call (store, evaluation, fold-in, monitor).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

import service.store.events as event_store
from benchmarks.bench.prequential import pipeline_events
from benchmarks.bench.stages import steady_pipeline
from benchmarks.datasets.registry import open_ratings
from benchmarks.stage_clock import StageClock
from service.wiring import Driftline

#: The share of the stream ingested, and trained on, before the timed stretches.
WARM_SHARE = 0.2
#: The timed stretches, in order: (insert, condition).
LEGS = (
    ("multi_row", "quiet"),
    ("executemany", "quiet"),
    ("multi_row", "beside_retrain"),
    ("executemany", "beside_retrain"),
)

_ROW_INSERT = (
    f"INSERT INTO events ({event_store._INSERT_COLUMNS}) VALUES (?,?,?,?,?,?) "
    f"{event_store._SKIP_STORED}"
)


def _executemany(conn: Connection, rows: list[tuple]) -> tuple[int, int]:
    """The baseline: one execution per row, by the driver's C loop."""
    stored = conn.exec_driver_sql(_ROW_INSERT, rows).rowcount
    return stored, event_store.max_event_id(conn)


@contextmanager
def _inserting_with(insert: str) -> Iterator[None]:
    if insert == "multi_row":
        yield
        return
    kept = event_store._sqlite_insert_rows
    event_store._sqlite_insert_rows = _executemany
    try:
        yield
    finally:
        event_store._sqlite_insert_rows = kept


@contextmanager
def _beside_retrain(pipeline: Driftline, condition: str) -> Iterator[None]:
    """A retrain after another in a thread of this process, for ``beside_retrain``."""
    if condition == "quiet":
        yield
        return
    running = threading.Event()
    running.set()

    def retrain() -> None:
        while running.is_set():
            pipeline.retrain_now("bench")

    thread = threading.Thread(target=retrain, name="bench-retrain", daemon=True)
    thread.start()
    time.sleep(0.5)  # into the first job
    try:
        yield
    finally:
        running.clear()
        thread.join()


def _timed(
    ingest: Callable[[int, int], None], clock: StageClock, first: int, last: int, size: int
) -> tuple[float, float]:
    clock.seconds.clear()
    began = time.perf_counter()
    for start in range(first, last, size):
        ingest(start, min(last, start + size))
    spent = time.perf_counter() - began
    events = last - first
    return clock.seconds["store"] / events * 1e6, spent / events * 1e6


def run_store(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 500
) -> dict[str, Any]:
    stream, found = open_ratings(dataset, limit=limit)
    warm = int(len(stream) * WARM_SHARE)
    leg_events = (len(stream) - warm) // len(LEGS)
    figures: dict[str, Any] = {
        "dataset": found.label,
        "batch_size": batch_size,
        "events_per_stretch": leg_events,
    }
    with tempfile.TemporaryDirectory(prefix="driftline-bench-store-") as tmp:
        pipeline = steady_pipeline(stream, Path(tmp), warm, batch_size)

        def ingest(start: int, stop: int) -> None:
            pipeline.ingest(pipeline_events(stream, start, stop))

        clock = StageClock()
        clock.wrap("store", pipeline.writer, "store_all")
        first = warm
        for insert, condition in LEGS:
            with _inserting_with(insert), _beside_retrain(pipeline, condition):
                store, whole = _timed(ingest, clock, first, first + leg_events, batch_size)
            figures[f"{insert}_{condition}_store_us_per_event"] = round(store, 2)
            figures[f"{insert}_{condition}_ingest_us_per_event"] = round(whole, 2)
            first += leg_events
        pipeline.db.dispose()
    for condition in ("quiet", "beside_retrain"):
        figures[f"{condition}_store_speedup"] = round(
            figures[f"executemany_{condition}_store_us_per_event"]
            / figures[f"multi_row_{condition}_store_us_per_event"],
            2,
        )
    return figures
