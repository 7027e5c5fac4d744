"""Request latency per route template, as ``driftline_request_seconds``, and answers
per route and status class, as ``driftline_responses`` (the error-rate alert's input).

A pure ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: the latter runs
each request through an extra task and memory stream, which costs more than the
measurement is worth on ``/recommend``. The label is the matched route's template
(``/jobs/{job_id}``), never the raw path, so a scan of ids cannot blow up the series.
Each route's labelled child is looked up once and kept, since ``labels()`` costs more
than ``observe`` itself.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestTimer:
    """Times every HTTP request into ``histogram`` labelled by route template."""

    def __init__(self, app: ASGIApp, histogram: Histogram, responses: Counter) -> None:
        self.app = app
        self.histogram = histogram
        self.responses = responses
        # One entry per route template plus "unmatched": bounded by the app's routes.
        self._children: dict[str, Histogram] = {}
        self._counters: dict[tuple[str, str], Counter] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]  # what an exception that escapes every handler becomes

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            child = self._children.get(label)
            if child is None:
                child = self._children[label] = self.histogram.labels(route=label)
            child.observe(time.perf_counter() - started)
            self._count(label, f"{status[0] // 100}xx")

    def _count(self, route: str, status: str) -> None:
        counter = self._counters.get((route, status))
        if counter is None:
            counter = self._counters[route, status] = self.responses.labels(route, status)
        counter.inc()
