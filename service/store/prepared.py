"""Statements compiled once per dialect and run on the driver's cursor.

For the few statements the ingest path runs with every batch (the drift monitor's
heartbeat, its record and its state): SQLAlchemy's execution of a Core statement, even
a cached one, costs a tenth of a millisecond or more in Python, several times what
SQLite spends on a one-row insert. A ``Prepared`` statement is compiled for the
connection's dialect the first time, then its SQL and parameters go straight to the
driver's cursor, inside the connection's transaction. Values reach the driver as given:
pass what the driver takes (numbers, strings, bytes, None), not values a column type
would convert (the JSON column's dictionaries).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

__all__ = ["Prepared"]


class Prepared:
    """``statement`` (with named bind parameters) ready to run on any dialect's driver.

    ``columns`` names the values of an ``INSERT`` that takes them by column, as
    ``Connection.execute`` would infer from its parameters; every run passes all of them.
    """

    def __init__(self, statement: Executable, columns: Sequence[str] | None = None) -> None:
        self.statement = statement
        self.columns = None if columns is None else list(columns)
        #: Dialect name → (SQL, bind names in order, or None for named parameters).
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None]] = {}

    def run(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run once with ``params``; the rows it changed."""
        return self.run_many(conn, [params])

    def run_many(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> int:
        """Run once per mapping in ``params`` (nothing when empty); the rows changed."""
        if not params:
            return 0
        sql, names = self._compiled_for(conn)
        rows = params if names is None else [tuple(p[name] for name in names) for p in params]
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if len(rows) == 1:
                cursor.execute(sql, rows[0])
            else:
                cursor.executemany(sql, rows)
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def scalar(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Run once; the first column of the first row (None: no row)."""
        sql, names = self._compiled_for(conn)
        given = params or {}
        args = given if names is None else tuple(given[name] for name in names)
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql, args)
            row = cursor.fetchone()
            return None if row is None else row[0]
        finally:
            cursor.close()

    def _compiled_for(self, conn: Connection) -> tuple[str, tuple[str, ...] | None]:
        found = self._compiled.get(conn.dialect.name)
        if found is None:
            compiled = self.statement.compile(  # type: ignore[attr-defined]
                dialect=conn.dialect, column_keys=self.columns
            )
            names = tuple(compiled.positiontup) if compiled.positional else None
            found = self._compiled[conn.dialect.name] = (str(compiled), names)
        return found
