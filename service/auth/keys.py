"""API keys: minted once, stored as a hash, matched in constant time.

A key reads ``dlk_<id>_<secret>``. The id (12 hex digits) is public: it names the row to
compare with, so a request costs one dictionary lookup and one hash, not a scan. The
secret is 256 random bits; only its SHA-256 is stored. A slow password hash (bcrypt,
argon2) earns nothing against a secret nobody can guess and would cost every request
milliseconds; the same reasoning GitHub and Stripe give for their tokens.

The ``KeyRing`` is what requests check against: an immutable snapshot of the keys in
force, replaced whole by a refresher thread every ``KEY_REFRESH_SECONDS`` (and at once
after a key is created or revoked through the API), so a key revoked from the CLI in
another process stops working within that interval, without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from service.auth.scopes import checked, granted
from service.background import BackgroundLoop
from service.store import Database
from service.store.keys import (
    active_key_exists,
    active_keys,
    any_key_exists,
    insert_key,
    record_use,
    revoke_key,
)

log = logging.getLogger(__name__)

PREFIX = "dlk"
#: What a key's name may be: short, and safe in a URL, a log line and a shell.
KEY_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


class KeyExists(ValueError):
    """A key in force already has that name."""


@dataclass(frozen=True)
class IssuedKey:
    """A key as it is handed out: the only time its secret is ever seen."""

    name: str
    scopes: list[str]
    token: str


@dataclass(frozen=True)
class KeyEntry:
    """A key in force as requests see it: its name, rights and the hash to compare."""

    name: str
    key_id: str
    secret_hash: str
    rights: frozenset[str]


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def create_key(db: Database, name: str, scopes: Iterable[str]) -> IssuedKey:
    """Mint a key named ``name`` with ``scopes``; KeyExists if one in force has the name."""
    chosen = checked(scopes)
    if re.fullmatch(KEY_NAME_PATTERN, name) is None:
        raise ValueError("a key's name is 1 to 64 letters, digits, '.', '_' or '-'")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with db.begin() as conn:
        if active_key_exists(conn, name):
            raise KeyExists(f"a key named {name!r} exists; revoke it first")
        insert_key(conn, name, key_id, hash_secret(secret), chosen)
    return IssuedKey(name, chosen, f"{PREFIX}_{key_id}_{secret}")


def revoke(db: Database, name: str) -> bool:
    """Revoke the key named ``name``; whether there was one in force."""
    with db.begin() as conn:
        return revoke_key(conn, name) > 0


@dataclass(frozen=True)
class KeySnapshot:
    """The keys in force at one moment. ``enforced``: whether any key ever existed."""

    enforced: bool
    by_id: MappingProxyType[str, KeyEntry] = field(default_factory=lambda: MappingProxyType({}))

    def match(self, token: str) -> KeyEntry | None:
        """The entry ``token`` is the key of, compared in constant time, else None."""
        parts = split_token(token)
        if parts is None:
            return None
        entry = self.by_id.get(parts[0])
        if entry is None:
            return None
        presented = hash_secret(parts[1])
        return entry if hmac.compare_digest(presented, entry.secret_hash) else None

    @classmethod
    def load(cls, db: Database) -> KeySnapshot:
        with db.connect() as conn:
            enforced = any_key_exists(conn)
            rows = active_keys(conn) if enforced else []
        return cls(enforced, MappingProxyType({row["key_id"]: _entry(row) for row in rows}))


def _entry(row: dict[str, Any]) -> KeyEntry:
    return KeyEntry(row["name"], row["key_id"], row["secret_hash"], granted(row["scopes"]))


class KeyRing:
    """The current ``KeySnapshot``, kept fresh by a thread; readers never wait.

    Parameters
    ----------
    db
        Where the keys live.
    refresh_seconds
        How often the table is reread: the longest a key revoked elsewhere keeps working.
    """

    def __init__(self, db: Database, refresh_seconds: float = 1.0) -> None:
        self.db = db
        self.refresh_seconds = refresh_seconds
        self.snapshot = KeySnapshot.load(db)
        self._used: dict[str, float] = {}
        self._loop = BackgroundLoop("key-ring")

    def refresh(self) -> None:
        """Reread the keys now and write when they were last used."""
        used, self._used = self._used, {}
        try:
            if used:
                with self.db.begin() as conn:
                    record_use(conn, used)
            self.snapshot = KeySnapshot.load(self.db)
        except SQLAlchemyError:
            # Keep the snapshot in force: the database being away must neither open the
            # service nor lock everyone out of what was allowed a second ago.
            log.warning("could not reread the API keys; keeping the ones loaded")

    def used(self, entry: KeyEntry) -> None:
        """Note that ``entry`` authenticated a request (written at the next refresh)."""
        self._used[entry.key_id] = time.time()

    def start(self) -> None:
        self._loop.start(self._run)

    def stop(self) -> None:
        self._loop.stop(timeout_s=10)
        self.refresh()  # the last uses are written

    def _run(self) -> None:
        while not self._loop.stopped.wait(self.refresh_seconds):
            self.refresh()
