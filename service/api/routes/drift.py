"""GET /drift/alerts and the prequential heartbeat series behind them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.deps import PipelineDep
from service.api.schemas import AlertPublic, AlertsPublic
from service.store.alerts import list_alerts

router = APIRouter(tags=["drift"])


@router.get("/drift/alerts", response_model=AlertsPublic)
def alerts(
    pipeline: PipelineDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> AlertsPublic:
    with pipeline.db.connect() as conn:
        rows = list_alerts(conn, limit)
    return AlertsPublic(alerts=[AlertPublic(**row) for row in rows])


@router.get("/drift/heartbeats")
def heartbeats(
    pipeline: PipelineDep, since_events: Annotated[int, Query(ge=0)] = 0
) -> dict[str, Any]:
    """Prequential RMSE per heartbeat, of the served model and the never-retrained one."""
    return {"heartbeats": pipeline.heartbeats(since_events)}
