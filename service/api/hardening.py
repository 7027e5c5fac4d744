"""Request hardening every answer goes through: the Host check and security headers.

* ``TRUSTED_HOSTS``: a request whose ``Host`` header names anything else is refused
  with 400 before it reaches a route. A web page on ``evil.example`` whose name is
  re-pointed at 127.0.0.1 (DNS rebinding) reaches the service with ``Host:
  evil.example`` and learns nothing. Default: the loopback names.
* Every answer says ``X-Content-Type-Options: nosniff`` (a JSON body is never run as a
  script), ``Referrer-Policy: no-referrer`` and ``X-Frame-Options: DENY``; HTML answers
  carry a Content-Security-Policy that allows no script at all, except on the API docs,
  whose page loads Swagger UI's script and stylesheet from its CDN.

A pure ASGI middleware (like ``RequestTimer``): Starlette's ``BaseHTTPMiddleware``
would cost every request an extra task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
#: The policy of HTML pages: scripts, styles and connections (the live event stream,
#: the chart data) from the service itself only; no inline script or style, no CDN.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SWAGGER = "https://cdn.jsdelivr.net"
#: Pages whose policy differs: FastAPI's docs run their UI's script from its CDN.
CSP_BY_PATH = {
    "/docs": (
        f"default-src 'none'; script-src 'unsafe-inline' {_SWAGGER}; style-src {_SWAGGER}; "
        "img-src 'self' data: https://fastapi.tiangolo.com; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "/redoc": (
        f"default-src 'none'; script-src {_SWAGGER}; style-src 'unsafe-inline' "
        "https://fonts.googleapis.com; font-src https://fonts.gstatic.com; "
        "img-src 'self' data: https://fastapi.tiangolo.com; connect-src 'self'; "
        "worker-src blob:; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port and IPv6 brackets, lower case.

    Examples
    --------
    >>> host_name("Example.org:8000"), host_name("[::1]:8000"), host_name("127.0.0.1")
    ('example.org', '::1', '127.0.0.1')
    """
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Hardening:
    """Refuses untrusted Host headers and adds the security headers to every answer.

    Parameters
    ----------
    app
        The application behind it.
    trusted_hosts
        Names accepted in the Host header (without port); ``*`` accepts any.
    """

    def __init__(self, app: ASGIApp, trusted_hosts: Iterable[str]) -> None:
        self.app = app
        hosts = {name.strip().lower().strip("[]") for name in trusted_hosts}
        self.any_host = "*" in hosts
        self.trusted_hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.any_host and not self._trusted(scope):
            await _refuse_host(send)
            return
        csp = CSP_BY_PATH.get(scope["path"], CSP).encode()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(HEADERS)
                if _is_html(headers):
                    headers.append((b"content-security-policy", csp))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _trusted(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"host":
                return host_name(value.decode("latin-1")) in self.trusted_hosts
        return False


def _is_html(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name == b"content-type" and value.startswith(b"text/html") for name, value in headers
    )


async def _refuse_host(send: Send) -> None:
    body = json.dumps(
        {"detail": "the Host header names a host this service does not answer for"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
