"""The event store: events, model versions, drift alerts, heartbeats and retraining jobs.

SQLAlchemy 2 Core tables, SQLite (WAL) by default, any SQLAlchemy URL otherwise; the
schema is owned by the Alembic migrations under ``migrations/``.
"""

from service.store.database import Database, is_unavailable

__all__ = ["Database", "is_unavailable"]
