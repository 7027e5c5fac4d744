"""Engine creation, schema migration, and what counts as the database being unavailable.

SQLite runs in WAL mode with ``synchronous=FULL``: a batch the API acknowledged has been
fsynced, so neither a process crash nor a power cut loses it, and readers (``/recommend``,
the dashboard) never wait for the writer. Derived data written after every batch (the
drift monitor's heartbeats) may commit without the fsync (``Database.begin_unsynced``).

On a database server (PostgreSQL) every pooled connection is pinged before use, so the
service recovers by itself once a lost server is back, and a connection attempt gives up
after ``CONNECT_TIMEOUT_SECONDS`` instead of hanging a request on an unreachable host.
The schema (``alembic_version`` included) goes where the connection's ``search_path``
points; ``?options=-csearch_path%3Dname`` in a psycopg URL selects a schema.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
CONNECT_TIMEOUT_SECONDS = 10


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``; creates the directory of a SQLite file if needed."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args = {}
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be reached right now (retry later).

    Refused or lost connections and server shutdowns are ``OperationalError``; a
    connection closed under a statement can surface as ``InterfaceError`` or as any
    DBAPI error SQLAlchemy flagged as a disconnect; an exhausted pool is a timeout.
    Constraint violations and SQL errors are bugs, not outages.
    """
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def upgrade_schema(engine: Engine, attempts: int = 5) -> None:
    """Bring the schema to the newest Alembic revision (idempotent).

    Several processes may start on one fresh database at once (consumer replicas, a
    server beside them). Each migration runs in one transaction, so the loser of such a
    race rolls back whole; it then tries again and finds the schema already at head.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
            return
        except DBAPIError:
            if attempt == attempts:
                raise
            log.info("schema upgrade raced another process; retrying (%d)", attempt)
            time.sleep(0.2 * attempt)


class Database:
    """The service's database: one engine, migrated on open."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        upgrade_schema(self.engine)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection inside a transaction that commits on success, rolls back on error."""
        with self.engine.begin() as connection:
            yield connection

    @contextmanager
    def begin_unsynced(self) -> Iterator[Connection]:
        """``begin``, committing without waiting for the disk.

        For derived data written often, which the next synced commit makes durable
        (the drift monitor's heartbeats after each batch): on SQLite in WAL mode the
        commit skips its fsync (``synchronous=NORMAL`` for this transaction only), so it
        survives a crash of the process but not of the machine until the next synced
        commit; on PostgreSQL ``synchronous_commit`` is off for the transaction, with
        the same guarantee. Elsewhere it is ``begin``.
        """
        backend = self.engine.dialect.name
        with self.engine.connect() as connection:
            if backend == "sqlite":
                # The safety level cannot change inside a transaction: set it before the
                # first statement and put it back on the pooled connection after commit.
                driver = connection.connection.driver_connection
                assert driver is not None  # a checked-out connection
                driver.execute("PRAGMA synchronous=NORMAL")
                try:
                    with connection.begin():
                        yield connection
                finally:
                    driver.execute("PRAGMA synchronous=FULL")
                return
            with connection.begin():
                if backend == "postgresql":
                    connection.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
                yield connection

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads."""
        with self.engine.connect() as connection:
            yield connection

    def dispose(self) -> None:
        self.engine.dispose()
