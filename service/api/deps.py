"""Dependencies the routes declare; built in the app's lifespan, never at import."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.settings import Settings
from service.stream.pipeline import Pipeline


def get_pipeline(request: Request) -> Pipeline:
    return request.app.state.pipeline


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
