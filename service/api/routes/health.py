"""GET /healthz and GET /metrics."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import SQLAlchemyError

from service.api.deps import DatabaseDep, MetricsDep, ReadsDep
from service.api.schemas import HealthPublic
from service.store.events import count_events

router = APIRouter(tags=["ops"])


@router.get(
    "/healthz",
    response_model=HealthPublic,
    responses={
        200: {"description": "Status, serving version, events and running job."},
        503: {
            "model": HealthPublic,
            "description": "The database is unreachable (same body, status degraded).",
        },
    },
)
def healthz(reads: ReadsDep, db: DatabaseDep, request: Request) -> JSONResponse:
    body: dict[str, Any] = {
        "status": "ok",
        "model_version": reads.serving_version,
        "labelled_events_seen": reads.labelled_seen,
        "retrain_job_running": reads.running_job_id,
        "retrain_policy": reads.policy_status(),
        "prequential": reads.accuracy_summary(),
        "cluster": reads.cluster_status(),
    }
    consumer = getattr(request.app.state, "consumer", None)
    if consumer is not None:
        body["kafka"] = {
            "bootstrap": consumer.bootstrap,
            "topic": consumer.topic,
            **asdict(consumer.state),
        }
    try:
        with db.connect() as conn:
            body["events_stored"] = count_events(conn)
        body["database"] = "ok"
    except SQLAlchemyError as exc:
        body.update(status="degraded", database=f"unreachable: {type(exc).__name__}")
        return _answer(body, 503)
    return _answer(body, 200)


def _answer(body: dict[str, Any], status_code: int) -> JSONResponse:
    """``body`` checked against ``HealthPublic``: returning a response skips FastAPI's check,
    and the status code depends on the database."""
    health = HealthPublic.model_validate(body)
    return JSONResponse(health.model_dump(mode="json", exclude_unset=True), status_code)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format.",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        }
    },
)
def metrics(registry: MetricsDep, reads: ReadsDep) -> Response:
    cluster = reads.cluster_status()
    # Each process counts itself once: a stream process's lease shows on its own port.
    registry.leader.set(1 if cluster["holds_lease"] else 0)
    registry.log_lag_events.set(cluster["log_lag_events"])
    registry.log_applied_position.set(cluster["applied_position"])
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
