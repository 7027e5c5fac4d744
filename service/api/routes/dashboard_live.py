"""GET /dashboard/events: the dashboard's live feed, as server-sent events.

Heartbeats, drift alerts, retraining jobs and model swaps, as the stream components record them
(``service.livefeed``). Each message's ``id`` is the event's id, its ``event``
the kind, its ``data`` the event as JSON. A browser that reconnects sends the last id it
saw (``Last-Event-ID``; a page's first connection may pass ``?last_event_id=``) and gets
what followed; if some of that has already left the buffer, or the id is one this
process never gave (it restarted), a ``reload`` event comes first: the JSON endpoints
are the source of truth. Without either the stream starts at the newest event.

The stream polls the buffer (``POLL_SECONDS``) rather than waking on each publish, so
the stream never touches the event loop; it ends when the client goes away or the
server shuts down (sse-starlette ends open streams when uvicorn is told to exit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
import orjson
from fastapi import APIRouter, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent

from service.api.deps import FeedDep
from service.api.schemas import MAX_ID
from service.livefeed import DashboardEvent, EventBuffer

router = APIRouter(tags=["ops"])

#: How often the stream looks for new events.
POLL_SECONDS = 0.5
#: A comment line this often keeps proxies and the browser from closing an idle stream.
PING_SECONDS = 15
#: A client that takes longer than this to accept one message is dropped.
SEND_TIMEOUT_SECONDS = 30.0
#: At shutdown a stream ends by itself within this, else it is cancelled.
SHUTDOWN_GRACE_SECONDS = 2.0


def _message(event: DashboardEvent) -> ServerSentEvent:
    data = orjson.dumps(event.data, option=orjson.OPT_SERIALIZE_NUMPY, default=str)
    return ServerSentEvent(data=data.decode(), event=event.kind, id=str(event.id))


def _resume_point(header: str | None, query: int | None, newest: int) -> int | None:
    """The id to stream after: the header (a reconnect's, the newest the browser saw)
    before the query string (the page's first connection); the newest event without
    either. None: the id is not one this buffer could have given."""
    raw = header.strip() if header else None
    if raw:
        try:
            last_id = int(raw)
        except ValueError:
            return None
    elif query is not None:
        last_id = query
    else:
        return newest
    return last_id if 0 <= last_id <= newest else None


async def _stream(
    buffer: EventBuffer, last_id: int | None, shutdown: anyio.Event | None = None
) -> AsyncIterator[ServerSentEvent]:
    """The buffered events after ``last_id``, then each new one, until ``shutdown``:
    ending then, rather than being cancelled, closes the answer cleanly."""
    if last_id is None or buffer.missed(last_id):
        yield ServerSentEvent(data="{}", event="reload")
        last_id = 0 if last_id is None else last_id
    shutdown = shutdown or anyio.Event()
    while not shutdown.is_set():
        if buffer.newest_id > last_id:  # most polls find nothing: skip the copy
            for event in buffer.since(last_id):
                yield _message(event)
                last_id = event.id
        with anyio.move_on_after(POLL_SECONDS):
            await shutdown.wait()


@router.get(
    "/dashboard/events",
    response_class=EventSourceResponse,
    # A stream never ends: out of the OpenAPI document, whose clients (and fuzzers)
    # expect an answer; README.md describes it.
    include_in_schema=False,
)
async def dashboard_events(
    feed: FeedDep,
    last_event_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
) -> Any:
    """Heartbeat, alert, job and swap events as they happen (``text/event-stream``)."""
    buffer = feed
    resume = _resume_point(last_event_header, last_event_id, buffer.newest_id)
    shutdown = anyio.Event()  # set by sse-starlette when uvicorn is told to exit
    return EventSourceResponse(
        _stream(buffer, resume, shutdown),
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT_SECONDS,
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_SECONDS,
    )
