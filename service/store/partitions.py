"""Archived partitions of the event log: Parquet objects in the object store.

A partition holds a run of the log's rows exactly as ``events`` held them, in id order,
under ``events/archive/<first id>-<last id>.parquet`` (ids zero-padded to 20 digits, so
keys sort in log order). The columns are those of the table: ``id`` (int64),
``event_id``, ``user_id``, ``item_id`` (strings), ``rating``, ``timestamp`` (float64,
null where the event had none) and ``ingested_at`` (float64), zstd-compressed. Its
SHA-256 is recorded in ``event_archives`` and checked whenever it is read back.

Parquet, not the artifacts' ``.npz``: the archive is the one part of Driftline's data
that other tools read (DuckDB, Spark, pandas open it as it is).
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from functions.artifacts import sha256_hex
from functions.objectstore import ObjectNotFound, ObjectStore, validate_key
from service.store.archives import Partition
from service.store.events import LabelledEvents, lowest_ranks

#: Object store prefix of the archived partitions.
ARCHIVE_PREFIX = "events/archive/"

#: The columns of a partition, as ``events`` has them and in a row's order.
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("rating", pa.float64()),
        pa.field("timestamp", pa.float64()),
        pa.field("ingested_at", pa.float64(), nullable=False),
    ]
)
#: The columns of a row of ``events.log_rows``, in its order.
_LOG_COLUMNS = ("id", "user_id", "item_id", "rating", "timestamp", "event_id", "ingested_at")


class ArchiveError(RuntimeError):
    """An archived partition that cannot be read: missing or not what was recorded."""


def partition_key(first_id: int, last_id: int) -> str:
    """``events/archive/<first_id>-<last_id>.parquet``, ids padded to 20 digits.

    >>> partition_key(1, 5000)
    'events/archive/00000000000000000001-00000000000000005000.parquet'
    """
    return validate_key(f"{key_prefix(first_id)}{last_id:020d}.parquet")


def key_prefix(first_id: int) -> str:
    """What every key of a partition starting at ``first_id`` starts with."""
    return f"{ARCHIVE_PREFIX}{first_id:020d}-"


def encode(rows: ArchivedRows) -> bytes:
    """A partition's Parquet bytes."""
    sink = io.BytesIO()
    pq.write_table(rows.table, sink, compression="zstd")
    return sink.getvalue()


def decode(data: bytes) -> ArchivedRows:
    """The rows of a partition's Parquet bytes."""
    return ArchivedRows(pq.read_table(io.BytesIO(data), schema=SCHEMA))


@dataclass(frozen=True)
class ArchivedRows:
    """A partition's rows (``n`` of them, in id order) with reads by id range."""

    table: pa.Table

    @classmethod
    def of(cls, rows: Sequence[Sequence]) -> ArchivedRows:
        """``rows``: (id, event id, user, item, rating, timestamp, ingested at) tuples in
        id order, as the archiver reads them from ``events``."""
        columns: list[Sequence] = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
        arrays = [
            pa.array(values, type=field.type) for values, field in zip(columns, SCHEMA, strict=True)
        ]
        return cls(pa.Table.from_arrays(arrays, schema=SCHEMA))

    @property
    def ids(self) -> np.ndarray:
        return self.table.column("id").to_numpy()

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def labelled_count(self) -> int:
        return len(self) - int(self.table.column("rating").null_count)

    def ingested_at(self, row: int) -> float:
        """When the event at position ``row`` was stored."""
        return float(self.table.column("ingested_at")[row].as_py())

    def between(self, after_id: int, up_to_id: int | None) -> ArchivedRows:
        """The rows with ``after_id < id <= up_to_id``."""
        ids = self.ids
        start = int(np.searchsorted(ids, after_id, side="right"))
        stop = len(ids) if up_to_id is None else int(np.searchsorted(ids, up_to_id, "right"))
        return ArchivedRows(self.table.slice(start, max(0, stop - start)))

    def labelled(self) -> LabelledEvents:
        """The labelled rows as columns."""
        return _columns(self.table.filter(pa.array(self._labelled_mask())))

    def lowest(self, size: int, seed: int) -> LabelledEvents:
        """The labelled rows ranked lowest by ``events.uniform_labelled``'s hash for
        ``seed``, ``size`` of them, as columns: ranked before their strings are read."""
        ids = self.ids[self._labelled_mask()]
        kept = np.sort(lowest_ranks(ids, size, seed))
        return _columns(self.table.take(pa.array(np.searchsorted(self.ids, kept))))

    def _labelled_mask(self) -> np.ndarray:
        return pc.is_valid(self.table.column("rating")).to_numpy(zero_copy_only=False)

    def log_rows(self, limit: int | None = None) -> list[tuple]:
        """The rows as ``events.log_rows`` gives them, the first ``limit`` of them."""
        table = self.table if limit is None else self.table.slice(0, limit)
        columns = [table.column(name).to_pylist() for name in _LOG_COLUMNS]
        return list(zip(*columns, strict=True))


def _columns(kept: pa.Table) -> LabelledEvents:
    """``kept``'s rows (all labelled) as columns."""
    return LabelledEvents(
        ids=kept.column("id").to_numpy(),
        user_ids=kept.column("user_id").to_pylist(),
        item_ids=kept.column("item_id").to_pylist(),
        ratings=kept.column("rating").to_numpy(),
    )


class PartitionReader:
    """Reads partitions from the object store, checked against their records, keeping
    the ``cached`` most recently read (a reader walks a partition a page at a time).

    Thread-safe; a partition is immutable once recorded, so a cached one never goes stale.
    """

    def __init__(self, store: ObjectStore, cached: int = 2) -> None:
        self.store = store
        self.cached = cached
        self._rows: OrderedDict[str, ArchivedRows] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, partition: Partition) -> ArchivedRows:
        with self._lock:
            if (found := self._rows.get(partition.key)) is not None:
                self._rows.move_to_end(partition.key)
                return found
        rows = self._fetch(partition)
        with self._lock:
            self._rows[partition.key] = rows
            while len(self._rows) > self.cached:
                self._rows.popitem(last=False)
        return rows

    def _fetch(self, partition: Partition) -> ArchivedRows:
        try:
            data = self.store.get(partition.key)
        except ObjectNotFound as exc:
            raise ArchiveError(f"archived partition {partition.key} is missing") from exc
        if sha256_hex(data) != partition.checksum:
            raise ArchiveError(f"archived partition {partition.key} fails its checksum")
        rows = decode(data)
        if len(rows) != partition.events:
            raise ArchiveError(
                f"archived partition {partition.key} holds {len(rows)} events, "
                f"{partition.events} were recorded"
            )
        return rows
