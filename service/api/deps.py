"""Dependencies the routes declare; built in the app's lifespan, never at import."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.settings import Settings
from service.stream.pipeline import Pipeline


async def get_pipeline(request: Request) -> Pipeline:
    """A coroutine though it never waits: FastAPI runs a plain function dependency on
    its thread pool, a hand-off that cost ``/recommend`` more than its arithmetic."""
    return request.app.state.pipeline


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
