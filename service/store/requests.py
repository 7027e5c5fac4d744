"""Retraining requests: a replica that does not lead asks the leader for a job.

A request names who asked and when (the database's clock, as leases do); the leader
answers it once, with the job it started or the reason it did not and the status code
the asker answers with. ``answer_request`` only writes an unanswered request, so the
leader's answer and an asker giving up cannot both land: whichever comes second learns
it came second.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from service.store.leases import database_now
from service.store.tables import retrain_requests

#: Unanswered requests claimed at a time.
CLAIM_LIMIT = 20


def add_request(conn: Connection, requested_by: str, trigger: str = "manual") -> int:
    """Record a request from replica ``requested_by``; returns its id."""
    result = conn.execute(
        insert(retrain_requests).values(
            requested_at=database_now(conn), trigger=trigger, requested_by=requested_by
        )
    )
    key = result.inserted_primary_key
    assert key is not None  # an insert into a table with a primary key
    return int(key[0])


def claim_unanswered(conn: Connection, limit: int = CLAIM_LIMIT) -> list[dict[str, Any]]:
    """The oldest unanswered requests, oldest first. On PostgreSQL they stay locked to
    the end of the transaction and rows another transaction holds are skipped, so two
    processes answering at once never answer the same request."""
    query = (
        select(retrain_requests)
        .where(retrain_requests.c.answered_at.is_(None))
        .order_by(retrain_requests.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [dict(row._mapping) for row in conn.execute(query)]


def answer_request(
    conn: Connection,
    request_id: int,
    job_id: int | None = None,
    refusal: str | None = None,
    status: int | None = None,
) -> bool:
    """Answer request ``request_id`` with the job started for it or the ``refusal``,
    and the ``status`` code; False if it was answered already (nothing is written)."""
    result = conn.execute(
        update(retrain_requests)
        .where(retrain_requests.c.id == request_id, retrain_requests.c.answered_at.is_(None))
        .values(answered_at=database_now(conn), job_id=job_id, refusal=refusal, status=status)
    )
    return result.rowcount == 1


def get_request(conn: Connection, request_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(retrain_requests).where(retrain_requests.c.id == request_id)).first()
    return None if row is None else dict(row._mapping)
