"""GET /models: the registry, with the rollout guard's record of each version; POST
/models/{version}/rollback: serve an earlier version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path
from fastapi.concurrency import run_in_threadpool

from service.api.access import PrincipalDep
from service.api.deps import ReadsDep, RegistryDep, SwapperDep
from service.api.schemas import (
    ModelsPublic,
    RollbackPublic,
    ServingIntervalPublic,
    VersionPublic,
    answers,
)
from service.serving.registry import RollbackRefused

router = APIRouter(tags=["models"])

VersionPath = Annotated[str, Path(min_length=1, max_length=64)]


@router.get("/models", response_model=ModelsPublic, responses=answers(503))
def models(registry: RegistryDep, reads: ReadsDep) -> ModelsPublic:
    rows = registry.versions()
    served: dict[str, list[ServingIntervalPublic]] = {}
    for interval in registry.serving_intervals():
        served.setdefault(interval.version, []).append(
            ServingIntervalPublic(
                started_at=interval.started_at,
                ended_at=interval.ended_at,
                trigger=interval.trigger,
            )
        )
    guarded = reads.rollouts()
    return ModelsPublic(
        current=reads.serving_version,
        versions=[
            VersionPublic(
                **row,
                serving=served.get(row["version"], []),
                guard=guarded.get(row["version"]),
            )
            for row in rows
        ],
        rollbacks=[RollbackPublic(**row) for row in registry.rollbacks()],
    )


@router.post(
    "/models/{version}/rollback",
    response_model=RollbackPublic,
    responses=answers(401, 403, 404, 409, 503),
)
async def rollback(
    swapper: SwapperDep, principal: PrincipalDep, version: VersionPath
) -> RollbackPublic:
    """Serve the earlier ``version`` again (admin); answered once it serves."""
    try:
        record = await run_in_threadpool(swapper.rollback, version, principal.name)
    except RollbackRefused as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    return RollbackPublic(**record)
