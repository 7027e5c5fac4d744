"""Retraining job records and their epochs."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, insert, select, update

from service.store.leases import check_fencing
from service.store.tables import drift_alerts, job_epochs, retrain_jobs

ACTIVE_STATUSES = ("queued", "running")


class AnotherJobActive(RuntimeError):
    """A job is queued or running already, somewhere in the cluster."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"retraining job {job_id} is active")
        self.job_id = job_id


def create_job(
    conn: Connection,
    *,
    policy: str,
    trigger: str,
    runtime: str,
    params: dict[str, Any],
    fencing_token: int | None = None,
) -> int:
    """Record a queued job as it is; the service starts jobs through ``create_fenced_job``."""
    result = conn.execute(
        insert(retrain_jobs).values(
            policy=policy,
            trigger=trigger,
            runtime=runtime,
            status="queued",
            created_at=time.time(),
            params=params,
            fencing_token=fencing_token,
        )
    )
    key = result.inserted_primary_key
    assert key is not None  # an insert into a table with a primary key
    return int(key[0])


def create_fenced_job(
    conn: Connection,
    fencing_token: int | None,
    *,
    policy: str,
    trigger: str,
    runtime: str,
    params: dict[str, Any],
) -> int:
    """Record a new queued job under the leader's ``fencing_token``.

    Refused with ``NotLeaseHolder`` when the token no longer holds the leader lease (a
    deposed leader's late start) and with ``AnotherJobActive`` while any job is queued
    or running: one job at a time in the whole cluster. The lease row stays locked to
    the end of the transaction, so two leaders in turn cannot both pass the checks.
    """
    check_fencing(conn, fencing_token)
    active = conn.scalar(
        select(retrain_jobs.c.id).where(retrain_jobs.c.status.in_(ACTIVE_STATUSES)).limit(1)
    )
    if active is not None:
        raise AnotherJobActive(int(active))
    return create_job(
        conn,
        policy=policy,
        trigger=trigger,
        runtime=runtime,
        params=params,
        fencing_token=fencing_token,
    )


def update_job(conn: Connection, job_id: int, **values: Any) -> None:
    conn.execute(update(retrain_jobs).where(retrain_jobs.c.id == job_id).values(**values))


def add_epoch(
    conn: Connection,
    job_id: int,
    *,
    epoch: int,
    loss: float,
    duration_s: float,
    config: dict[str, Any],
) -> None:
    conn.execute(
        insert(job_epochs).values(
            job_id=job_id, epoch=epoch, loss=loss, duration_s=duration_s, config=config
        )
    )


def active_jobs(conn: Connection) -> list[dict[str, Any]]:
    """Jobs queued or running, oldest first, with their epochs."""
    query = (
        select(retrain_jobs)
        .where(retrain_jobs.c.status.in_(ACTIVE_STATUSES))
        .order_by(retrain_jobs.c.id)
    )
    return [_with_epochs(conn, dict(row._mapping)) for row in conn.execute(query)]


def active_job_ids(conn: Connection) -> list[int]:
    """Ids of the jobs queued or running, oldest first (no epochs: a cheap read)."""
    query = select(retrain_jobs.c.id).where(retrain_jobs.c.status.in_(ACTIVE_STATUSES))
    return [int(job_id) for job_id in conn.scalars(query.order_by(retrain_jobs.c.id))]


def list_jobs(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    query = select(retrain_jobs).order_by(retrain_jobs.c.id.desc()).limit(limit)
    return [_with_epochs(conn, dict(row._mapping)) for row in conn.execute(query)]


def get_job(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(retrain_jobs).where(retrain_jobs.c.id == job_id)).first()
    return None if row is None else _with_epochs(conn, dict(row._mapping))


def job_trigger(conn: Connection, job_id: int) -> str | None:
    """What started job ``job_id`` (``drift``, ``refresh``...), None for no such job."""
    return conn.scalar(select(retrain_jobs.c.trigger).where(retrain_jobs.c.id == job_id))


def _with_epochs(conn: Connection, job: dict[str, Any]) -> dict[str, Any]:
    epochs = conn.execute(
        select(job_epochs).where(job_epochs.c.job_id == job["id"]).order_by(job_epochs.c.epoch)
    )
    job["epochs"] = [dict(row._mapping) for row in epochs]
    alerts = conn.scalars(
        select(drift_alerts.c.id).where(drift_alerts.c.retrain_job_id == job["id"])
    )
    job["alert_ids"] = list(alerts)
    return job


def count_jobs(conn: Connection, status: str | None = None) -> int:
    query = select(retrain_jobs.c.id)
    if status:
        query = query.where(retrain_jobs.c.status == status)
    return len(conn.scalars(query).all())
