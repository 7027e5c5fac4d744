"""The drift monitor's snapshot: one row per replica, replaced with every heartbeat write.

The state is plain JSON (ADWIN's heartbeats, the partial heartbeat's sums), never a
pickle, so reading it back cannot run code even if the database were tampered with.
The detector's record of recent errors is saved apart, as it grows (``monitor_errors``,
raw float16 errors and uint16 user keys): each write adds the errors since the last,
a few kilobytes, where the whole record was up to 110 kB of base64 at every heartbeat.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
from sqlalchemy import (
    JSON,
    Connection,
    String,
    and_,
    bindparam,
    cast,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.dml import Update

from service.store.prepared import Prepared
from service.store.tables import monitor_errors, monitor_state


def _update(value: Any) -> Update:
    return (
        update(monitor_state)
        .where(monitor_state.c.replica == bindparam("key"))
        .values(saved_at=bindparam("at"), model_version=bindparam("version"), state=value)
    )


# Built once: a statement built per call spent longer in SQLAlchemy than in SQLite.
#: The state as text already encoded (SQLite keeps JSON as text; PostgreSQL casts it).
_UPDATE_ENCODED = {
    "sqlite": Prepared(_update(bindparam("value", type_=String))),
    "postgresql": Prepared(_update(cast(bindparam("value", type_=String), JSON))),
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
    changed = 0
    try:
        if statement is not None:
            encoded = orjson.dumps(state).decode("utf-8")
            changed = statement.run(conn, {**params, "value": encoded})
    except TypeError:
        statement = None
    if statement is None:
        changed = conn.execute(_UPDATE, {**params, "value": state}).rowcount
    if not changed:
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


_ADD_ERRORS = Prepared(
    insert(monitor_errors), ["replica", "epoch", "start", "stop", "errors", "users"]
)
_CLEAR_ERRORS = Prepared(delete(monitor_errors).where(monitor_errors.c.replica == bindparam("key")))
_PRUNE_ERRORS = Prepared(
    delete(monitor_errors).where(
        monitor_errors.c.replica == bindparam("key"),
        or_(
            monitor_errors.c.epoch != bindparam("epoch"),
            monitor_errors.c.stop <= bindparam("start"),
        ),
    )
)


def save_record_errors(
    conn: Connection,
    replica: int,
    epoch: int,
    start: int,
    values: np.ndarray,
    keys: np.ndarray,
    *,
    held_from: int,
    whole: bool = False,
) -> None:
    """Add errors ``start``.. of record ``epoch`` (float16) and their user keys (uint16),
    and delete ``replica``'s rows the record no longer holds: other epochs', and those
    entirely before error ``held_from``; ``whole``: these are all the record holds,
    every earlier row goes. Call it in the transaction that saves the state naming the
    record."""
    if whole:
        _CLEAR_ERRORS.run(conn, {"key": replica})
    if values.size:
        _ADD_ERRORS.run(
            conn,
            {
                "replica": replica,
                "epoch": epoch,
                "start": start,
                "stop": start + int(values.size),
                "errors": values.astype(np.float16).tobytes(),
                "users": keys.astype(np.uint16).tobytes(),
            },
        )
    _PRUNE_ERRORS.run(conn, {"key": replica, "epoch": epoch, "start": held_from})


def load_record_errors(
    conn: Connection, replica: int, epoch: int, start: int, end: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Errors ``start`` to ``end`` of record ``epoch`` and their user keys, or None when
    the saved rows do not cover them without a gap."""
    if start == end:
        return np.empty(0, np.float16), np.empty(0, np.uint16)
    rows = conn.execute(
        select(monitor_errors)
        .where(
            and_(
                monitor_errors.c.replica == replica,
                monitor_errors.c.epoch == epoch,
                monitor_errors.c.stop > start,
                monitor_errors.c.start < end,
            )
        )
        .order_by(monitor_errors.c.start)
    ).all()
    if not rows or rows[0].start > start or rows[-1].stop < end:
        return None
    if any(after.start != before.stop for before, after in zip(rows, rows[1:], strict=False)):
        return None
    values = np.concatenate([np.frombuffer(row.errors, np.float16) for row in rows])
    keys = np.concatenate([np.frombuffer(row.users, np.uint16) for row in rows])
    if values.size != keys.size or values.size != rows[-1].stop - rows[0].start:
        return None
    first = start - rows[0].start
    return values[first : first + end - start], keys[first : first + end - start]
