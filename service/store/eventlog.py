"""The event log as one sequence: its archived partitions, then the ``events`` table.

Event retention (``service.store.retention``) moves the log's oldest events to the object
store. Whatever reads further back than the table reaches reads through ``EventLog``,
which gives the same events, in the same order and the same batches, as the table gave
before they were archived: a retraining window and its history sample
(``service.retraining``), a version's fold-in replay (``service.serving.builder``), and
a replica applying the log behind the archive's boundary (``service.wiring``).

Events at or before the boundary come from the archive, the rest from the table. The
reader never locks anything against the archiver: it reads the boundary, reads the
table after it, and reads the boundary again. Events are deleted only once the partition
holding them is recorded, which moves the boundary past them; so an unchanged boundary
means no event the table read covered was deleted under it. A moved one (partitions
recorded meanwhile, from ``b0`` to ``b1``) means only the events in ``(b0, b1]`` may be
missing from what the table gave: they are read again from those partitions, which are
written once, and everything after ``b1`` was still in the table when it was read. So a
long read (a retraining window of millions of events while the archiver keeps pace with
the stream) is patched, never read again from the start. Short reads (``log_after``'s
pages) simply read again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from sqlalchemy import Connection

from functions.objectstore import ObjectStore
from service.store import archive_sample, archives
from service.store.events import (
    LabelledEvents,
    LogBatch,
    batches_of,
    labelled_events,
    log_rows,
    uniform_labelled,
)
from service.store.partitions import PartitionReader

#: Events of a page of ``log_after``, as ``service.store.events`` pages them.
PAGE_EVENTS = 5_000

T = TypeVar("T")


class EventLog:
    """Reads of the event log across the archive and the table; each takes the
    caller's connection to the database, and the archive comes from ``store``."""

    def __init__(self, store: ObjectStore, cached_partitions: int = 2) -> None:
        self.store = store
        self.reader = PartitionReader(store, cached_partitions)

    def labelled(
        self, conn: Connection, after_id: int = 0, up_to_id: int | None = None
    ) -> LabelledEvents:
        """Labelled events with ``after_id < id <= up_to_id``, in log order
        (``events.labelled_events`` over the whole log)."""

        def archived(lower: int, upper: int) -> LabelledEvents:
            start, end = max(after_id, lower), _lower(up_to_id, upper)
            if start >= end:
                return LabelledEvents.from_rows([])
            return LabelledEvents.concat_all(
                [
                    self.reader.read(p).between(start, end).labelled()
                    for p in archives.partitions(conn, start, end)
                ]
            )

        def read(boundary: int) -> LabelledEvents:
            table = labelled_events(conn, max(after_id, boundary), up_to_id)
            return LabelledEvents.concat_all([archived(0, boundary), table])

        return _patched(conn, read, archived, _splice)

    def log_after(
        self,
        conn: Connection,
        after_id: int,
        up_to_id: int | None = None,
        limit: int = PAGE_EVENTS,
    ) -> list[LogBatch]:
        """``events.log_after`` over the whole log: about ``limit`` events after
        ``after_id``, none past ``up_to_id``, in the batches that stored them."""

        def read(boundary: int) -> list[LogBatch]:
            if after_id >= boundary:
                return batches_of(log_rows(conn, after_id, up_to_id, limit), limit)
            rows: list[Sequence] = []
            end = _lower(up_to_id, boundary)
            for partition in archives.partitions(conn, after_id, end):
                found = self.reader.read(partition).between(after_id, end)
                rows += found.log_rows(limit - len(rows))
                if len(rows) == limit:
                    return batches_of(rows, limit)
            if up_to_id is None or up_to_id > boundary:
                rows += log_rows(conn, boundary, up_to_id, limit - len(rows))
            return batches_of(rows, limit)

        return _stable(conn, read)

    def uniform_sample(
        self, conn: Connection, up_to_id: int, size: int, seed: int
    ) -> LabelledEvents:
        """``events.uniform_labelled`` over the whole log: the same ``size`` events,
        drawn from the archive's lowest ranks and the table's. The archive's come from
        its stored sample where one answers (``service.store.archive_sample``), else
        from each partition's lowest ranks."""
        if size <= 0 or up_to_id <= 0:
            return LabelledEvents.from_rows([])

        def archived(lower: int, upper: int) -> LabelledEvents:
            end = min(up_to_id, upper)
            drawn = LabelledEvents.from_rows([])
            if lower >= end:
                return drawn
            for partition in archives.partitions(conn, lower, end):
                found = self.reader.read(partition).between(lower, end).lowest(size, seed)
                drawn = archive_sample.lowest(LabelledEvents.concat_all([drawn, found]), size, seed)
            return drawn

        def whole_archive(boundary: int) -> LabelledEvents:
            if boundary == 0:
                return LabelledEvents.from_rows([])
            stored = archive_sample.draw(self.store, seed, boundary, up_to_id, size)
            return archived(0, boundary) if stored is None else stored

        def read(boundary: int) -> LabelledEvents:
            table = uniform_labelled(conn, up_to_id, size, seed, after_id=boundary)
            both = LabelledEvents.concat_all([whole_archive(boundary), table])
            return archive_sample.lowest(both, size, seed)

        def merge(
            kept: LabelledEvents, lower: int, upper: int, patch: LabelledEvents
        ) -> LabelledEvents:
            return archive_sample.lowest(_splice(kept, lower, upper, patch), size, seed)

        return _patched(conn, read, archived, merge)


def _stable(conn: Connection, read: Callable[[int], T]) -> T:
    """``read(boundary)`` again until the boundary stays put across it."""
    while True:
        boundary = archives.boundary(conn)
        found = read(boundary)
        if archives.boundary(conn) == boundary:
            return found


def _patched(
    conn: Connection,
    read: Callable[[int], LabelledEvents],
    archived: Callable[[int, int], LabelledEvents],
    merge: Callable[[LabelledEvents, int, int, LabelledEvents], LabelledEvents],
) -> LabelledEvents:
    """``read(boundary)``; if the boundary moved from ``b0`` to ``b1`` meanwhile, the
    events in ``(b0, b1]`` replaced by ``archived(b0, b1)`` (see the module docstring)
    through ``merge(found, b0, b1, archived)``. Later moves change nothing: every event
    after ``b1`` was in the table when the read passed it."""
    boundary = archives.boundary(conn)
    found = read(boundary)
    moved = archives.boundary(conn)
    if moved == boundary:
        return found
    return merge(found, boundary, moved, archived(boundary, moved))


def _splice(found: LabelledEvents, lower: int, upper: int, patch: LabelledEvents) -> LabelledEvents:
    """``found`` (in id order) with its events in ``(lower, upper]`` replaced by
    ``patch``'s."""
    start = int(np.searchsorted(found.ids, lower, side="right"))
    stop = int(np.searchsorted(found.ids, upper, side="right"))
    return LabelledEvents.concat_all(
        [_slice(found, 0, start), patch, _slice(found, stop, len(found))]
    )


def _slice(events: LabelledEvents, start: int, stop: int) -> LabelledEvents:
    return LabelledEvents(
        ids=events.ids[start:stop],
        user_ids=events.user_ids[start:stop],
        item_ids=events.item_ids[start:stop],
        ratings=events.ratings[start:stop],
    )


def _lower(up_to_id: int | None, boundary: int) -> int:
    return boundary if up_to_id is None else min(up_to_id, boundary)
