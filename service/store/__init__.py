"""The event store: events, model versions, drift alerts, heartbeats and retraining jobs.

SQLAlchemy 2 Core tables, SQLite (WAL) by default, any SQLAlchemy URL otherwise; the
schema is owned by the Alembic migrations under ``migrations/``.
"""

from service.store.database import Database

__all__ = ["Database"]
