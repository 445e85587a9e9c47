"""Sign-in through the organisation's identity provider: the authorization code flow with PKCE
(Authlib's client), the ID token checked with PyJWT (services/api/oidc.py), then the same
server-side session the token form opens (services/api/auth.py `Sessions`).

What ties the IdP's answer to the browser that asked: `state` (random, one use, ten minutes),
kept here with the PKCE verifier and the nonce, and bound to a random value in a short-lived
HttpOnly cookie (SameSite=Lax: it must come back on the IdP's top-level redirect), so a code
obtained in one browser cannot be redeemed in another (login CSRF). The session cookie itself
stays SameSite=Strict; since a browser withholds Strict cookies on a navigation that began on
another site, the callback answers with a page that moves on to the dashboards itself.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from authlib.common.security import generate_token
from authlib.integrations.httpx_client import AsyncOAuth2Client
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from allmende.core.settings import Settings
from allmende.services.api.auth import SESSION_COOKIE, TokenBook, TokenRejected
from allmende.services.api.oidc import IdentityProvider

LOGIN_COOKIE = "allmende_login"  # binds a sign-in's `state` to the browser that started it
LOGIN_TTL_S = 600
MAX_PENDING = 10_000
NO_IDP = "No identity provider is configured here: sign in with a token."

router = APIRouter(prefix="/auth", include_in_schema=False)


@dataclass(frozen=True)
class _Pending:
    browser: str  # SHA-256 of the login cookie's value
    verifier: str
    nonce: str
    expires: float


class PendingSignIns:
    """Sign-ins under way: state -> what the callback needs; one use each, bounded, expiring."""

    def __init__(self) -> None:
        self._open: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def add(self, state: str, pending: _Pending) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._open) >= MAX_PENDING:
                self._open = {k: v for k, v in self._open.items() if v.expires > now}
            while len(self._open) >= MAX_PENDING:
                del self._open[next(iter(self._open))]
            self._open[state] = pending

    def take(self, state: str) -> _Pending | None:
        with self._lock:
            found = self._open.pop(state, None)
        return found if found is not None and found.expires > time.monotonic() else None


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _secure(request: Request) -> bool:
    """Over TLS: the request's scheme, or the public URL's behind a proxy that terminates TLS."""
    settings: Settings = request.app.state.settings
    return (settings.public_url or str(request.url)).startswith("https://")


def _base_url(request: Request, settings: Settings) -> str:
    return (settings.public_url or str(request.base_url)).rstrip("/")


def _client(settings: Settings, redirect_uri: str) -> AsyncOAuth2Client:
    return AsyncOAuth2Client(
        client_id=settings.oidc_client_id,
        client_secret=settings.oidc_client_secret or None,
        scope=settings.oidc_scopes,
        redirect_uri=redirect_uri,
        code_challenge_method="S256",
        timeout=10.0,
    )


def _idp(request: Request) -> IdentityProvider | None:
    idp: IdentityProvider | None = getattr(request.app.state, "idp", None)
    return idp


def _configured(request: Request) -> tuple[IdentityProvider, Settings] | Response:
    """The IdP and the settings, or the page saying there is none."""
    idp = _idp(request)
    if idp is None:
        return _refusal(request, 404, NO_IDP)
    settings: Settings = request.app.state.settings
    return idp, settings


def _refusal(request: Request, status: int, message: str) -> Response:
    from allmende.services.web.routes import page  # the pages' templates (no import cycle at load)

    return page(request, "signin.html", status=status, title="Sign in", message=message)


@router.get("/login")
async def login(request: Request) -> Response:
    configured = _configured(request)
    if isinstance(configured, Response):
        return configured
    idp, settings = configured
    try:
        provider = await run_in_threadpool(idp.provider)
    except TokenRejected as exc:
        return _refusal(request, 503, f"The identity provider does not answer: {exc}")
    browser, verifier, nonce = secrets.token_urlsafe(32), generate_token(64), secrets.token_urlsafe(24)
    async with _client(settings, f"{_base_url(request, settings)}/auth/callback") as client:
        url, state = client.create_authorization_url(
            provider.authorization_endpoint, code_verifier=verifier, nonce=nonce
        )
    pending: PendingSignIns = request.app.state.pending_signins
    pending.add(state, _Pending(_digest(browser), verifier, nonce, time.monotonic() + LOGIN_TTL_S))
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(
        LOGIN_COOKIE,
        browser,
        max_age=LOGIN_TTL_S,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
        path="/auth",
    )
    return response


@router.get("/callback")
async def callback(request: Request) -> Response:
    configured = _configured(request)
    if isinstance(configured, Response):
        return configured
    idp, settings = configured
    params = request.query_params
    if error := params.get("error"):
        detail = params.get("error_description", "")[:300]
        return _refusal(request, 401, f"The identity provider refused the sign-in: {error[:100]} {detail}")
    pending: PendingSignIns = request.app.state.pending_signins
    found = pending.take(params.get("state", "")[:200])
    browser = request.cookies.get(LOGIN_COOKIE, "")
    if found is None or not browser or not secrets.compare_digest(found.browser, _digest(browser)):
        return _refusal(request, 400, "This sign-in has expired or was started elsewhere: sign in again.")
    try:
        provider = await run_in_threadpool(idp.provider)
        async with _client(settings, f"{_base_url(request, settings)}/auth/callback") as client:
            token = await client.fetch_token(
                provider.token_endpoint,
                grant_type="authorization_code",
                code=params.get("code", "")[:4096],
                code_verifier=found.verifier,
            )
        id_token = str(token.get("id_token", ""))
        claims = await run_in_threadpool(idp.id_token_claims, id_token, found.nonce)
    except TokenRejected as exc:
        return _refusal(request, 401, f"The identity provider's answer does not prove who you are: {exc}")
    except Exception as exc:  # the token endpoint's refusal (an OAuth error), or it being away
        message = f"The sign-in could not be completed: {type(exc).__name__}: {exc}"
        return _refusal(request, 401, message[:400])
    principal = idp.roles.principal(claims)
    if principal is None:
        name = idp.roles.name_of(claims)
        return _refusal(
            request,
            403,
            f"You are signed in at the identity provider as {name}, but you are neither an admin nor "
            "a project lead here: the dashboards are for them. Ask an admin to add you to a lead group.",
        )
    book: TokenBook = request.app.state.tokens
    if previous := request.cookies.get(SESSION_COOKIE):
        book.sessions.close(previous)
    # A page, not a redirect: the browser sends the Strict session cookie on a navigation this
    # site starts, not on the tail of a redirect chain the IdP started.
    response = Response(
        '<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=/ui">'
        '<title>Signed in · Allmende</title><p>Signed in. <a href="/ui">On to the dashboards</a>.</p>',
        media_type="text/html",
        headers={"Cache-Control": "no-store"},
    )
    response.set_cookie(
        SESSION_COOKIE,
        book.sessions.open(principal, id_token),
        max_age=int(book.sessions.ttl_s),
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/auth")
    return response


async def end_session_url(request: Request, id_token: str) -> str | None:
    """The IdP's RP-initiated logout for a session signed in through it (back to the sign-in page)."""
    idp = _idp(request)
    if idp is None:
        return None
    try:
        provider = await run_in_threadpool(idp.provider)  # cached since the sign-in, mostly
    except TokenRejected:
        return None
    if not provider.end_session_endpoint:
        return None
    settings: Settings = request.app.state.settings
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": f"{_base_url(request, settings)}/ui/signin",
            "client_id": settings.oidc_client_id,
        }
    )
    return f"{provider.end_session_endpoint}?{query}"
