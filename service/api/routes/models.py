"""GET /models: the registry."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import PipelineDep
from service.api.schemas import ModelsPublic, VersionPublic, answers

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelsPublic, responses=answers(503))
def models(pipeline: PipelineDep) -> ModelsPublic:
    rows = pipeline.registry.versions()
    return ModelsPublic(
        current=pipeline.serving.version, versions=[VersionPublic(**row) for row in rows]
    )
