"""The drift monitor's snapshot: one row per replica, replaced with every heartbeat write.

The state is plain JSON (ADWIN's heartbeats, the partial heartbeat's sums), never a
pickle, so reading it back cannot run code even if the database were tampered with.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from sqlalchemy import JSON, Connection, String, cast, insert, select, type_coerce, update
from sqlalchemy.sql.elements import ColumnElement

from service.store.tables import monitor_state


def save_monitor_state(
    conn: Connection, replica: int, model_version: str | None, state: dict[str, Any]
) -> None:
    """Replace ``replica``'s snapshot; call it in the transaction that writes the
    heartbeats ``state`` accounts for, so the two never disagree after a crash.

    The row is updated in place (inserted the first time), one statement per heartbeat.
    """
    values = {"saved_at": time.time(), "model_version": model_version}
    changed = conn.execute(
        update(monitor_state)
        .where(monitor_state.c.replica == replica)
        .values(**values, state=_json(conn, state))
    )
    if not changed.rowcount:
        conn.execute(insert(monitor_state).values(replica=replica, **values, state=state))


def _json(conn: Connection, state: dict[str, Any]) -> ColumnElement[Any] | dict[str, Any]:
    """``state`` as the JSON column's value, encoded with orjson where the column holds
    text (SQLite) or takes text cast to JSON (PostgreSQL): the snapshot is about 100 kB
    of base64 written with every heartbeat, which the standard encoder took most of a
    millisecond over. Other databases, and a state orjson does not take (numpy scalars),
    get the dictionary, encoded as usual."""
    backend = conn.dialect.name
    if backend not in ("sqlite", "postgresql"):
        return state
    try:
        encoded = orjson.dumps(state).decode("utf-8")
    except TypeError:
        return state
    text = type_coerce(encoded, String)
    return text if backend == "sqlite" else cast(text, JSON)


def load_monitor_state(conn: Connection, replica: int) -> dict[str, Any] | None:
    """``{"model_version", "state"}`` as ``replica`` last saved it, or None."""
    query = select(monitor_state).where(monitor_state.c.replica == replica)
    row = conn.execute(query).first()
    if row is None:
        return None
    return {"model_version": row.model_version, "state": dict(row.state)}
