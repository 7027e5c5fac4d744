"""``GET /recommend`` answered without FastAPI's per-request machinery, when it is safe to.

FastAPI's routing and dependency resolution (solving the route's dependencies,
validating its query parameters through pydantic, building the request object) cost
several times what the recommendation itself does (BENCHMARKS.md "serve"). This
middleware answers the requests the route would accept, the overwhelming majority,
directly from the ASGI scope:

* the method is GET, the path ``/recommend``, ``user_id`` and ``k`` are valid by the
  route's own rules (``k`` written as plain digits), and no ``after`` position asks it
  to wait for the event log;
* the caller is allowed exactly as ``service.api.access.authorize`` allows it: the
  service is open, the route is public, or a ``Bearer`` key with the ``read`` right;
* the recommendation is quick to compute (``Recommender.is_quick``).

When an item index serves the version (``SERVING_INDEX``), the recommendation itself is
computed on a thread of its own, many requests at a time (``service.api.batching``):
faiss releases the interpreter while it searches, so the event loop parses and answers
other requests on the second core meanwhile. Scoring a small catalogue whole costs
less than the hand-over would, so it stays on the loop.

Anything else, a missing or wrong key, a dashboard session cookie, a malformed
parameter, a large catalogue scored exactly, goes on to the FastAPI route unchanged,
which answers it (with its 401, 403 or 422) as it always did. So this path can only
answer what the route would have answered, the same way: the same body, the same
per-key rate limit (``RECOMMEND_RATE``, 429 with ``Retry-After``), and the same label
in the request metrics, since it sits inside ``RequestTimer`` and ``Hardening``.
"""

from __future__ import annotations

import re

import orjson
from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.access import Access
from service.api.batching import RecommendBatcher
from service.api.limits import Limited
from service.api.routes import recommend
from service.ingest.validation import IDENTIFIER_PATTERN
from service.serving.recommender import Recommendation, Recommender

PATH = "/recommend"
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
_JSON = (b"content-type", b"application/json")


class RecommendFastPath:
    """ASGI middleware answering plain ``GET /recommend`` requests itself (see above)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: The route this path stands in for: what ``RequestTimer`` labels requests by.
        self.route = next(
            route
            for route in recommend.router.routes
            if isinstance(route, APIRoute) and route.path == PATH
        )
        self._searcher = RecommendBatcher()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == PATH:
            answer = await self._answer(scope)
            if answer is not None:
                status, body, headers = answer
                headers = [_JSON, (b"content-length", str(len(body)).encode()), *headers]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """Status, body and extra headers, or None for the FastAPI route to answer."""
        state = scope["app"].state
        recommender = state.driftline.recommender
        if not recommender.is_quick:
            return None
        query = _query(scope)
        if query is None:
            return None
        principal = _principal(scope, state.access)
        if principal is None:
            return None
        scope["route"] = self.route
        limit = state.limits.recommend
        if limit is not None:
            try:
                limit.take(principal, 1)
            except Limited as exc:
                body = orjson.dumps({"detail": exc.detail})
                headers = [
                    (name.lower().encode(), value.encode())
                    for name, value in (exc.headers or {}).items()
                ]
                return 429, body, headers
        # Read before answering: the answer reflects at least this much of the log.
        position = str(state.driftline.learner.applied).encode()
        result = await self._recommend(recommender, *query)
        body = orjson.dumps(
            {
                "user_id": result.user_id,
                "items": [{"item_id": item, "score": score} for item, score in result.items],
                "model_version": result.model_version,
                "source": result.source,
            }
        )
        return 200, body, [(b"x-driftline-position", position)]

    async def _recommend(self, recommender: Recommender, user_id: str, k: int) -> Recommendation:
        """``recommender.recommend``, on the search thread when an item index serves it.

        One thread: requests are the loop's to interleave, and a second searcher would
        only compete with it for the cores. ``recommend`` reads published snapshots
        only, so it is safe off the loop.
        """
        if not recommender.searches_index:
            return recommender.recommend(user_id, k)
        return await self._searcher.recommend(recommender, user_id, k)


def _query(scope: Scope) -> tuple[str, int] | None:
    """``(user_id, k)`` if the route's rules accept them, else None.

    Parsed as Starlette parses them for FastAPI (the last of repeated values wins);
    ``k`` only as plain digits, leaving pydantic's other integer spellings to the route.
    """
    params = QueryParams(scope["query_string"])
    if "after" in params:
        return None
    user_id = params.get("user_id")
    if user_id is None or not 1 <= len(user_id) <= 256 or not _IDENTIFIER.match(user_id):
        return None
    raw_k = params.get("k", "10")
    if not (raw_k.isascii() and raw_k.isdigit() and len(raw_k) <= 4):
        return None
    k = int(raw_k)
    return (user_id, k) if 1 <= k <= 1000 else None


def _principal(scope: Scope, access: Access) -> str | None:
    """The name the rate limit counts the caller by, if ``authorize`` would let it read
    ``/recommend`` without a session cookie; None leaves the decision to the route."""
    snapshot = access.ring.snapshot
    right = access.right_for("GET", PATH)
    if not snapshot.enforced or right is None:
        client = scope.get("client")
        return f"address:{client[0] if client else 'unknown'}"
    header = _header(scope, b"authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    entry = snapshot.match(token.strip())
    if entry is None or right not in entry.rights:
        return None
    access.ring.used(entry)
    return entry.name


def _header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header, decoded as Starlette decodes headers."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
