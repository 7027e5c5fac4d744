"""The drift monitor's snapshot: one row per replica, replaced with every heartbeat write.

The state is plain JSON (ADWIN's heartbeats, the partial heartbeat's sums), never a
pickle, so reading it back cannot run code even if the database were tampered with.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from sqlalchemy import JSON, Connection, String, bindparam, cast, insert, select, update
from sqlalchemy.sql.dml import Update

from service.store.tables import monitor_state


def _update(value: Any) -> Update:
    return (
        update(monitor_state)
        .where(monitor_state.c.replica == bindparam("key"))
        .values(saved_at=bindparam("at"), model_version=bindparam("version"), state=value)
    )


# Built once: a statement built per call spent longer in SQLAlchemy than in SQLite.
#: The state as text already encoded (SQLite keeps JSON as text; PostgreSQL casts it).
_UPDATE_ENCODED = {
    "sqlite": _update(bindparam("value", type_=String)),
    "postgresql": _update(cast(bindparam("value", type_=String), JSON)),
}
#: The state as a dictionary, encoded by the column's type.
_UPDATE = _update(bindparam("value", type_=JSON))


def save_monitor_state(
    conn: Connection, replica: int, model_version: str | None, state: dict[str, Any]
) -> None:
    """Replace ``replica``'s snapshot; call it in the transaction that writes the
    heartbeats ``state`` accounts for, so the two never disagree after a crash.

    The row is updated in place (inserted the first time), one statement per
    heartbeat. The snapshot is about 100 kB of base64 written with every heartbeat,
    which the standard JSON encoder took most of a millisecond over: on SQLite and
    PostgreSQL it is encoded with orjson (a state orjson refuses, holding numpy
    scalars, and other databases go through the column's own encoder).
    """
    params = {"key": replica, "at": time.time(), "version": model_version}
    statement = _UPDATE_ENCODED.get(conn.dialect.name)
    value: Any = state
    if statement is not None:
        try:
            value = orjson.dumps(state).decode("utf-8")
        except TypeError:
            statement = None
    changed = conn.execute(
        statement if statement is not None else _UPDATE, {**params, "value": value}
    )
    if not changed.rowcount:
        conn.execute(
            insert(monitor_state).values(
                replica=replica, saved_at=params["at"], model_version=model_version, state=state
            )
        )


def load_monitor_state(conn: Connection, replica: int) -> dict[str, Any] | None:
    """``{"model_version", "state"}`` as ``replica`` last saved it, or None."""
    query = select(monitor_state).where(monitor_state.c.replica == replica)
    row = conn.execute(query).first()
    if row is None:
        return None
    return {"model_version": row.model_version, "state": dict(row.state)}
