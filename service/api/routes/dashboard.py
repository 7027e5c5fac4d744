"""The ops dashboard: server-rendered pages (Jinja2, service/dashboard/templates), the
chart data they draw, and the forms behind their buttons.

Pages read the same functions as the JSON endpoints (service/dashboard/views.py). Forms
post with the session's CSRF token; acknowledging an alert and rolling back are admin
actions (POST routes need ``admin`` unless ``RIGHTS`` says otherwise).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from service.api.access import Access, Principal, PrincipalDep, read_form
from service.api.deps import DatabaseDep, ReadsDep, SettingsDep, SwapperDep
from service.api.schemas import MAX_ALERT_ID, MAX_JOB_ID, AlertDetailPublic, answers
from service.auth.sessions import COOKIE, CSRF_FIELD
from service.dashboard import views
from service.dashboard.pages import render
from service.serving.registry import RollbackRefused
from service.store.alerts import acknowledge_alert

router = APIRouter(tags=["ops"])

AlertId = Annotated[int, Path(ge=1, le=MAX_ALERT_ID)]
JobId = Annotated[int, Path(ge=1, le=MAX_JOB_ID)]
VersionPath = Annotated[str, Path(min_length=1, max_length=64)]


def sign_in_page(message: str = "") -> str:
    """The form an operator signs in with: an API key with the ``read`` scope."""
    return render("sign_in.html", title="Sign in", page="sign-in", message=message)


def _page(
    request: Request, principal: Principal, template: str, title: str, page: str, **context: Any
) -> str:
    """A page with the header every page shares (navigation, who is signed in, and the
    CSRF token the page's forms carry)."""
    token = ""
    if principal.session is not None:
        token = request.app.state.access.sessions.csrf_token(principal.session)
    return render(
        template,
        title=title,
        page=page,
        signed_in_as=principal.name if principal.session is not None else None,
        csrf_field=CSRF_FIELD,
        csrf_token=token,
        # The live stream resumes after the newest event the page was rendered with.
        last_event_id=request.app.state.driftline.feed.newest_id,
        **context,
    )


_FORM_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {
                    "type": "object",
                    "properties": {"key": {"type": "string", "minLength": 1}},
                    "required": ["key"],
                    "additionalProperties": False,
                }
            }
        },
    }
}


def _json(refusals: dict[int | str, dict]) -> dict[int | str, dict]:
    """Refusals documented as the JSON they are, on a route whose pages are HTML."""
    ref = {"$ref": "#/components/schemas/ErrorPublic"}
    return {
        code: {
            "description": answer["description"],
            "content": {"application/json": {"schema": ref}},
        }
        for code, answer in refusals.items()
    }


def _to_dashboard() -> HTMLResponse:
    """303 to the dashboard."""
    return _see_other("/dashboard")


_HTML_401 = {
    "description": "The sign-in page, saying the key was refused.",
    "content": {"text/html": {"schema": {"type": "string"}}},
}


@router.post(
    "/dashboard/sign-in",
    response_class=HTMLResponse,
    status_code=303,
    responses={
        303: {"description": "Signed in: the session cookie is set; go to the dashboard."},
        401: _HTML_401,
        **_json(answers(400, 413)),
    },
    openapi_extra=_FORM_BODY,
)
async def sign_in(request: Request) -> Response:
    """Exchange a key (form field ``key``) for an HttpOnly, SameSite=Strict session."""
    access: Access = request.app.state.access
    snapshot = access.ring.snapshot
    if not snapshot.enforced:
        return _to_dashboard()  # open: nothing to sign in to
    entry = snapshot.match((await read_form(request)).get("key", "").strip())
    if entry is None or "read" not in entry.rights:
        page = sign_in_page("That key is wrong, revoked, or lacks the read scope.")
        return HTMLResponse(page, status_code=401)
    answer = _to_dashboard()
    answer.set_cookie(
        COOKIE,
        access.sessions.issue(entry),
        max_age=int(access.sessions.lifetime_seconds),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@router.post(
    "/dashboard/sign-out",
    response_class=HTMLResponse,
    status_code=303,
    responses={303: {"description": "Signed out: the session cookie is cleared."}},
)
async def sign_out() -> Response:
    """End the browser's session (a state-changing action: it needs the CSRF token)."""
    answer = _to_dashboard()
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer


@router.get("/dashboard", response_class=HTMLResponse, responses=answers(503))
def dashboard(
    reads: ReadsDep, settings: SettingsDep, request: Request, principal: PrincipalDep
) -> str:
    """Overview: what serves, how well, events in, Kafka lag, the running job, spend."""
    consumer = getattr(request.app.state, "consumer", None)
    # With STREAM_PROCESS the replica's stream process consumes Kafka, not this one.
    consumed_elsewhere = consumer is None and bool(
        settings.kafka_bootstrap and settings.stream_process
    )
    summary = views.overview(reads, consumer, consumed_elsewhere=consumed_elsewhere)
    return _page(request, principal, "overview.html", "Overview", "overview", o=summary)


@router.get("/dashboard/data/accuracy", responses=answers(503))
def accuracy_data(reads: ReadsDep) -> dict[str, Any]:
    """What the accuracy chart draws: heartbeats, alerts, swaps, job spans, threshold."""
    return views.accuracy_series(reads)


@router.get("/dashboard/alerts", response_class=HTMLResponse, responses=_json(answers(503)))
def alerts_page(reads: ReadsDep, request: Request, principal: PrincipalDep) -> str:
    context = views.alerts_page(reads)
    return _page(request, principal, "alerts.html", "Drift alerts", "alerts", **context)


@router.get(
    "/dashboard/alerts/{alert_id}",
    response_class=HTMLResponse,
    responses=_json(answers(404, 422, 503)),
)
def alert_page(
    reads: ReadsDep, request: Request, principal: PrincipalDep, alert_id: AlertId
) -> str:
    context = views.alert_page(reads, alert_id)
    if context is None:
        raise HTTPException(404, f"no drift alert {alert_id}")
    return _page(request, principal, "alert.html", f"Alert #{alert_id}", "alerts", **context)


@router.post(
    "/drift/alerts/{alert_id}/acknowledge",
    response_model=AlertDetailPublic,
    tags=["drift"],
    responses=answers(401, 403, 404, 422, 503),
)
def acknowledge(db: DatabaseDep, principal: PrincipalDep, alert_id: AlertId) -> Any:
    """Mark the alert seen (admin); the first acknowledgement stands, repeating it is
    harmless."""
    with db.begin() as conn:
        row = acknowledge_alert(conn, alert_id, principal.name, time.time())
    if row is None:
        raise HTTPException(404, f"no drift alert {alert_id}")
    return AlertDetailPublic(**row)


@router.post(
    "/dashboard/alerts/{alert_id}/acknowledge",
    response_class=HTMLResponse,
    status_code=303,
    responses={
        303: {"description": "Acknowledged: back to the alert's page."},
        **_json(answers(401, 403, 404, 422, 503)),
    },
)
def acknowledge_form(db: DatabaseDep, principal: PrincipalDep, alert_id: AlertId) -> Response:
    """The alert page's button (admin, with the session's CSRF token)."""
    acknowledge(db, principal, alert_id)
    return _see_other(f"/dashboard/alerts/{alert_id}")


@router.get("/dashboard/jobs", response_class=HTMLResponse, responses=_json(answers(503)))
def jobs_page(reads: ReadsDep, request: Request, principal: PrincipalDep) -> str:
    context = views.jobs_page(reads)
    return _page(request, principal, "jobs.html", "Retraining jobs", "jobs", **context)


@router.get(
    "/dashboard/jobs/{job_id}", response_class=HTMLResponse, responses=_json(answers(404, 422, 503))
)
def job_page(reads: ReadsDep, request: Request, principal: PrincipalDep, job_id: JobId) -> str:
    context = views.job_page(reads, job_id)
    if context is None:
        raise HTTPException(404, f"no retraining job {job_id}")
    return _page(request, principal, "job.html", f"Job #{job_id}", "jobs", **context)


@router.get("/dashboard/versions", response_class=HTMLResponse, responses=_json(answers(503)))
def versions_page(reads: ReadsDep, request: Request, principal: PrincipalDep) -> str:
    context = views.versions_page(reads)
    return _page(request, principal, "versions.html", "Model versions", "versions", **context)


@router.post(
    "/dashboard/versions/{version}/rollback",
    response_class=HTMLResponse,
    status_code=303,
    responses={
        303: {"description": "Rolled back: back to the versions page."},
        **_json(answers(401, 403, 404, 409, 422, 503)),
    },
)
async def rollback_form(
    swapper: SwapperDep, principal: PrincipalDep, version: VersionPath
) -> Response:
    """The versions page's button: the registry's rollback, as POST /models/{version}/rollback
    does it (admin, recorded, reversible by rolling back again)."""
    try:
        await run_in_threadpool(swapper.rollback, version, principal.name)
    except RollbackRefused as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    return _see_other("/dashboard/versions")


def _see_other(location: str) -> HTMLResponse:
    """303 to ``location``, with a link for clients that do not follow redirects."""
    link = f'<!doctype html><a href="{location}">Continue</a>'
    return HTMLResponse(link, status_code=303, headers={"Location": location})
