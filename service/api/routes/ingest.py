"""POST /ingest: validated, atomic, idempotent, acknowledged once durable.

The body is read raw (with a size limit) and parsed with orjson rather than through a
FastAPI body parameter: orjson refuses nesting deeper than 1,024 levels and numbers no
double holds with a clean error instead of Python's RecursionError or int-size
ValueError, and it is several times faster. The OpenAPI schema still documents the body
(``IngestBatch``) and every answer.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from service.api.deps import IngestDep, MetricsDep, SettingsDep
from service.api.limits import Limited, Limits
from service.api.schemas import IngestBatch, IngestResult, answers
from service.ingest.validation import parse_batch, parse_event
from service.settings import Settings
from service.store.events import NewEvent

router = APIRouter(tags=["ingest"])

#: Media types ``/ingest`` accepts. Anything else is refused with 415: a web page can make
#: a visitor's browser post ``text/plain`` or a form to any origin without a preflight,
#: but not ``application/json``.
_JSON_TYPES = ("application/json",)


class Rejected(HTTPException):
    """An ingest refusal, labelled with the reason ``driftline_ingest_rejected`` counts."""

    def __init__(self, status_code: int, detail: Any, reason: str) -> None:
        super().__init__(status_code, detail)
        self.reason = reason


def _require_json(request: Request) -> None:
    declared = request.headers.get("content-type", "")
    media_type = declared.split(";", 1)[0].strip().lower()
    if media_type not in _JSON_TYPES and not media_type.endswith("+json"):
        shown = f"'{declared}'" if declared else "no content type"
        raise Rejected(
            415,
            f"/ingest takes application/json; the request sent {shown}",
            "unsupported_media_type",
        )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        raise Rejected(
            413, f"request body of {declared} bytes exceeds the {limit}-byte limit", "too_large"
        )
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise Rejected(413, f"request body exceeds the {limit}-byte limit", "too_large")
    return bytes(body)


def _parse_json(body: bytes) -> Any:
    """The decoded body, or 400 saying why it is not acceptable JSON.

    orjson first (fast, and bounded: nesting over 1,024 levels and numbers no double
    holds are errors). Only when it refuses does Python's parser get a try, because it
    reads the NaN and Infinity literals some clients send, which then get the precise
    422 a non-finite rating deserves; its RecursionError and int-size ValueError are
    caught and answered with orjson's message.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        refusal = exc
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise Rejected(400, f"request body is not valid JSON: {refusal}", "bad_json") from None


def _events_list(body: bytes, settings: Settings) -> list[Any]:
    document = _parse_json(body)
    if not isinstance(document, dict) or not isinstance(document.get("events"), list):
        raise Rejected(422, 'body must be a JSON object {"events": [...]}', "invalid_event")
    extra = sorted(set(document) - {"events"})
    if extra:
        raise Rejected(422, f"unknown top-level fields: {', '.join(extra)}", "invalid_event")
    events = document["events"]
    if len(events) > settings.max_batch_events:
        raise Rejected(
            413,
            f"batch of {len(events)} events exceeds the limit of {settings.max_batch_events}",
            "too_large",
        )
    return events


def read_events(body: bytes, settings: Settings) -> list[NewEvent]:
    """The events of an /ingest body, or the 4xx that says what is wrong with it."""
    return validate_events(_events_list(body, settings), settings)


def validate_events(raw_events: list[Any], settings: Settings) -> list[NewEvent]:
    """Every event parsed, or HTTP 422 naming each bad event's index and field.

    The whole batch is checked a column at a time first (``parse_batch``); only a batch
    that fails that goes through the events one by one, to name every problem.
    """
    limits = settings.event_limits
    events = parse_batch(raw_events, limits)
    if events is not None:
        return events
    problems: list[dict[str, Any]] = []
    parsed: list[NewEvent] = []
    for index, raw in enumerate(raw_events):
        event, errors = parse_event(raw, limits)
        problems.extend(
            {"index": index, "field": e.field, "msg": f"events[{index}]: {e.message}"}
            for e in errors
        )
        if event is not None:
            parsed.append(event)
    if problems:
        raise Rejected(422, problems, "invalid_event")
    return parsed


@router.post(
    "/ingest",
    response_model=IngestResult,
    responses=answers(400, 413, 415, 422, 429, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}
            },
        }
    },
)
async def ingest(
    request: Request, store_and_learn: IngestDep, metrics: MetricsDep, settings: SettingsDep
) -> IngestResult:
    """Store a batch of events atomically, then evaluate and learn from them."""
    principal = request.state.principal.name
    limits: Limits = request.app.state.limits
    # Administrators' bulk loads are not capped per item; ingest-only clients are.
    item_cap = None if "admin" in request.state.principal.rights else limits.item_cap
    try:
        _require_json(request)
        body = await _read_body(request, settings.max_body_bytes)
        # Parsing and checking 500 events takes the interpreter for 2-4 ms: off the
        # event loop, /recommend requests are answered in between.
        events = await run_in_threadpool(read_events, body, settings)
        if limits.ingest is not None:
            limits.ingest.take(principal, len(events))
        if item_cap is not None:
            item_cap.take(principal, [event.item_id for event in events])
    except (Rejected, Limited) as exc:
        metrics.ingest_rejected.labels(reason=exc.reason).inc()
        raise
    try:
        outcome = await run_in_threadpool(store_and_learn, events)
    except Exception:
        if item_cap is not None:  # nothing was stored: the batch may be retried
            item_cap.give_back(principal, [event.item_id for event in events])
        raise
    return IngestResult(
        accepted=outcome.accepted, duplicates=outcome.duplicates, position=outcome.position
    )


#: ``IngestBatch`` is only referenced from ``openapi_extra``; naming it here keeps it in
#: the schema's components (see ``service.app``).
SCHEMA_MODELS = (IngestBatch,)
