"""Rollout rows: the guard's record of each version published while another served."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, insert, select, update

from service.store.tables import model_rollouts

#: A version that runs beside the serving one and is not served.
SHADOW = "shadow"
#: Not promoted; never served unless someone rolls back to it.
HELD = "held"
#: Promoted; the version it replaced runs in shadow beside it.
WATCH = "watch"
#: Promoted and kept after its watch (or without one).
KEPT = "kept"
#: Promoted, then rolled back by the guard.
ROLLED_BACK = "rolled_back"

#: States in which the version does not serve unless rolled back to.
NOT_PROMOTED = frozenset({SHADOW, HELD})


def add_rollout(
    conn: Connection, version: str, *, compared_with: str | None, at: float | None = None
) -> None:
    """Record ``version`` as published into shadow (with the version serving then)."""
    conn.execute(
        insert(model_rollouts).values(
            version=version,
            state=SHADOW,
            compared_with=compared_with,
            published_at=time.time() if at is None else at,
        )
    )


def list_rollouts(conn: Connection) -> list[dict[str, Any]]:
    """Every rollout row, oldest publication first."""
    query = select(model_rollouts).order_by(model_rollouts.c.published_at)
    return [dict(row._mapping) for row in conn.execute(query)]


def get_rollout(conn: Connection, version: str) -> dict[str, Any] | None:
    row = conn.execute(select(model_rollouts).where(model_rollouts.c.version == version)).first()
    return None if row is None else dict(row._mapping)


def update_rollout(conn: Connection, version: str, **values: Any) -> bool:
    """Change ``version``'s row; whether there was one."""
    done = conn.execute(
        update(model_rollouts).where(model_rollouts.c.version == version).values(**values)
    )
    return bool(done.rowcount)
