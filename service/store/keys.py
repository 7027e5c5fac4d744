"""The ``api_keys`` table: names, scopes and hashes of the service's API keys.

Only the SHA-256 of each key's secret is stored; the secret itself is shown once, when
the key is created (``service.auth.keys``). Revoking sets ``revoked_at`` and keeps the
row, so the table never empties once a key has existed and access control stays on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, exists, insert, select, update

from service.store.tables import api_keys

#: Columns a listing shows: everything but the hash.
_PUBLIC = (
    api_keys.c.name,
    api_keys.c.key_id,
    api_keys.c.scopes,
    api_keys.c.created_at,
    api_keys.c.last_used_at,
    api_keys.c.revoked_at,
)


def insert_key(
    conn: Connection, name: str, key_id: str, secret_hash: str, scopes: Iterable[str]
) -> None:
    """Store a new key's public id, hash and scopes."""
    conn.execute(
        insert(api_keys).values(
            name=name,
            key_id=key_id,
            secret_hash=secret_hash,
            scopes=sorted(scopes),
            created_at=time.time(),
        )
    )


def active_key_exists(conn: Connection, name: str) -> bool:
    """Whether a key named ``name`` is in force (not revoked)."""
    query = select(exists().where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None)))
    return bool(conn.scalar(query))


def any_key_exists(conn: Connection) -> bool:
    """Whether any key, revoked or not, was ever created: then every request needs one."""
    return bool(conn.scalar(select(exists().where(api_keys.c.id.is_not(None)))))


def list_keys(conn: Connection, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Keys without their hashes, oldest first."""
    query = select(*_PUBLIC).order_by(api_keys.c.id)
    if not include_revoked:
        query = query.where(api_keys.c.revoked_at.is_(None))
    return [dict(row._mapping) for row in conn.execute(query)]


def active_keys(conn: Connection) -> list[dict[str, Any]]:
    """``{name, key_id, secret_hash, scopes}`` of every key in force: what requests match."""
    query = select(
        api_keys.c.name, api_keys.c.key_id, api_keys.c.secret_hash, api_keys.c.scopes
    ).where(api_keys.c.revoked_at.is_(None))
    return [dict(row._mapping) for row in conn.execute(query)]


def revoke_key(conn: Connection, name: str) -> int:
    """Revoke the keys in force named ``name``; how many were."""
    result = conn.execute(
        update(api_keys)
        .where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=time.time())
    )
    return int(result.rowcount or 0)


def record_use(conn: Connection, used: Mapping[str, float]) -> None:
    """Set ``last_used_at`` of the keys whose ids are in ``used``."""
    for key_id, at in used.items():
        conn.execute(update(api_keys).where(api_keys.c.key_id == key_id).values(last_used_at=at))
