"""Tokens: admins change budgets; project leads read their own projects; the scheduler asks.

Tokens come from the environment (`ALLMENDE_ADMIN_TOKENS`, `ALLMENDE_LEAD_TOKENS`,
`ALLMENDE_SCHEDULER_TOKENS`, `ALLMENDE_SUBMIT_TOKENS`: may only ask for admission, the token
Slurm's cli_filter sends from users' own commands), each a comma-separated list of
`name:token`; the name is the actor recorded on every event the token's holder causes. Tokens
are compared in constant time. A token travels as `Authorization: Bearer <token>`, never in a URL
and never in a cookie: the sign-in form of the browser pages takes the token once and opens a
session (`Sessions`), whose opaque random id is what the HttpOnly, SameSite=Strict cookie holds.
See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from allmende.core.settings import Settings

Role = Literal["admin", "lead", "scheduler", "submitter"]
_bearer = HTTPBearer(auto_error=False, description="an admin, project-lead or scheduler token")
SESSION_COOKIE = "allmende_session"  # the browser pages' session id (HttpOnly, SameSite=Strict)


class TokenRejected(Exception):
    """A token that does not prove who sent it; the message says why (for a 401)."""


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    # Nodes (projects, groups) led by the identity provider's say (services/api/oidc.py), beside
    # those whose plan names this lead.
    led: frozenset[str] = frozenset()


def parse_tokens(spec: str, default_name: str) -> list[tuple[str, str]]:
    """`alice:t1,bob:t2` -> [(alice, t1), (bob, t2)]; a bare token gets `default_name`."""
    pairs = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, token = item.partition(":")
        pairs.append((name, token) if sep else (default_name, name))
    return pairs


class Sessions:
    """Browser sessions, in this process's memory: an opaque random id -> who signed in, until when.

    The id (256 random bits) is all the cookie holds; it is kept here only as its SHA-256, so a
    lookup compares no secret. A session ends at sign-out, `ttl_s` after sign-in (absolute) or when
    `max_sessions` newer ones push it out (the oldest first); a restart ends them all.
    """

    def __init__(self, ttl_s: float, max_sessions: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        # digest -> (who, expires, the IdP's ID token for its sign-out); oldest first
        self._open: dict[str, tuple[Principal, float, str | None]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def open(self, principal: Principal, id_token: str | None = None) -> str:
        """A new session for `principal` (signed in through the IdP: with its ID token); its id."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            if len(self._open) >= self.max_sessions:
                self._open = {k: v for k, v in self._open.items() if v[1] > now}
            while len(self._open) >= self.max_sessions:
                del self._open[next(iter(self._open))]
            self._open[self._key(session_id)] = (principal, now + self.ttl_s, id_token)
        return session_id

    def who(self, session_id: str) -> Principal | None:
        """Who holds this session; None if it is unknown, ended or expired."""
        if not session_id or len(session_id) > 200:
            return None
        key = self._key(session_id)
        with self._lock:
            found = self._open.get(key)
            if found is None:
                return None
            if found[1] <= self.clock():
                del self._open[key]
                return None
            return found[0]

    def close(self, session_id: str) -> tuple[bool, str | None]:
        """End the session (sign-out): whether it was open, and the IdP's ID token it held."""
        with self._lock:
            found = self._open.pop(self._key(session_id), None)
        return (False, None) if found is None else (True, found[2])

    def __len__(self) -> int:
        return len(self._open)


class TokenBook:
    def __init__(self, settings: Settings) -> None:
        self._entries: list[tuple[str, str, Role]] = [
            *((n, t, "admin") for n, t in parse_tokens(settings.admin_tokens, "admin")),
            *((n, t, "lead") for n, t in parse_tokens(settings.lead_tokens, "lead")),
            *((n, t, "scheduler") for n, t in parse_tokens(settings.scheduler_tokens, "scheduler")),
            *((n, t, "submitter") for n, t in parse_tokens(settings.submit_tokens, "submitter")),
        ]
        self.sessions = Sessions(settings.session_ttl_s, settings.session_max)

    def who(self, token: str) -> Principal | None:
        found = None
        for name, known, role in self._entries:
            if hmac.compare_digest(known.encode(), token.encode()) and found is None:
                found = Principal(name, role)
        return found


def principal_of(request: Request) -> Principal | None:
    """Who sent the request (bearer token first, then the session cookie); None if nobody known."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    book: TokenBook = request.app.state.tokens
    if token:
        return book.who(token)
    session = request.cookies.get(SESSION_COOKIE, "")
    return book.sessions.who(session) if session else None


async def _who(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    book: TokenBook = request.app.state.tokens
    if credentials is not None:
        principal = book.who(credentials.credentials)
        if principal is None:
            principal = await _idp_principal(request, credentials.credentials)
        return principal
    session = request.cookies.get(SESSION_COOKIE)
    if not session:
        raise HTTPException(
            401, "send a token: Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"}
        )
    principal = book.sessions.who(session)
    if principal is None:
        raise HTTPException(
            401,
            "the session has ended (signed out or expired): sign in again",
            {"WWW-Authenticate": "Bearer"},
        )
    return principal


async def _idp_principal(request: Request, token: str) -> Principal:
    """The principal an access token of the organisation's identity provider proves (401 if none)."""
    idp = getattr(request.app.state, "idp", None)  # services/api/oidc.py's IdentityProvider
    if idp is None or not idp.may_have_issued(token):
        raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})
    try:  # a key id not cached fetches the IdP's keys: off the event loop
        principal: Principal = await run_in_threadpool(idp.bearer_principal, token)
    except TokenRejected as exc:
        raise HTTPException(401, str(exc), {"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None
    except PermissionError as exc:
        raise HTTPException(403, str(exc)) from None
    return principal


# One dependency per role, each on the bearer scheme directly: FastAPI solves every level of a
# dependency chain per request, and the scheduler calls once per job.
async def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    return await _who(request, credentials)


async def _reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = await _who(request, credentials)
    if principal.role not in ("admin", "lead"):
        raise HTTPException(403, f"{principal.name} is neither an admin nor a project lead")
    return principal


async def _admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = await _who(request, credentials)
    if principal.role != "admin":
        raise HTTPException(403, f"{principal.name} is not an admin")
    return principal


async def _scheduler(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = await _who(request, credentials)
    if principal.role not in ("scheduler", "admin"):
        raise HTTPException(403, f"{principal.name} is not the scheduler (nor an admin)")
    return principal


async def _submitter(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = await _who(request, credentials)
    if principal.role not in ("scheduler", "admin", "submitter"):
        raise HTTPException(403, f"{principal.name} may not ask for admission")
    return principal


Caller = Annotated[Principal, Depends(_principal)]
Reader = Annotated[Principal, Depends(_reader)]  # admins and project leads: the read routes
Scheduler = Annotated[Principal, Depends(_scheduler)]
Submitter = Annotated[Principal, Depends(_submitter)]  # the scheduler, admins, submit tokens
Admin = Annotated[Principal, Depends(_admin)]
