"""Consumer offsets and dead letters, written in the same transaction as the events.

Storing "the next offset to read" with the events it carried (as Flink and Spark do) is
what makes consumption exactly-once into the store: after any crash the store and the
offsets agree, and the consumer resumes from the offsets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.expression import ColumnElement

from service.store.tables import consumer_offsets, dead_letters

#: The dialect's INSERT with ON CONFLICT (both dialects' constructs have the same API).
_UPSERT: dict[str, Callable[[Table], Any]] = {
    "sqlite": sqlite.insert,
    "postgresql": postgresql.insert,
}


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be turned into an event, kept with why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: str


def load_offsets(conn: Connection, topic: str) -> dict[int, int]:
    """partition → next offset to read, for every partition consumed so far."""
    query = select(consumer_offsets.c.partition, consumer_offsets.c.next_offset).where(
        consumer_offsets.c.topic == topic
    )
    return {int(p): int(o) for p, o in conn.execute(query)}


def _larger(dialect: str, a: Any, b: Any) -> ColumnElement[Any]:
    """The larger of two values: GREATEST on PostgreSQL, two-argument MAX on SQLite."""
    return func.greatest(a, b) if dialect == "postgresql" else func.max(a, b)


def save_offsets(conn: Connection, topic: str, offsets: Mapping[int, int]) -> None:
    """Record ``partition → next offset``; run in the transaction that stored the events.

    An offset never moves backwards: during a rebalance the partition's old owner may
    commit a late batch after the new owner has stored a later one.
    """
    if not offsets:
        return
    dialect = conn.dialect.name
    insert = _UPSERT[dialect](consumer_offsets)
    now = time.time()
    statement = insert.on_conflict_do_update(
        index_elements=["topic", "partition"],
        set_={
            "next_offset": _larger(
                dialect, consumer_offsets.c.next_offset, insert.excluded.next_offset
            ),
            "updated_at": now,
        },
    )
    conn.execute(
        statement,
        [
            {"topic": topic, "partition": p, "next_offset": o, "updated_at": now}
            for p, o in offsets.items()
        ],
    )


def add_dead_letters(conn: Connection, letters: list[DeadLetter]) -> None:
    if letters:
        now = time.time()
        conn.execute(
            dead_letters.insert(),
            [
                {
                    "topic": d.topic,
                    "partition": d.partition,
                    "offset": d.offset,
                    "key": d.key,
                    "value": d.value,
                    "error": d.error,
                    "received_at": now,
                }
                for d in letters
            ],
        )


def count_dead_letters(conn: Connection) -> int:
    return int(conn.scalar(select(func.count()).select_from(dead_letters)) or 0)


def list_dead_letters(conn: Connection, limit: int = 100) -> list[dict]:
    query = select(dead_letters).order_by(dead_letters.c.id.desc()).limit(limit)
    return [dict(row._mapping) for row in conn.execute(query)]
