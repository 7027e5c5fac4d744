"""Dependencies the routes declare: each route asks for the narrow component it uses.

All are built by the composition root (``service.wiring``) in the app's lifespan, never
at import. Each is a coroutine though it never waits: FastAPI runs a plain function
dependency on its thread pool, a hand-off that costs ``/recommend`` more than its
arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated

from fastapi import Depends, Request

from service.cluster.logtail import LogTail
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.reads import StreamReads
from service.rollout.swapper import VersionSwapper
from service.serving.recommender import Recommender
from service.serving.registry import ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.events import IngestOutcome, NewEvent
from service.stream.trigger import RetrainTrigger

#: Stores a batch and passes it along the stream (``Driftline.ingest``, through
#: ``Driftline.coalescing`` where requests arrive together).
IngestPath = Callable[[Sequence[NewEvent]], IngestOutcome]


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_database(request: Request) -> Database:
    return request.app.state.driftline.db


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_ingest(request: Request) -> IngestPath:
    driftline = request.app.state.driftline
    return driftline.coalescing or driftline.ingest


async def get_recommender(request: Request) -> Recommender:
    return request.app.state.driftline.recommender


async def get_registry(request: Request) -> ModelRegistry:
    return request.app.state.driftline.registry


async def get_swapper(request: Request) -> VersionSwapper:
    return request.app.state.driftline.swapper


async def get_trigger(request: Request) -> RetrainTrigger:
    return request.app.state.driftline.trigger


async def get_reads(request: Request) -> StreamReads:
    return request.app.state.driftline.reads


async def get_feed(request: Request) -> EventBuffer:
    return request.app.state.driftline.feed


async def get_log_tail(request: Request) -> LogTail:
    return request.app.state.driftline.tail


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
IngestDep = Annotated[IngestPath, Depends(get_ingest)]
RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
SwapperDep = Annotated[VersionSwapper, Depends(get_swapper)]
TriggerDep = Annotated[RetrainTrigger, Depends(get_trigger)]
ReadsDep = Annotated[StreamReads, Depends(get_reads)]
FeedDep = Annotated[EventBuffer, Depends(get_feed)]
LogTailDep = Annotated[LogTail, Depends(get_log_tail)]
