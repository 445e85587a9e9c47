"""Balances and the audit trail of a project: admins read all, leads read the projects they lead."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.concurrency import run_in_threadpool

from allmende.services.api.access import require_project
from allmende.services.api.admin_models import BalanceOut, EventOut, RejectionBody
from allmende.services.api.auth import Reader
from allmende.services.api.deps import Admins
from allmende.services.api.routes_usage import ProjectName

router = APIRouter(prefix="/v1", tags=["balances"])
ERRORS: dict[int | str, dict[str, object]] = {code: {"model": RejectionBody} for code in (401, 403, 404, 422)}


@router.get(
    "/projects/{project}/balance",
    response_model=BalanceOut,
    responses=ERRORS,
    summary="Allocated, charged, held and remaining GPU-hours per allocation, now or as of an instant",
)
async def balance(
    project: ProjectName,
    caller: Reader,
    service: Admins,
    as_of: Annotated[
        dt.datetime | None,
        Query(
            description="an instant (ISO 8601 with a zone, or Unix seconds): "
            "the balance a replay of the events up to then gives"
        ),
    ] = None,
    period: Annotated[str | None, Query(max_length=100, description="only this period, e.g. 2027-Q1")] = None,
) -> BalanceOut:
    if as_of is not None and as_of.tzinfo is None:
        raise HTTPException(422, "as_of needs a time zone (Z or an offset)")
    at = int(as_of.timestamp()) if as_of is not None else None

    def read() -> BalanceOut:
        state = service.state()
        require_project(state, caller, project, has_usage=service.store.project_days(project) is not None)
        return BalanceOut.of(service.balance(project, at, state), period)

    return await run_in_threadpool(read)


@router.get(
    "/projects/{project}/history",
    response_model=list[EventOut],
    responses=ERRORS,
    summary="The audit trail: every admin event that touched the project, oldest first",
)
async def history(project: ProjectName, caller: Reader, service: Admins) -> list[EventOut]:
    def read() -> list[EventOut]:
        state = service.state()
        require_project(state, caller, project)
        return [EventOut.of(e) for e in state.history_of(project)]

    return await run_in_threadpool(read)
