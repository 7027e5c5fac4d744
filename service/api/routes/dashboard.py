"""GET /dashboard: one server-rendered page for operators, no JavaScript build."""

from __future__ import annotations

from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from service.api.access import Access, PrincipalDep, read_form
from service.api.deps import PipelineDep
from service.api.schemas import answers
from service.auth.sessions import COOKIE, CSRF_FIELD
from service.store.alerts import list_alerts
from service.store.jobs import list_jobs

router = APIRouter(tags=["ops"])

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}"
    "table{border-collapse:collapse;margin-bottom:2rem}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:right}"
    "th{background:#f3f3f3}h2{margin-top:2rem}"
)


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body or '<tr><td>none yet</td></tr>'}</table>"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def _chart(points: list[dict], width: int = 800, height: int = 220) -> str:
    """Prequential RMSE per heartbeat: served model (blue) and never-retrained (grey)."""
    if len(points) < 2:
        return "<p>Not enough heartbeats yet.</p>"
    xs = [p["events_seen"] for p in points]
    values = [p["rmse"] for p in points] + [p["static_rmse"] or p["rmse"] for p in points]
    low, high = min(values), max(values)
    span_x, span_y = (xs[-1] - xs[0]) or 1, (high - low) or 1

    def path(key: str) -> str:
        coords = (
            f"{(x - xs[0]) / span_x * width:.1f},"
            f"{height - ((p[key] or p['rmse']) - low) / span_y * height:.1f}"
            for x, p in zip(xs, points, strict=True)
        )
        return " ".join(coords)

    return (
        f'<svg width="{width}" height="{height}" style="border:1px solid #ddd">'
        f'<polyline fill="none" stroke="#999" points="{path("static_rmse")}"/>'
        f'<polyline fill="none" stroke="#1565c0" points="{path("rmse")}"/></svg>'
        f"<p>RMSE {low:.3f}–{high:.3f} over {xs[0]}–{xs[-1]} labelled events; "
        "blue: Driftline, grey: never retrained.</p>"
    )


def sign_in_page(message: str = "") -> str:
    """The form an operator signs in with: an API key with the ``read`` scope."""
    notice = f"<p><b>{escape(message)}</b></p>" if message else ""
    return (
        f"<!doctype html><html><head><title>Driftline: sign in</title><style>{_STYLE}"
        "</style></head><body><h1>Driftline</h1>"
        f"{notice}<p>Sign in with an API key that has the <code>read</code> scope "
        "(<code>driftline keys create NAME --scope read</code>).</p>"
        '<form method="post" action="/dashboard/sign-in">'
        '<input type="password" name="key" autocomplete="off" size="60" required> '
        '<button type="submit">Sign in</button></form></body></html>'
    )


def _sign_out_form(request: Request, principal: PrincipalDep) -> str:
    """A sign-out button carrying the session's CSRF token, for a signed-in browser."""
    if principal.session is None:
        return ""
    token = request.app.state.access.sessions.csrf_token(principal.session)
    return (
        '<form method="post" action="/dashboard/sign-out">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{escape(token)}">'
        f"Signed in as <b>{escape(principal.name)}</b> "
        '<button type="submit">Sign out</button></form>'
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
    """303 to the dashboard, with a link for clients that do not follow redirects."""
    link = '<!doctype html><a href="/dashboard">Dashboard</a>'
    return HTMLResponse(link, status_code=303, headers={"Location": "/dashboard"})


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
def dashboard(pipeline: PipelineDep, request: Request, principal: PrincipalDep) -> str:
    with pipeline.db.connect() as conn:
        alerts = list_alerts(conn, 50)
        jobs = list_jobs(conn, 50)
    beats = pipeline.heartbeats()
    summary = pipeline.tracker.summary()
    return (
        f"<!doctype html><html><head><title>Driftline</title><style>{_STYLE}</style></head>"
        f"<body><h1>Driftline</h1>{_sign_out_form(request, principal)}"
        f"<p>Serving model <b>{escape(str(pipeline.serving.version))}"
        f"</b>; {pipeline.labelled_seen} labelled events evaluated.</p>"
        f"<h2>Live accuracy</h2>{_chart(beats)}"
        + _table(
            ["track", "rmse", "events"],
            [[name, t.get("rmse"), t.get("count")] for name, t in summary.items()],
        )
        + "<h2>Drift alerts</h2>"
        + _table(
            ["id", "events seen", "before", "after", "model", "job"],
            [
                [
                    a["id"],
                    a["events_seen"],
                    a["before"],
                    a["after"],
                    a["model_version"],
                    a["retrain_job_id"],
                ]
                for a in alerts
            ],
        )
        + "<h2>Retraining jobs</h2>"
        + _table(
            ["id", "trigger", "status", "runtime", "window", "epochs", "stop", "model", "cost $"],
            [
                [
                    j["id"],
                    j["trigger"],
                    j["status"],
                    j["runtime"],
                    j["window_events"],
                    len(j["epochs"]),
                    j["stop_reason"],
                    j["model_version"],
                    j["cost_usd"],
                ]
                for j in jobs
            ],
        )
        + "</body></html>"
    )
