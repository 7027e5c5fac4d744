"""The FastAPI application: routers assembled, state built in the lifespan."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from service.api.access import Access, Refused, authorize
from service.api.fastpath import RecommendFastPath
from service.api.hardening import Hardening
from service.api.limits import limits_from
from service.api.openapi import document_access
from service.api.routes import (
    dashboard,
    dashboard_live,
    drift,
    health,
    ingest,
    jobs,
    keys,
    models,
    recommend,
)
from service.api.timing import RequestTimer
from service.auth.keys import KeyRing
from service.auth.sessions import Sessions
from service.dashboard.assets import mount_static
from service.ingest.kafka import EventConsumer
from service.metrics import Metrics
from service.settings import Settings
from service.store import Database, is_unavailable
from service.wiring import RETRAIN_SHUTDOWN_GRACE_S, Driftline, Role, build_driftline

log = logging.getLogger(__name__)


def _freeze_startup_objects() -> None:
    """Take what start-up built out of the garbage collector's reach.

    Imports (river, SQLAlchemy, FastAPI), settings, the components and the serving
    version, hundreds of thousands of tracked objects, live as long as the process, yet
    every full collection would walk them all again and pause every request meanwhile
    (BENCHMARKS.md "serve"). ``gc.freeze`` moves them to a permanent generation, so a
    full collection walks only what was allocated since.
    """
    gc.collect()
    gc.freeze()


def consumer_for(driftline: Driftline) -> EventConsumer:
    """The Kafka consumer the settings describe, feeding ``driftline``."""
    settings = driftline.settings
    assert settings.kafka_bootstrap is not None
    return EventConsumer(
        driftline,
        settings.kafka_bootstrap,
        settings.kafka_topic,
        group=settings.kafka_group,
        replica=settings.replica_id,  # None: <hostname>-<pid>
        session_timeout_ms=settings.kafka_session_timeout_ms,
    )


def create_app(settings: Settings, *, freeze_startup: bool = False) -> FastAPI:
    """The service's ASGI app; ``freeze_startup`` (``driftline serve``) exempts what
    start-up built from garbage collection, once, for a process that serves one app."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # With STREAM_PROCESS the stream role (Kafka, evaluation, the monitor, jobs) runs
        # in a process of its own (``driftline stream``); this one serves.
        role: Role = "serving" if settings.stream_process else "all"
        driftline = build_driftline(settings, metrics=app.state.metrics, role=role)
        driftline.start()
        app.state.settings = settings
        app.state.driftline = driftline
        consumes = settings.kafka_bootstrap and role == "all"
        app.state.consumer = start_consumer(driftline) if consumes else None
        app.state.access = access_for(settings, driftline.db)
        app.state.access.ring.start()
        if freeze_startup:
            _freeze_startup_objects()
        yield
        # One grace for the whole stop: the consumer's batch and a running job share it,
        # so a supervisor's stop timeout (RETRAIN_SHUTDOWN_GRACE_S plus a flush) holds.
        deadline = time.monotonic() + RETRAIN_SHUTDOWN_GRACE_S
        driftline.follower.stop()
        app.state.access.ring.stop()
        if app.state.consumer is not None:
            app.state.consumer.stop()
            app.state.consumer_thread.join(timeout=max(0.0, deadline - time.monotonic()))
        driftline.shut_down(deadline - time.monotonic())
        driftline.db.dispose()

    def start_consumer(driftline: Driftline) -> EventConsumer:
        consumer = consumer_for(driftline)
        app.state.consumer_thread = threading.Thread(
            target=consumer.run, name="kafka-consumer", daemon=True
        )
        app.state.consumer_thread.start()
        return consumer

    metrics = Metrics()
    app = FastAPI(
        title="Driftline",
        version="0.1.0",
        lifespan=lifespan,
        dependencies=[Depends(authorize)],  # every route: see service.api.access
    )
    app.state.metrics = metrics
    app.state.limits = limits_from(settings)
    for module in (ingest, recommend, drift, models, jobs, health, dashboard, dashboard_live, keys):
        app.include_router(module.router)
    mount_static(app)
    # Innermost, so its answers pass the host check, carry the headers and are timed.
    app.add_middleware(RecommendFastPath)
    app.add_middleware(RequestTimer, histogram=metrics.request_seconds, responses=metrics.responses)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    app.add_middleware(Hardening, trusted_hosts=settings.trusted_hosts)
    _document_raw_bodies(app, settings)
    app.add_exception_handler(Refused, _refused)

    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        if not is_unavailable(exc):
            raise exc  # a bug, not an outage: the server's own 500
        reason = getattr(exc, "orig", None) or exc
        if request.url.path == "/ingest":
            request.app.state.driftline.metrics.ingest_rejected.labels(reason="unavailable").inc()
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


def access_for(settings: Settings, db: Database) -> Access:
    """The key ring (loaded now), the session issuer and the open paths."""
    secret = settings.session_secret
    return Access(
        KeyRing(db, settings.key_refresh_seconds),
        Sessions(
            secret.get_secret_value().encode() if secret else None,
            settings.session_hours * 3600,
        ),
        frozenset(settings.public_paths),
    )


async def _refused(request: Request, exc: Exception) -> Response:
    """A 401 of an HTML route is its sign-in page; every other refusal stays JSON."""
    assert isinstance(exc, Refused)
    route = request.scope.get("route")
    html = isinstance(route, APIRoute) and route.response_class is HTMLResponse
    if exc.status_code == 401 and request.method == "GET" and html:
        return HTMLResponse(dashboard.sign_in_page(), status_code=401, headers=exc.headers)
    return await http_exception_handler(request, exc)


def _document_raw_bodies(app: FastAPI, settings: Settings) -> None:
    """Put the models of bodies routes read raw (``/ingest``) into the OpenAPI schema.

    Such a route names its body schema by reference in ``openapi_extra``; FastAPI only
    emits components for models it sees as parameters, so they are added here.
    """
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in ingest.SCHEMA_MODELS:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        document_access(schema, settings)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
