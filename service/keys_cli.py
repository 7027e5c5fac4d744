"""``driftline keys``: create, list and revoke API keys, straight in the database.

These commands work with the server stopped or running (a running server sees a change
within ``KEY_REFRESH_SECONDS``); they read the database location like ``serve`` does,
from ``--data-dir``/``--database-url`` or the ``DRIFTLINE_*`` variables.
"""

from __future__ import annotations

import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from service.auth.keys import KeyExists, create_key, revoke
from service.auth.scopes import SCOPES
from service.settings import Settings
from service.store import Database
from service.store.keys import active_key_exists, list_keys

app = typer.Typer(help="API keys: create, list, revoke. Only a hash of each key is stored.")

Scope = Enum("Scope", {name: name for name in SCOPES}, type=str)  # type: ignore[misc]

DataDir = Annotated[
    Path | None,
    typer.Option(help="Directory of the embedded SQLite file (env DRIFTLINE_DATA_DIR)."),
]
DatabaseUrl = Annotated[
    str | None, typer.Option(help="SQLAlchemy URL of the database (env DRIFTLINE_DATABASE_URL).")
]


def _database(data_dir: Path | None, database_url: str | None) -> Database:
    given: dict[str, Any] = {"data_dir": data_dir, "database_url": database_url}
    settings = Settings(**{name: value for name, value in given.items() if value is not None})
    return Database(settings.resolved_database_url)


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A name for the key: letters, digits, . _ -")],
    scope: Annotated[
        list[Scope], typer.Option("--scope", help="ingest, read or admin (repeatable).")
    ],
    if_absent: Annotated[
        bool, typer.Option("--if-absent", help="Do nothing if a key of that name is in force.")
    ] = False,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a key and print it once: it cannot be shown again."""
    db = _database(data_dir, database_url)
    try:
        if if_absent:
            with db.connect() as conn:
                if active_key_exists(conn, name):
                    typer.echo(f"a key named {name!r} exists; nothing created", err=True)
                    return
        issued = create_key(db, name, [s.value for s in scope])
    except (KeyExists, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    finally:
        db.dispose()
    typer.echo(f"created key {issued.name!r} with scopes {', '.join(issued.scopes)}:", err=True)
    typer.echo(issued.token)
    typer.echo(
        "store it now: only its hash is kept. Send it as 'Authorization: Bearer KEY'.", err=True
    )


@app.command("list")
def list_(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Keys with their scopes and when each was created and last used."""
    db = _database(data_dir, database_url)
    try:
        with db.connect() as conn:
            rows = list_keys(conn, include_revoked)
    finally:
        db.dispose()
    typer.echo(f"{'name':<24} {'scopes':<20} {'created':<20} {'last used':<20} revoked")
    for row in rows:
        typer.echo(
            f"{row['name']:<24} {','.join(row['scopes']):<20} {_when(row['created_at']):<20} "
            f"{_when(row['last_used_at']):<20} {_when(row['revoked_at'])}"
        )


@app.command("revoke")
def revoke_(
    name: Annotated[str, typer.Argument(help="The key to revoke.")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a key; servers refuse it within KEY_REFRESH_SECONDS, without a restart."""
    db = _database(data_dir, database_url)
    try:
        revoked = revoke(db, name)
    finally:
        db.dispose()
    if not revoked:
        typer.echo(f"no key named {name!r} is in force", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked key {name!r}")


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
