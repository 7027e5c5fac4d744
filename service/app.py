"""The FastAPI application: routers assembled, state built in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError

from functions.objectstore import open_object_store
from service.api.routes import dashboard, drift, health, ingest, jobs, models, recommend
from service.metrics import Metrics
from service.pipeline import Pipeline
from service.registry import ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.jobs import fail_interrupted_jobs

log = logging.getLogger(__name__)


def build_pipeline(settings: Settings, *, background_retrain: bool = True) -> Pipeline:
    """Database, object store, registry and pipeline, restored from what is stored."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    with db.begin() as conn:
        interrupted = fail_interrupted_jobs(conn)
    if interrupted:
        log.warning("marked %d retraining job(s) interrupted by the last shutdown", interrupted)
    registry = ModelRegistry(db, open_object_store(settings.resolved_object_store_url))
    pipeline = Pipeline(settings, db, registry, Metrics(), background_retrain=background_retrain)
    pipeline.restore()
    return pipeline


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pipeline = build_pipeline(settings)
        app.state.settings = settings
        app.state.pipeline = pipeline
        yield
        pipeline.retrainer.wait(timeout=30)
        pipeline.flush()
        pipeline.db.dispose()

    app = FastAPI(title="Driftline", version="0.1.0", lifespan=lifespan)
    for module in (ingest, recommend, drift, models, jobs, health, dashboard):
        app.include_router(module.router)

    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, exc: DBAPIError) -> JSONResponse:
        log.error("database unavailable: %s", exc.orig)
        return JSONResponse(
            {"detail": "the event store is unavailable; nothing was stored, retry later"},
            status_code=503,
        )

    return app
