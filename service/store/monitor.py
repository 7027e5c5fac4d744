"""The drift monitor's snapshot: one row per replica, replaced with every heartbeat write.

The state is plain JSON (ADWIN's heartbeats, the partial heartbeat's sums), never a
pickle, so reading it back cannot run code even if the database were tampered with.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from service.store.tables import monitor_state


def save_monitor_state(
    conn: Connection, replica: int, model_version: str | None, state: dict[str, Any]
) -> None:
    """Replace ``replica``'s snapshot; call it in the transaction that writes the
    heartbeats ``state`` accounts for, so the two never disagree after a crash."""
    conn.execute(delete(monitor_state).where(monitor_state.c.replica == replica))
    conn.execute(
        insert(monitor_state).values(
            replica=replica, saved_at=time.time(), model_version=model_version, state=state
        )
    )


def load_monitor_state(conn: Connection, replica: int) -> dict[str, Any] | None:
    """``{"model_version", "state"}`` as ``replica`` last saved it, or None."""
    query = select(monitor_state).where(monitor_state.c.replica == replica)
    row = conn.execute(query).first()
    if row is None:
        return None
    return {"model_version": row.model_version, "state": dict(row.state)}
