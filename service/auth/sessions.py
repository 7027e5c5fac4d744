"""Dashboard sessions and the CSRF tokens of their state-changing actions.

An operator signs in to the dashboard with an API key once; the browser then holds a
session cookie, not the key: ``<key id>.<expiry>.<HMAC>``, signed with the server's
session secret over the key's id, the expiry and the key's stored hash. So a session
ends when it expires, when its key is revoked (the key is no longer in the ring), and
when the secret changes (a restart, unless ``SESSION_SECRET`` is set); nothing about it
is stored server-side.

The cookie is ``HttpOnly`` (page scripts cannot read it) and ``SameSite=Strict`` (no
other site's page makes the browser send it). State-changing dashboard requests carry a
CSRF token besides: the HMAC of the session cookie under the same secret, put into the
page's forms, so a request forged from elsewhere, which cannot read the page, cannot
carry it. Requests authenticated with an ``Authorization`` header need no token:
browsers never attach that header on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from service.auth.keys import KeyEntry, KeySnapshot

COOKIE = "driftline_session"
#: The form field and the header that carry a CSRF token.
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class Sessions:
    """Issues and checks session cookies and CSRF tokens.

    Parameters
    ----------
    secret
        The signing key; None draws a random one (sessions then end with the process).
    lifetime_seconds
        How long a sign-in lasts.

    Examples
    --------
    >>> from types import MappingProxyType
    >>> entry = KeyEntry("ops", "0a1b2c3d4e5f", "ab" * 32, frozenset({"read"}))
    >>> ring = KeySnapshot(True, MappingProxyType({entry.key_id: entry}))
    >>> sessions = Sessions(b"k" * 32, lifetime_seconds=60)
    >>> cookie = sessions.issue(entry)
    >>> sessions.verify(cookie, ring) == entry
    True
    >>> sessions.csrf_ok(cookie, sessions.csrf_token(cookie)), sessions.csrf_ok(cookie, "x")
    (True, False)
    """

    def __init__(self, secret: bytes | None = None, lifetime_seconds: float = 12 * 3600) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.lifetime_seconds = lifetime_seconds

    def _mac(self, *parts: str) -> str:
        message = "|".join(parts).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue(self, entry: KeyEntry) -> str:
        """A session cookie's value for the key ``entry``."""
        expires = str(int(time.time() + self.lifetime_seconds))
        mac = self._mac("session", entry.key_id, expires, entry.secret_hash)
        return f"{entry.key_id}.{expires}.{mac}"

    def verify(self, cookie: str, snapshot: KeySnapshot) -> KeyEntry | None:
        """The key a live, untampered session belongs to, else None."""
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        key_id, expires, mac = parts
        entry = snapshot.by_id.get(key_id)
        if entry is None or int(expires) < time.time():
            return None
        expected = self._mac("session", key_id, expires, entry.secret_hash)
        return entry if _same(mac, expected) else None

    def csrf_token(self, cookie: str) -> str:
        """The token state-changing requests of the session ``cookie`` must carry."""
        return self._mac("csrf", cookie)

    def csrf_ok(self, cookie: str, token: str | None) -> bool:
        return token is not None and _same(token, self.csrf_token(cookie))


def _same(presented: str, expected: str) -> bool:
    """Constant-time equality of text a client sent (any characters) and ours."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), expected.encode())
