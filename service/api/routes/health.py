"""GET /healthz and GET /metrics."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import SQLAlchemyError

from service.api.deps import PipelineDep
from service.store.events import count_events

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz(pipeline: PipelineDep, request: Request) -> JSONResponse:
    body: dict[str, Any] = {
        "status": "ok",
        "model_version": pipeline.serving.version,
        "labelled_events_seen": pipeline.labelled_seen,
        "retrain_job_running": pipeline.retrainer.active_job_id,
        "prequential": pipeline.tracker.summary(),
    }
    consumer = getattr(request.app.state, "consumer", None)
    if consumer is not None:
        body["kafka"] = {
            "bootstrap": consumer.bootstrap,
            "topic": consumer.topic,
            **asdict(consumer.state),
        }
    try:
        with pipeline.db.connect() as conn:
            body["events_stored"] = count_events(conn)
        body["database"] = "ok"
    except SQLAlchemyError as exc:
        body.update(status="degraded", database=f"unreachable: {type(exc).__name__}")
        return JSONResponse(body, status_code=503)
    return JSONResponse(body)


@router.get("/metrics")
def metrics(pipeline: PipelineDep) -> Response:
    return Response(pipeline.metrics.render(), media_type=CONTENT_TYPE_LATEST)
