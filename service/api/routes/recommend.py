"""GET /recommend: top-K for a user, popular items for a stranger.

The hot path of the service, kept lean by measurement (``driftline bench serve``,
BENCHMARKS.md): the answer is computed on the event loop when it costs well under a
millisecond (an ANN index serves it, or the catalogue is small enough to score whole),
which saves a thread hand-off per request; and it is encoded with orjson straight to
bytes instead of being validated through the response model and encoded by the
standard library. The response model still documents the answer in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Query, Response
from fastapi.concurrency import run_in_threadpool

from service.api.deps import LogTailDep, RecommenderDep, SettingsDep
from service.api.limits import limit_recommend
from service.api.schemas import RecommendationPublic, answers
from service.ingest.validation import IDENTIFIER_PATTERN

router = APIRouter(tags=["serving"])


@router.get(
    "/recommend",
    response_model=RecommendationPublic,
    responses=answers(422, 429, 503),
    dependencies=[Depends(limit_recommend)],
)
async def recommend(
    recommender: RecommenderDep,
    tail: LogTailDep,
    settings: SettingsDep,
    user_id: Annotated[str, Query(min_length=1, max_length=256, pattern=IDENTIFIER_PATTERN)],
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            description="A position /ingest returned: wait (at most READ_WAIT_MAX_S) until "
            "this replica has applied the event log up to it, so the answer reflects "
            "that batch. The X-Driftline-Position header says where the answer stands.",
        ),
    ] = None,
) -> Response:
    if after is not None and tail.applied() < after:
        await run_in_threadpool(tail.wait_for, after, settings.read_wait_max_s)
    # Read before answering: the answer reflects at least this much of the log.
    position = tail.applied()
    if recommender.is_quick:
        result = recommender.recommend(user_id, k)
    else:  # every item of a large catalogue scored: keep the event loop free meanwhile
        result = await run_in_threadpool(recommender.recommend, user_id, k)
    body = {
        "user_id": result.user_id,
        "items": [{"item_id": item, "score": score} for item, score in result.items],
        "model_version": result.model_version,
        "source": result.source,
    }
    return Response(
        orjson.dumps(body),
        media_type="application/json",
        headers={"X-Driftline-Position": str(position)},
    )
