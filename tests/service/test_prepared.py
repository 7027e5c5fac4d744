"""Statements run on the driver's cursor behave as SQLAlchemy runs them, on both databases."""

from __future__ import annotations

from sqlalchemy import bindparam, delete, func, insert, select

from service.store import Database
from service.store.prepared import Prepared
from service.store.tables import heartbeats

_ADD = Prepared(insert(heartbeats), ["at", "events_seen", "events", "rmse", "static_rmse"])
_COUNT_FROM = Prepared(
    select(func.count()).select_from(heartbeats).where(heartbeats.c.events_seen >= bindparam("at"))
)
_DROP_BELOW = Prepared(delete(heartbeats).where(heartbeats.c.events_seen < bindparam("at")))


def _beat(seen: int) -> dict:
    return {"at": 1.0, "events_seen": seen, "events": 5, "rmse": 0.5, "static_rmse": None}


def test_prepared_statements_write_read_and_roll_back_in_the_connection_s_transaction(
    database_url: str,
) -> None:
    db = Database(database_url)
    try:
        with db.begin() as conn:
            assert _ADD.run(conn, _beat(10)) == 1
            assert _ADD.run_many(conn, [_beat(20), _beat(30)]) == 2
            assert _ADD.run_many(conn, []) == 0
        try:
            with db.begin() as conn:
                _ADD.run(conn, _beat(40))
                raise RuntimeError("the transaction fails")
        except RuntimeError:
            pass
        with db.connect() as conn:
            assert _COUNT_FROM.scalar(conn, {"at": 0}) == 3  # the failed one rolled back
            assert _COUNT_FROM.scalar(conn, {"at": 20}) == 2
            assert conn.scalar(select(func.max(heartbeats.c.events_seen))) == 30
        with db.begin() as conn:
            assert _DROP_BELOW.run(conn, {"at": 25}) == 2
        with db.connect() as conn:
            assert _COUNT_FROM.scalar(conn, {"at": 0}) == 1
    finally:
        db.dispose()
