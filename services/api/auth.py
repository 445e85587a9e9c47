"""Tokens: admins change budgets; project leads read their own projects; the scheduler asks.

Tokens come from the environment (`ALLMENDE_ADMIN_TOKENS`, `ALLMENDE_LEAD_TOKENS`,
`ALLMENDE_SCHEDULER_TOKENS`), each a comma-separated list of `name:token`; the name is the actor
recorded on every event the token's holder causes. Tokens are compared in constant time. A
token travels as `Authorization: Bearer <token>` or, for the browser pages, in the HttpOnly,
SameSite=Strict session cookie the sign-in form sets (never in a URL).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from allmende.core.settings import Settings

Role = Literal["admin", "lead", "scheduler"]
_bearer = HTTPBearer(auto_error=False, description="an admin, project-lead or scheduler token")
SESSION_COOKIE = "allmende_session"  # the browser pages' token (HttpOnly, SameSite=Strict)


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


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


class TokenBook:
    def __init__(self, settings: Settings) -> None:
        self._entries: list[tuple[str, str, Role]] = [
            *((n, t, "admin") for n, t in parse_tokens(settings.admin_tokens, "admin")),
            *((n, t, "lead") for n, t in parse_tokens(settings.lead_tokens, "lead")),
            *((n, t, "scheduler") for n, t in parse_tokens(settings.scheduler_tokens, "scheduler")),
        ]

    def who(self, token: str) -> Principal | None:
        found = None
        for name, known, role in self._entries:
            if hmac.compare_digest(known.encode(), token.encode()) and found is None:
                found = Principal(name, role)
        return found


def _token_of(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    if credentials is not None:
        return credentials.credentials
    return request.cookies.get(SESSION_COOKIE) or None


def principal_of(request: Request) -> Principal | None:
    """Who sent the request (bearer header first, then the session cookie); None if nobody known."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    token = token or request.cookies.get(SESSION_COOKIE, "")
    book: TokenBook = request.app.state.tokens
    return book.who(token) if token else None


def _who(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    token = _token_of(request, credentials)
    if token is None:
        raise HTTPException(
            401, "send a token: Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"}
        )
    book: TokenBook = request.app.state.tokens
    principal = book.who(token)
    if principal is None:
        raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})
    return principal


# One dependency per role, each on the bearer scheme directly: FastAPI solves every level of a
# dependency chain per request, and the scheduler calls once per job.
async def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    return _who(request, credentials)


async def _reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = _who(request, credentials)
    if principal.role not in ("admin", "lead"):
        raise HTTPException(403, f"{principal.name} is neither an admin nor a project lead")
    return principal


async def _admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = _who(request, credentials)
    if principal.role != "admin":
        raise HTTPException(403, f"{principal.name} is not an admin")
    return principal


async def _scheduler(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    principal = _who(request, credentials)
    if principal.role not in ("scheduler", "admin"):
        raise HTTPException(403, f"{principal.name} is not the scheduler (nor an admin)")
    return principal


Caller = Annotated[Principal, Depends(_principal)]
Reader = Annotated[Principal, Depends(_reader)]  # admins and project leads: the read routes
Scheduler = Annotated[Principal, Depends(_scheduler)]
Admin = Annotated[Principal, Depends(_admin)]
