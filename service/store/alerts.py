"""Drift alerts and the heartbeat series they were raised on."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from service.store.prepared import Prepared
from service.store.tables import drift_alerts, heartbeats


def add_alert(
    conn: Connection,
    *,
    metric: str,
    before: float,
    after: float,
    events_seen: int,
    model_version: str | None,
    detector: str | None = None,
    change_events: int | None = None,
    segments: dict[str, Any] | None = None,
    kind: str = "drift",
) -> int:
    """Store an alert; ``kind`` drift (the monitor's) or rollback (the rollout guard's)."""
    result = conn.execute(
        insert(drift_alerts).values(
            kind=kind,
            detected_at=time.time(),
            metric=metric,
            before=before,
            after=after,
            events_seen=events_seen,
            model_version=model_version,
            detector=detector,
            change_events=change_events,
            segments=segments,
        )
    )
    key = result.inserted_primary_key
    assert key is not None  # an insert into a table with a primary key
    return int(key[0])


def update_alert_segments(conn: Connection, alert_id: int, segments: dict[str, Any] | None) -> None:
    """Replace an alert's segments with ones computed on more events since its change."""
    conn.execute(
        update(drift_alerts).where(drift_alerts.c.id == alert_id).values(segments=segments)
    )


def attach_alert(conn: Connection, alert_id: int, job_id: int) -> None:
    conn.execute(
        update(drift_alerts).where(drift_alerts.c.id == alert_id).values(retrain_job_id=job_id)
    )


def acknowledge_alert(
    conn: Connection, alert_id: int, actor: str, at: float
) -> dict[str, Any] | None:
    """Mark an alert acknowledged by ``actor``; the first acknowledgement stands (a second
    one changes nothing). None if there is no such alert."""
    conn.execute(
        update(drift_alerts)
        .where(drift_alerts.c.id == alert_id, drift_alerts.c.acknowledged_at.is_(None))
        .values(acknowledged_at=at, acknowledged_by=actor[:128])
    )
    return get_alert(conn, alert_id)


def get_alert(conn: Connection, alert_id: int) -> dict[str, Any] | None:
    """One alert with its detector, change point and segments; None if there is none."""
    row = conn.execute(select(drift_alerts).where(drift_alerts.c.id == alert_id)).first()
    return None if row is None else dict(row._mapping)


def list_alerts(
    conn: Connection, limit: int = 100, kind: str | None = None
) -> list[dict[str, Any]]:
    """The newest alerts first, of ``kind`` only if given (drift, rollback)."""
    query = select(drift_alerts).order_by(drift_alerts.c.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(drift_alerts.c.kind == kind)
    return [dict(row._mapping) for row in conn.execute(query)]


#: Built once: the monitor writes heartbeats after every batch.
#: A heartbeat row's columns: every one but the id.
HEARTBEAT_COLUMNS = [column.name for column in heartbeats.columns if column.name != "id"]
_INSERT_HEARTBEATS = Prepared(insert(heartbeats), HEARTBEAT_COLUMNS)


def add_heartbeats(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert heartbeat rows (a column a row leaves out is NULL)."""
    _INSERT_HEARTBEATS.run_many(
        conn, [{name: row.get(name) for name in HEARTBEAT_COLUMNS} for row in rows]
    )


def list_heartbeats(conn: Connection, since_events: int = 0) -> list[dict[str, Any]]:
    query = (
        select(heartbeats)
        .where(heartbeats.c.events_seen > since_events)
        .order_by(heartbeats.c.events_seen)
    )
    return [dict(row._mapping) for row in conn.execute(query)]


def latest_positions(conn: Connection) -> tuple[int, int | None]:
    """Where the stored heartbeats end and where the newest drift alert was raised, in
    labelled events seen (0 and None for none)."""
    heartbeat_at = conn.scalar(select(func.max(heartbeats.c.events_seen)))
    alert_at = conn.scalar(
        select(func.max(drift_alerts.c.events_seen)).where(drift_alerts.c.kind == "drift")
    )
    return int(heartbeat_at or 0), None if alert_at is None else int(alert_at)
