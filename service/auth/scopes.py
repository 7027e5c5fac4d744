"""What each API-key scope lets a client do.

A scope grants itself and what it implies: ``admin`` is every right (a key that may
start paid jobs and mint keys gains nothing by being refused a read). The mapping is the
registry: a new scope is a new entry here, and ``driftline keys create --scope`` offers it.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Each scope and the rights it grants.
SCOPES: dict[str, frozenset[str]] = {
    "ingest": frozenset({"ingest"}),
    "read": frozenset({"read"}),
    "admin": frozenset({"admin", "read", "ingest"}),
}


def granted(scopes: Iterable[str]) -> frozenset[str]:
    """The rights a key with ``scopes`` holds.

    Examples
    --------
    >>> sorted(granted(["admin"]))
    ['admin', 'ingest', 'read']
    >>> sorted(granted(["read", "ingest"]))
    ['ingest', 'read']
    """
    rights: set[str] = set()
    for scope in scopes:
        rights |= SCOPES.get(scope, frozenset())
    return frozenset(rights)


def checked(scopes: Iterable[str]) -> list[str]:
    """``scopes`` sorted and deduplicated, or ValueError naming an unknown one."""
    chosen = sorted(set(scopes))
    unknown = [scope for scope in chosen if scope not in SCOPES]
    if unknown or not chosen:
        raise ValueError(f"scopes must be one or more of {sorted(SCOPES)}; got {chosen}")
    return chosen
