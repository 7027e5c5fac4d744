"""The stored stream, relayed to a serving process's live feed.

A serving process beside a stream process of its own (``STREAM_PROCESS``) evaluates
nothing: the heartbeats, alerts and job changes come from the stream process, through
the store. On each registry-follower tick this relay reads what was stored since its
last look and publishes it to the process's live feed, so the dashboard's charts and
tables move as they do in one process. The store stays the source of truth; the relay
only saves the browser a reload.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, or_, select

from service.livefeed import EventBuffer
from service.store import Database
from service.store.jobs import ACTIVE_STATUSES
from service.store.tables import drift_alerts, heartbeats, retrain_jobs

#: Rows read at most per look and kind: a dashboard needs the newest, not a backlog.
_LOOK_ROWS = 500


class StoredFeedRelay:
    """Publishes the heartbeats, alerts and job changes another process stored."""

    def __init__(self, db: Database, feed: EventBuffer) -> None:
        self.db = db
        self.feed = feed
        self._heartbeat_id: int | None = None
        self._alert_id = 0
        self._job_id = 0
        #: Job id → the status last published, for the jobs not yet ended.
        self._jobs: dict[int, str] = {}

    def tick(self) -> None:
        """Publish what was stored since the last look (the first look only marks)."""
        with self.db.connect() as conn:
            if self._heartbeat_id is None:
                self._mark(conn)
                return
            self._relay_heartbeats(conn)
            self._relay_alerts(conn)
            self._relay_jobs(conn)

    def _mark(self, conn: Connection) -> None:
        self._heartbeat_id = int(conn.scalar(select(func.max(heartbeats.c.id))) or 0)
        self._alert_id = int(conn.scalar(select(func.max(drift_alerts.c.id))) or 0)
        self._job_id = int(conn.scalar(select(func.max(retrain_jobs.c.id))) or 0)
        active = select(retrain_jobs.c.id, retrain_jobs.c.status).where(
            retrain_jobs.c.status.in_(ACTIVE_STATUSES)
        )
        self._jobs = {int(row.id): row.status for row in conn.execute(active)}

    def _relay_heartbeats(self, conn: Connection) -> None:
        query = (
            select(heartbeats)
            .where(heartbeats.c.id > self._heartbeat_id)
            .order_by(heartbeats.c.id)
            .limit(_LOOK_ROWS)
        )
        for row in conn.execute(query):
            self._heartbeat_id = int(row.id)
            self.feed.publish("heartbeat", dict(row._mapping))

    def _relay_alerts(self, conn: Connection) -> None:
        query = (
            select(drift_alerts)
            .where(drift_alerts.c.id > self._alert_id)
            .order_by(drift_alerts.c.id)
            .limit(_LOOK_ROWS)
        )
        for row in conn.execute(query):
            self._alert_id = int(row.id)
            self.feed.publish("alert", _alert_event(row._mapping))

    def _relay_jobs(self, conn: Connection) -> None:
        watched = retrain_jobs.c.id.in_(list(self._jobs)) if self._jobs else None
        newer = retrain_jobs.c.id > self._job_id
        query = select(retrain_jobs.c.id, retrain_jobs.c.status, retrain_jobs.c.trigger).where(
            newer if watched is None else or_(newer, watched)
        )
        for row in conn.execute(query.order_by(retrain_jobs.c.id)):
            job_id = int(row.id)
            self._job_id = max(self._job_id, job_id)
            if self._jobs.get(job_id) == row.status:
                continue
            self.feed.publish("job", {"id": job_id, "status": row.status, "trigger": row.trigger})
            if row.status in ACTIVE_STATUSES:
                self._jobs[job_id] = row.status
            else:
                self._jobs.pop(job_id, None)


def _alert_event(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "events_seen": row["events_seen"],
        "before": row["before"],
        "after": row["after"],
        "detector": row["detector"],
        "metric": row["metric"],
    }
