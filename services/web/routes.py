"""The browser pages of the burn-rate dashboards: sign-in, the overview, one project's page.

The pages are Jinja2 templates with plain JavaScript that reads the JSON routes of
docs/dashboard-api.md with the session cookie the sign-in form sets (HttpOnly, SameSite=Strict).
The cookie holds an opaque session id, never the token (docs/security.md); sign-out ends the
session here, not only in the browser. ECharts is vendored in the package (`assets`), served from
here: no CDN.
"""

from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from allmende.domain.admin_state import AdminState
from allmende.schemas.events import valid_name
from allmende.services.api.access import readable_projects, require_project
from allmende.services.api.auth import SESSION_COOKIE, Principal, TokenBook, principal_of
from allmende.services.web.assets import ECHARTS, STATIC
from allmende.services.web.oidc_signin import end_session_url

STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
MAX_FORM_BYTES = 8192
templates = Jinja2Templates(
    env=jinja2.Environment(loader=jinja2.PackageLoader("allmende.services.web", "templates"), autoescape=True)
)

router = APIRouter(prefix="/ui", include_in_schema=False)


def _admin_state(request: Request) -> AdminState:
    state: AdminState = request.app.state.dashboard.state()
    return state


def _reader(request: Request) -> Principal | None:
    """The signed-in admin or lead; None (to the sign-in form) for anyone else."""
    principal = principal_of(request)
    return principal if principal is not None and principal.role in ("admin", "lead") else None


def _to_signin() -> RedirectResponse:
    return RedirectResponse("/ui/signin", status_code=303)


def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers={"Cache-Control": "no-store"}
    )


def _period_of(request: Request) -> str:
    period = request.query_params.get("period", "")
    return period if len(period) <= 100 else ""


@router.get("/signin")
async def signin_form(request: Request) -> Response:
    return page(request, "signin.html", title="Sign in", message=None)


@router.post("/signin")
async def signin(request: Request) -> Response:
    body = await request.body()
    fields = parse_qs(body[:MAX_FORM_BYTES].decode("utf-8", "replace")) if len(body) <= MAX_FORM_BYTES else {}
    token = (fields.get("token") or [""])[0].strip()
    book: TokenBook = request.app.state.tokens
    principal = book.who(token) if token else None
    if principal is None or principal.role not in ("admin", "lead"):
        message = (
            "That token is not known. Ask an admin for a project-lead token."
            if principal is None
            else f"{principal.name}'s token is a {principal.role} token: the dashboards are for admins and "
            "project leads."
        )
        return page(request, "signin.html", status=401, title="Sign in", message=message)
    if previous := request.cookies.get(SESSION_COOKIE):
        book.sessions.close(previous)  # signing in again replaces the session, never adds one
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        book.sessions.open(principal),
        max_age=int(book.sessions.ttl_s),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.api_route("/signout", methods=["GET", "POST"])
async def signout(request: Request) -> Response:
    book: TokenBook = request.app.state.tokens
    id_token = None
    if session := request.cookies.get(SESSION_COOKIE):
        _, id_token = book.sessions.close(session)  # the id is worthless from here on, whoever copied it
    # Signed in through the IdP: sign out there too (RP-initiated logout), back to the sign-in page.
    end = await end_session_url(request, id_token) if id_token else None
    response = RedirectResponse(end, status_code=303) if end else _to_signin()
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


@router.get("")
async def home(request: Request) -> Response:
    principal = _reader(request)
    if principal is None:
        return _to_signin()
    if principal.role == "admin":
        return RedirectResponse("/ui/overview", status_code=303)
    projects = readable_projects(_admin_state(request), principal)
    if not projects:
        return page(
            request, "message.html", title="No projects", principal=principal,
            heading="No projects yet",
            sentence=f"{principal.name} leads no project of the current plan.",
        )  # fmt: skip
    return RedirectResponse(f"/ui/projects/{quote(projects[0], safe='')}", status_code=303)


@router.get("/overview")
async def overview(request: Request) -> Response:
    principal = _reader(request)
    if principal is None:
        return _to_signin()
    return page(
        request, "overview.html", title="Overview", principal=principal,
        boot=json.dumps({"page": "overview", "period": _period_of(request)}),
    )  # fmt: skip


@router.get("/projects/{project}")
async def project_page(request: Request, project: str) -> Response:
    principal = _reader(request)
    if principal is None:
        return _to_signin()
    state = _admin_state(request)
    try:
        valid_name(project)
    except ValueError as invalid:
        return page(
            request, "message.html", status=404, title="No such project", principal=principal,
            heading="No such project", sentence=f"{invalid}.",
        )  # fmt: skip
    has_usage = request.app.state.admin.store.project_days(project) is not None
    try:
        require_project(state, principal, project, has_usage=has_usage)
    except HTTPException as refused:
        if refused.status_code == 403:
            heading = "Not your project"
            sentence = f"{project} is not {principal.name}'s project: {refused.detail}."
        else:
            heading = "No such project"
            sentence = f"There is no project {project} in the plan."
        return page(
            request, "message.html", status=refused.status_code, title=heading, principal=principal,
            heading=heading, sentence=sentence,
        )  # fmt: skip
    return page(
        request, "project.html", title=project, principal=principal, project=project,
        boot=json.dumps({"page": "project", "project": project, "period": _period_of(request)}),
    )  # fmt: skip


@router.get("/static/vendor/echarts.min.js")
async def echarts() -> Response:
    return Response(
        _vendored_echarts(), media_type=STATIC_TYPES[".js"], headers={"Cache-Control": "max-age=3600"}
    )


@functools.cache
def _vendored_echarts() -> bytes:
    return ECHARTS.read_bytes()


@router.get("/static/{name}")
async def static(name: str) -> Response:
    path = STATIC / name
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES or not path.is_file():
        raise HTTPException(404, f"no file {name}")
    return Response(path.read_bytes(), media_type=STATIC_TYPES[suffix], headers={"Cache-Control": "no-cache"})
