"""POST /ingest: validated, atomic, idempotent, acknowledged once durable."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from service.api.deps import PipelineDep, SettingsDep
from service.api.schemas import IngestResult
from service.settings import Settings
from service.store.events import NewEvent
from service.validation import parse_event

router = APIRouter(tags=["ingest"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise HTTPException(413, f"request body exceeds the {limit}-byte limit")
    return bytes(body)


def _events_list(body: bytes, settings: Settings) -> list[Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPException(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("events"), list):
        raise HTTPException(422, 'body must be a JSON object {"events": [...]}')
    extra = sorted(set(document) - {"events"})
    if extra:
        raise HTTPException(422, f"unknown top-level fields: {', '.join(extra)}")
    events = document["events"]
    if len(events) > settings.max_batch_events:
        raise HTTPException(
            413, f"batch of {len(events)} events exceeds the limit of {settings.max_batch_events}"
        )
    return events


def validate_events(raw_events: list[Any], settings: Settings) -> list[NewEvent]:
    """Every event parsed, or HTTP 422 naming each bad event's index and field."""
    problems: list[dict[str, Any]] = []
    parsed: list[NewEvent] = []
    for index, raw in enumerate(raw_events):
        event, errors = parse_event(raw, (settings.rating_min, settings.rating_max))
        problems.extend(
            {"index": index, "field": e.field, "msg": f"events[{index}]: {e.message}"}
            for e in errors
        )
        if event is not None:
            parsed.append(event)
    if problems:
        raise HTTPException(422, problems)
    return parsed


@router.post("/ingest", response_model=IngestResult)
async def ingest(request: Request, pipeline: PipelineDep, settings: SettingsDep) -> IngestResult:
    body = await _read_body(request, settings.max_body_bytes)
    events = validate_events(_events_list(body, settings), settings)
    outcome = await run_in_threadpool(pipeline.ingest, events)
    return IngestResult(accepted=outcome.accepted, duplicates=outcome.duplicates)
