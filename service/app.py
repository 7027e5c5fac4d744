"""The FastAPI application: routers assembled, state built in the lifespan."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from functions.objectstore import open_object_store
from service.api.routes import dashboard, drift, health, ingest, jobs, models, recommend
from service.kafka.consumer import EventConsumer
from service.metrics import Metrics
from service.pipeline import Pipeline
from service.registry import ModelRegistry
from service.settings import Settings
from service.store import Database, is_unavailable

log = logging.getLogger(__name__)


def build_pipeline(settings: Settings, *, background_retrain: bool = True) -> Pipeline:
    """Database, object store, registry and pipeline, restored from what is stored."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    registry = ModelRegistry(db, open_object_store(settings.resolved_object_store_url))
    pipeline = Pipeline(settings, db, registry, Metrics(), background_retrain=background_retrain)
    pipeline.restore()
    pipeline.retrainer.resume_interrupted()
    return pipeline


def consumer_for(pipeline: Pipeline) -> EventConsumer:
    """The Kafka consumer the settings describe, feeding ``pipeline``."""
    settings = pipeline.settings
    assert settings.kafka_bootstrap is not None
    return EventConsumer(
        pipeline,
        settings.kafka_bootstrap,
        settings.kafka_topic,
        replica=settings.kafka_replica,
        replicas=settings.kafka_replicas,
    )


def _follow_registry(pipeline: Pipeline, every: float, stop: threading.Event) -> None:
    """Swap in versions other processes publish, until ``stop`` is set."""
    while not stop.wait(every):
        try:
            pipeline.follow_registry()
        except Exception:  # a failed look must not end the loop; the next one may work
            log.exception("could not check the model registry for new versions")


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pipeline = build_pipeline(settings)
        app.state.settings = settings
        app.state.pipeline = pipeline
        app.state.consumer = start_consumer(pipeline) if settings.kafka_bootstrap else None
        stop_following = threading.Event()
        if settings.registry_poll_seconds:
            threading.Thread(
                target=_follow_registry,
                args=(pipeline, settings.registry_poll_seconds, stop_following),
                name="registry-follower",
                daemon=True,
            ).start()
        yield
        stop_following.set()
        if app.state.consumer is not None:
            app.state.consumer.stop()
            app.state.consumer_thread.join(timeout=30)
        pipeline.retrainer.wait(timeout=30)
        pipeline.retrainer.close()
        pipeline.flush()
        pipeline.db.dispose()

    def start_consumer(pipeline: Pipeline) -> EventConsumer:
        consumer = consumer_for(pipeline)
        app.state.consumer_thread = threading.Thread(
            target=consumer.run, name="kafka-consumer", daemon=True
        )
        app.state.consumer_thread.start()
        return consumer

    app = FastAPI(title="Driftline", version="0.1.0", lifespan=lifespan)
    for module in (ingest, recommend, drift, models, jobs, health, dashboard):
        app.include_router(module.router)

    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        if not is_unavailable(exc):
            raise exc  # a bug, not an outage: the server's own 500
        reason = getattr(exc, "orig", None) or exc
        log.error("database unavailable: %s: %s", type(reason).__name__, reason)
        detail = f"the database is unreachable ({type(reason).__name__})"
        if request.method in ("GET", "HEAD"):
            detail += "; retry later"
        else:
            detail += (
                ": the request was not acknowledged; retry it later"
                " (an event with an event_id is never stored twice)"
            )
        return JSONResponse(
            {"detail": detail},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    # What counts as an outage is decided by ``is_unavailable``: lost or refused
    # connections, a closed connection, or no pooled connection in time.
    app.add_exception_handler(DBAPIError, database_unavailable)
    app.add_exception_handler(PoolTimeoutError, database_unavailable)

    return app
