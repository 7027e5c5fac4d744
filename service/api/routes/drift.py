"""GET /drift/alerts and the prequential heartbeat series behind them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import PipelineDep
from service.api.schemas import (
    MAX_ID,
    AlertPublic,
    AlertsPublic,
    HeartbeatPublic,
    HeartbeatsPublic,
    answers,
)
from service.store.alerts import list_alerts

router = APIRouter(tags=["drift"])


@router.get("/drift/alerts", response_model=AlertsPublic, responses=answers(422, 503))
def alerts(
    pipeline: PipelineDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> AlertsPublic:
    with pipeline.db.connect() as conn:
        rows = list_alerts(conn, limit)
    return AlertsPublic(alerts=[AlertPublic(**row) for row in rows])


@router.get("/drift/heartbeats", response_model=HeartbeatsPublic, responses=answers(422, 503))
def heartbeats(
    pipeline: PipelineDep, since_events: Annotated[int, Query(ge=0, le=MAX_ID)] = 0
) -> HeartbeatsPublic:
    """Prequential RMSE per heartbeat, of the served model and the never-retrained one."""
    rows = pipeline.heartbeats(since_events)
    return HeartbeatsPublic(heartbeats=[HeartbeatPublic(**row) for row in rows])
