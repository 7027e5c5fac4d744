"""GET /drift/alerts (each with where its rise comes from) and the prequential heartbeat
series behind them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from service.api.deps import DatabaseDep, ReadsDep
from service.api.schemas import (
    MAX_ALERT_ID,
    MAX_ID,
    AlertDetailPublic,
    AlertPublic,
    AlertsPublic,
    HeartbeatPublic,
    HeartbeatsPublic,
    answers,
)
from service.store.alerts import get_alert, list_alerts

router = APIRouter(tags=["drift"])


@router.get("/drift/alerts", response_model=AlertsPublic, responses=answers(422, 503))
def alerts(db: DatabaseDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> AlertsPublic:
    with db.connect() as conn:
        rows = list_alerts(conn, limit)
    return AlertsPublic(alerts=[AlertPublic(**row) for row in rows])


@router.get(
    "/drift/alerts/{alert_id}", response_model=AlertDetailPublic, responses=answers(404, 422, 503)
)
def alert(
    db: DatabaseDep, alert_id: Annotated[int, Path(ge=1, le=MAX_ALERT_ID)]
) -> AlertDetailPublic:
    """One alert, with how its error rise splits across new and returning users, head and
    tail items, and the users and items whose error rose most."""
    with db.connect() as conn:
        row = get_alert(conn, alert_id)
    if row is None:
        raise HTTPException(404, f"no drift alert {alert_id}")
    return AlertDetailPublic(**row)


@router.get("/drift/heartbeats", response_model=HeartbeatsPublic, responses=answers(422, 503))
def heartbeats(
    reads: ReadsDep, since_events: Annotated[int, Query(ge=0, le=MAX_ID)] = 0
) -> HeartbeatsPublic:
    """Prequential RMSE per heartbeat, of the served model and the never-retrained one."""
    rows = reads.heartbeats(since_events)
    return HeartbeatsPublic(heartbeats=[HeartbeatPublic(**row) for row in rows])
