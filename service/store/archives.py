"""The records of the event log's archived partitions (``event_archives``).

A partition is recorded once its object is written and before its events are deleted
from ``events`` (``service.store.retention``), so the newest recorded ``last_id``, the
*boundary*, splits the log in two: every event at or before it is read from the archive
(its rows may still be in ``events`` while they are being deleted), every event after it
from ``events``. Events after the boundary are never deleted, and the boundary only moves
forwards, which is what lets a reader check it after reading the table instead of
locking anything (``service.store.eventlog``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, RowMapping, func, insert, select, update

from service.store.tables import event_archives


@dataclass(frozen=True)
class Partition:
    """One archived partition: events ``first_id..last_id`` in the object ``key``."""

    first_id: int
    last_id: int
    key: str
    checksum: str
    size: int
    events: int
    labelled: int
    first_ingested_at: float
    last_ingested_at: float
    purged: bool = False


def boundary(conn: Connection) -> int:
    """The newest archived event id (0: nothing archived)."""
    return int(conn.scalar(select(func.max(event_archives.c.last_id))) or 0)


def partitions(conn: Connection, after_id: int = 0, up_to_id: int | None = None) -> list[Partition]:
    """The partitions holding events with ``after_id < id <= up_to_id``, oldest first."""
    query = select(event_archives).where(event_archives.c.last_id > after_id)
    if up_to_id is not None:
        query = query.where(event_archives.c.first_id <= up_to_id)
    rows = conn.execute(query.order_by(event_archives.c.first_id)).all()
    return [_partition(row._mapping) for row in rows]


def unpurged(conn: Connection) -> list[Partition]:
    """Recorded partitions whose events may still be in ``events``, oldest first."""
    query = (
        select(event_archives)
        .where(event_archives.c.purged_at.is_(None))
        .order_by(event_archives.c.first_id)
    )
    return [_partition(row._mapping) for row in conn.execute(query)]


def record(conn: Connection, partition: Partition) -> None:
    """Record ``partition`` as archived (its object is written; its rows not yet deleted)."""
    values = {k: v for k, v in asdict(partition).items() if k != "purged"}
    conn.execute(insert(event_archives).values(**values, archived_at=time.time()))


def mark_purged(conn: Connection, first_id: int) -> None:
    """The events of the partition starting at ``first_id`` have left ``events``."""
    conn.execute(
        update(event_archives)
        .where(event_archives.c.first_id == first_id)
        .values(purged_at=time.time())
    )


def archived_count(conn: Connection, up_to_id: int, *, labelled_only: bool = False) -> int:
    """Events (labelled ones with ``labelled_only``) of the partitions wholly at or
    before ``up_to_id``."""
    column = event_archives.c.labelled if labelled_only else event_archives.c.events
    query = select(func.coalesce(func.sum(column), 0)).where(event_archives.c.last_id <= up_to_id)
    return int(conn.scalar(query) or 0)


def _partition(values: RowMapping) -> Partition:
    return Partition(
        first_id=int(values["first_id"]),
        last_id=int(values["last_id"]),
        key=values["key"],
        checksum=values["checksum"],
        size=int(values["size"]),
        events=int(values["events"]),
        labelled=int(values["labelled"]),
        first_ingested_at=float(values["first_ingested_at"]),
        last_ingested_at=float(values["last_ingested_at"]),
        purged=values["purged_at"] is not None,
    )
