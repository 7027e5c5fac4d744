"""Rollback rows: the record of each time an earlier model version was made serving."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, insert, select

from service.store.tables import model_rollbacks


def add_rollback(
    conn: Connection, *, actor: str, from_version: str | None, to_version: str
) -> dict[str, Any]:
    """Record a rollback now; returns the row as stored."""
    row = dict(
        rolled_back_at=time.time(), actor=actor, from_version=from_version, to_version=to_version
    )
    new_id = conn.scalar(insert(model_rollbacks).values(**row).returning(model_rollbacks.c.id))
    return {"id": int(new_id), **row}


def list_rollbacks(conn: Connection) -> list[dict[str, Any]]:
    """Every rollback, oldest first (the order the serving timeline is built in)."""
    query = select(model_rollbacks).order_by(model_rollbacks.c.rolled_back_at, model_rollbacks.c.id)
    return [dict(row._mapping) for row in conn.execute(query)]
