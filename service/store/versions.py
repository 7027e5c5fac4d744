"""Model version rows: the registry's index over artifacts in the object store."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, insert, select, update

from service.store.tables import model_versions


def add_version(conn: Connection, **values: Any) -> None:
    conn.execute(insert(model_versions).values(created_at=time.time(), **values))


def list_versions(conn: Connection) -> list[dict[str, Any]]:
    query = select(model_versions).order_by(model_versions.c.created_at.desc())
    return [dict(row._mapping) for row in conn.execute(query)]


def get_version(conn: Connection, version: str) -> dict[str, Any] | None:
    row = conn.execute(select(model_versions).where(model_versions.c.version == version)).first()
    return None if row is None else dict(row._mapping)


def version_of_job(conn: Connection, job_id: int) -> dict[str, Any] | None:
    """The version job ``job_id`` published, if it did (a job publishes at most one)."""
    query = select(model_versions).where(model_versions.c.job_id == job_id)
    row = conn.execute(query.order_by(model_versions.c.created_at)).first()
    return None if row is None else dict(row._mapping)


def mark_deleted(conn: Connection, version: str) -> None:
    conn.execute(
        update(model_versions)
        .where(model_versions.c.version == version)
        .values(deleted_at=time.time())
    )
