"""API keys over HTTP (admin): list, create, revoke; the CLI does the same offline."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool

from service.api.deps import DatabaseDep
from service.api.schemas import (
    ApiKeyCreated,
    ApiKeyIn,
    ApiKeyPublic,
    ApiKeyRevoked,
    ApiKeysPublic,
    answers,
)
from service.auth.keys import KEY_NAME_PATTERN, KeyExists, create_key, revoke
from service.store.keys import list_keys

router = APIRouter(tags=["keys"])

KeyName = Annotated[str, Path(pattern=KEY_NAME_PATTERN)]


@router.get("/keys", response_model=ApiKeysPublic, responses=answers(503))
def keys(db: DatabaseDep) -> ApiKeysPublic:
    """Keys in force: names, scopes and when each was created and last used."""
    with db.connect() as conn:
        rows = list_keys(conn)
    return ApiKeysPublic(keys=[ApiKeyPublic(**row) for row in rows])


@router.post(
    "/keys", response_model=ApiKeyCreated, status_code=201, responses=answers(400, 409, 422, 503)
)
async def create(body: ApiKeyIn, request: Request, db: DatabaseDep) -> ApiKeyCreated:
    """Mint a key; its secret is in this answer and nowhere else, ever."""
    try:
        issued = await run_in_threadpool(create_key, db, body.name, body.scopes)
    except KeyExists as exc:
        raise HTTPException(409, str(exc)) from exc
    request.app.state.access.ring.refresh()
    return ApiKeyCreated(name=issued.name, scopes=issued.scopes, key=issued.token)


@router.delete("/keys/{name}", response_model=ApiKeyRevoked, responses=answers(404, 422, 503))
async def delete(name: KeyName, request: Request, db: DatabaseDep) -> ApiKeyRevoked:
    """Revoke a key: requests carrying it are refused from this answer on."""
    if not await run_in_threadpool(revoke, db, name):
        raise HTTPException(404, f"no key named {name!r} is in force")
    request.app.state.access.ring.refresh()
    return ApiKeyRevoked(name=name, revoked=True)
