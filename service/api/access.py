"""Who may call which route: the bearer-key check every request passes through.

The rule, from the most specific to the default:

* a path in ``PUBLIC_PATHS`` (default ``/healthz`` and ``/metrics``) is open;
* a route in ``RIGHTS`` needs the right named there (``POST /ingest``: ``ingest``);
* any other ``GET``/``HEAD`` needs ``read``, and any other method ``admin``.

So a state-changing route added later needs ``admin`` until someone decides otherwise:
the rule fails closed. Until the first key is created the service is open (it refuses
to start on an address other than loopback in that state, see ``service.cli``); once any
key has existed, every other request needs one.

A client authenticates with ``Authorization: Bearer KEY``; the dashboard with its
session cookie (``service.auth.sessions``), whose unsafe requests must also carry the
session's CSRF token. A wrong or missing key is a 401 with ``WWW-Authenticate``
(RFC 6750), a key without the right a 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, HTTPException, Request
from fastapi.routing import APIRoute

from service.auth.keys import KeyEntry, KeyRing
from service.auth.scopes import SCOPES
from service.auth.sessions import COOKIE, CSRF_FIELD, CSRF_HEADER, Sessions

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ALL_RIGHTS = frozenset().union(*SCOPES.values())

#: Routes whose right differs from the default; None: open to anyone.
RIGHTS: dict[tuple[str, str], str | None] = {
    ("POST", "/ingest"): "ingest",
    ("POST", "/dashboard/sign-in"): None,  # how a browser gets a session
    ("POST", "/dashboard/sign-out"): "read",
    ("GET", "/dashboard/events"): "read",  # the dashboard's live feed, as GET /dashboard
    ("GET", "/keys"): "admin",  # who holds which key is for administrators
    ("POST", "/models/{version}/rollback"): "admin",  # changes what every client is served
}

REALM = 'Bearer realm="driftline"'


@dataclass(frozen=True)
class Principal:
    """Who made a request: a key's name, or the client's address where none is needed.

    ``rights`` is what it may do; ``session`` the dashboard cookie it came with, if any.
    Rate limits are counted per ``name``.
    """

    name: str
    rights: frozenset[str]
    session: str | None = None


@dataclass
class Access:
    """The app's key ring, session issuer and open paths (on ``app.state.access``)."""

    ring: KeyRing
    sessions: Sessions
    public_paths: frozenset[str]

    def right_for(self, method: str, path: str) -> str | None:
        """The right a request to the route template ``path`` needs; None: open."""
        return right_for(method, path, self.public_paths)


def right_for(method: str, path: str, public_paths: frozenset[str]) -> str | None:
    """The right ``method`` on the route template ``path`` needs; None: open.

    Examples
    --------
    >>> open_paths = frozenset({"/healthz"})
    >>> [right_for(m, p, open_paths) for m, p in
    ...  [("GET", "/healthz"), ("POST", "/ingest"), ("GET", "/jobs"), ("POST", "/retrain")]]
    [None, 'ingest', 'read', 'admin']
    """
    if path in public_paths:
        return None
    if (method, path) in RIGHTS:
        return RIGHTS[method, path]
    return "read" if method in SAFE_METHODS else "admin"


class Refused(HTTPException):
    """A 401 or 403 from the access check."""


def _unauthorized(detail: str, error: str | None = None) -> Refused:
    challenge = REALM + (f', error="{error}"' if error else "")
    return Refused(401, detail, headers={"WWW-Authenticate": challenge})


def _forbidden(detail: str, right: str) -> Refused:
    challenge = f'{REALM}, error="insufficient_scope", scope="{right}"'
    return Refused(403, detail, headers={"WWW-Authenticate": challenge})


def route_path(request: Request) -> str:
    route = request.scope.get("route")
    return route.path if isinstance(route, APIRoute) else request.url.path


def _client(request: Request) -> str:
    return f"address:{request.client.host if request.client else 'unknown'}"


def _bearer(request: Request) -> str | None:
    """The key in ``Authorization: Bearer KEY``; 401 for any other use of the header."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("the Authorization header must be 'Bearer KEY'", "invalid_request")
    return token.strip()


def _authenticate(request: Request, access: Access) -> Principal:
    snapshot = access.ring.snapshot
    token = _bearer(request)
    if token is not None:
        entry = snapshot.match(token)
        if entry is None:
            raise _unauthorized("the API key is wrong or revoked", "invalid_token")
        return _principal(access, entry)
    cookie = request.cookies.get(COOKIE)
    if cookie:
        entry = access.sessions.verify(cookie, snapshot)
        if entry is not None:
            return _principal(access, entry, session=cookie)
    raise _unauthorized("an API key is required: send 'Authorization: Bearer KEY'")


def _principal(access: Access, entry: KeyEntry, session: str | None = None) -> Principal:
    access.ring.used(entry)
    return Principal(entry.name, entry.rights, session)


#: The largest dashboard form read for its CSRF token.
MAX_FORM_BYTES = 64 * 1024


async def _check_csrf(request: Request, access: Access, principal: Principal) -> None:
    """Unsafe requests riding on a session cookie carry its CSRF token.

    In the ``X-CSRF-Token`` header (scripts), or in the ``csrf_token`` field of a
    dashboard form; the form is read here (Starlette keeps the body for the handler).
    """
    if principal.session is None or request.method in SAFE_METHODS:
        return
    token = request.headers.get(CSRF_HEADER)
    if token is None and _is_form(request):
        token = (await read_form(request)).get(CSRF_FIELD)
    if not access.sessions.csrf_ok(principal.session, token):
        raise Refused(403, "a request made with a dashboard session needs its CSRF token")


def _is_form(request: Request) -> bool:
    declared = request.headers.get("content-type", "")
    return declared.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a small URL-encoded form (first value of each); 413 past 64 KiB.

    Read once per request and kept on ``request.state``, so the CSRF check and the
    handler can both look at it.
    """
    cached: dict[str, str] | None = getattr(request.state, "form", None)
    if cached is not None:
        return cached
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, f"a form is at most {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=20)
    except ValueError:
        raise HTTPException(400, "a form has at most 20 fields") from None
    request.state.form = {name: values[0] for name, values in fields.items()}
    return request.state.form


async def authorize(request: Request) -> Principal:
    """The caller, once allowed; 401 or 403 otherwise (every route depends on it)."""
    access: Access = request.app.state.access
    right = access.right_for(request.method, route_path(request))
    if not access.ring.snapshot.enforced:
        principal = Principal(_client(request), ALL_RIGHTS)
    elif right is None:
        principal = Principal(_client(request), frozenset())
    else:
        principal = _authenticate(request, access)
        if right not in principal.rights:
            raise _forbidden(f"this key lacks the {right!r} scope", right)
        await _check_csrf(request, access, principal)
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(authorize)]
