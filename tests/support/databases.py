"""Databases for the tests: SQLite files, and isolated schemas on an external PostgreSQL.

``DRIFTLINE_TEST_DATABASE_URL`` names a PostgreSQL database (CI:
``postgresql+psycopg://postgres@127.0.0.1:5432/test``). Each test that uses it gets a
schema of its own, created for it and dropped with everything in it afterwards; the URL
it is handed selects that schema through the connection's ``search_path``, so the
service, its Alembic migrations (``alembic_version`` included) and any subprocess started
with that URL see only the test's tables. Tests therefore never see each other's rows,
run in any order, and leave the database as they found it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

EXTERNAL_URL_VARIABLE = "DRIFTLINE_TEST_DATABASE_URL"
EXAMPLE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def external_url() -> str | None:
    """The configured PostgreSQL URL, or ``None`` when the tests run on SQLite only."""
    return os.environ.get(EXTERNAL_URL_VARIABLE) or None


def not_configured_reason() -> str:
    return f"PostgreSQL tests need {EXTERNAL_URL_VARIABLE} (e.g. {EXAMPLE_URL}); it is not set"


def url_for_schema(url: str | URL, schema: str) -> str:
    """``url`` with its connections' ``search_path`` set to ``schema``.

    psycopg passes ``options`` to the server at connect time, so every connection of
    every engine (and process) built from the URL starts in that schema.
    """
    parsed = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return parsed.render_as_string(hide_password=False)


def schema_of(url: str) -> str | None:
    """The schema a URL from ``url_for_schema`` selects."""
    options = make_url(url).query.get("options")
    if isinstance(options, str) and options.startswith("-csearch_path="):
        return options.removeprefix("-csearch_path=")
    return None


@contextmanager
def isolated_schema(base_url: str) -> Iterator[str]:
    """A URL selecting a fresh, empty schema of ``base_url``'s database; dropped on exit."""
    parsed = make_url(base_url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(
            f"{EXTERNAL_URL_VARIABLE} must be a PostgreSQL URL (e.g. {EXAMPLE_URL}), "
            f"not {parsed.render_as_string()}"
        )
    schema = f"t_{uuid.uuid4().hex}"
    admin = create_engine(parsed, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield url_for_schema(parsed, schema)
        finally:
            with admin.begin() as conn:
                # A connection the test left inside a transaction would hold its locks
                # forever; fail the teardown loudly instead of hanging on it.
                conn.execute(text("SET LOCAL lock_timeout = '30s'"))
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
