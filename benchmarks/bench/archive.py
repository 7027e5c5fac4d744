"""A job window's history sample over a long archive: drawn from the archive's stored
sample against drawn from its partitions, and what keeping the sample costs the archiver.

``events`` synthetic events are stored in SQLite and archived to a file object store (the
newest ``PARTITION_ROWS`` stay in the table), with the archive's sample kept for the
default ``SEED`` and ``HISTORY_SAMPLE``, the archiver's rests left out so its work is
timed alone. Then the same uniform draw of ``HISTORY_SAMPLE`` events over the whole log
is timed from the stored sample, and again with the samples deleted, from the
partitions (the baseline: every read of a drift window before the archive kept its
sample); both must give the same events.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from functions.objectstore import FileObjectStore, ObjectStore
from service.settings import Settings, parse_retention
from service.store import Database
from service.store.archive_sample import SAMPLE_PREFIX
from service.store.archives import Partition
from service.store.eventlog import EventLog
from service.store.events import NewEvent, max_event_id, store_events
from service.store.partitions import ArchivedRows
from service.store.retention import PARTITION_ROWS, Archiver, RetentionOptions
from service.store.versions import add_version

#: Events stored per transaction while the log is filled.
_FILL_BATCH = 10_000


class _TimedArchiver(Archiver):
    """The archiver without its rests, timing the part that keeps the sample."""

    sample_s = 0.0

    def _write_sample(self, after: int, partition: Partition, rows: ArchivedRows) -> None:
        started = time.perf_counter()
        super()._write_sample(after, partition, rows)
        self.sample_s += time.perf_counter() - started

    def _rest(self, started: float) -> None:
        return None


def _fill(db: Database, events: int, seed: int = 0) -> None:
    """``events`` ratings of a million users and 10⁵ items, every tenth unlabelled."""
    rng = np.random.default_rng(seed)
    for start in range(0, events, _FILL_BATCH):
        count = min(_FILL_BATCH, events - start)
        users = rng.integers(0, 1_000_000, count)
        items = rng.integers(0, 100_000, count)
        stars = rng.integers(1, 6, count).astype(float)
        batch = [
            NewEvent(f"u{u}", f"i{i}", None if n % 10 == 9 else float(r), None, f"e{start + n}")
            for n, (u, i, r) in enumerate(zip(users, items, stars, strict=True))
        ]
        with db.begin() as conn:
            store_events(conn, batch)
    with db.begin() as conn:  # without a version nothing is archived
        add_version(
            conn,
            version="v0001",
            artifact_key="models/v0001/0.npz",
            checksum="0" * 64,
            last_event_id=1,
            n_users=1,
            n_items=1,
        )


def _draw(db: Database, store: ObjectStore, size: int, seed: int) -> tuple[float, list[int]]:
    """Seconds to draw the uniform sample over the whole log, and the ids drawn."""
    with db.connect() as conn:
        head = max_event_id(conn)
        started = time.perf_counter()
        found = EventLog(store).uniform_sample(conn, head, size, seed)
        return time.perf_counter() - started, found.ids.tolist()


def run_archive(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    events: int | None = None,
    partition_rows: int = PARTITION_ROWS,
    history_sample: int | None = None,
) -> dict[str, Any]:
    """The figures described in the module docstring; ``events`` defaults to 10⁶."""
    del dataset, limit, batch_size  # the log is synthetic
    n = events or 1_000_000
    defaults = Settings()
    size, seed = history_sample or defaults.history_sample, defaults.seed or 0
    with tempfile.TemporaryDirectory(prefix="driftline-archive-") as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'driftline.db'}")
        store = FileObjectStore(Path(tmp) / "objects")
        try:
            _fill(db, n)
            options = RetentionOptions(
                parse_retention(f"{partition_rows} events"),
                dedup_horizon_s=0.0,
                partition_rows=partition_rows,
                pause_s=0.0,
                sample_size=size,
                sample_seed=seed,
            )
            archiver = _TimedArchiver(db, store, options)
            started = time.perf_counter()
            run = archiver.run_once()
            archive_s = time.perf_counter() - started
            archived = run.boundary
            sample_keys = store.list(SAMPLE_PREFIX)
            sample_bytes = len(store.get(sample_keys[-1])) if sample_keys else 0
            from_sample_s, from_sample = _draw(db, store, size, seed)
            store.delete_prefix(SAMPLE_PREFIX)
            from_partitions_s, from_partitions = _draw(db, store, size, seed)
        finally:
            db.dispose()
    return {
        "events": n,
        "archived_events": archived,
        "partitions": len(run.partitions),
        "history_sample": size,
        "archive_s": round(archive_s, 2),
        "sample_upkeep_s": round(archiver.sample_s, 2),
        "sample_upkeep_us_per_event": round(1e6 * archiver.sample_s / max(archived, 1), 2),
        "sample_object_bytes": sample_bytes,
        "draw_from_sample_s": round(from_sample_s, 3),
        "draw_from_partitions_s": round(from_partitions_s, 3),
        "speedup": round(from_partitions_s / from_sample_s, 1) if from_sample_s else None,
        "same_events": from_sample == from_partitions,
    }
