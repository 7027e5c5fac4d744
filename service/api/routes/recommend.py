"""GET /recommend: top-K for a user, popular items for a stranger."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool

from service.api.deps import PipelineDep
from service.api.limits import limit_recommend
from service.api.schemas import RecommendationPublic, ScoredItem, answers
from service.ingest.validation import IDENTIFIER_PATTERN

router = APIRouter(tags=["serving"])


@router.get(
    "/recommend",
    response_model=RecommendationPublic,
    responses=answers(422, 429, 503),
    dependencies=[Depends(limit_recommend)],
)
async def recommend(
    pipeline: PipelineDep,
    user_id: Annotated[str, Query(min_length=1, max_length=256, pattern=IDENTIFIER_PATTERN)],
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
) -> RecommendationPublic:
    result = await run_in_threadpool(pipeline.recommend, user_id, k)
    return RecommendationPublic(
        user_id=result.user_id,
        items=[ScoredItem(item_id=item, score=score) for item, score in result.items],
        model_version=result.model_version,
        source=result.source,
    )
