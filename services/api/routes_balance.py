"""Balances and the audit trail of a project: admins read all, leads read the projects they lead."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.concurrency import run_in_threadpool

from domain.admin_state import AdminState
from services.api.admin_models import BalanceOut, EventOut, RejectionBody
from services.api.auth import Caller, Principal
from services.api.deps import Admins
from services.api.routes_usage import ProjectName

router = APIRouter(prefix="/v1", tags=["balances"])
ERRORS: dict[int | str, dict[str, object]] = {code: {"model": RejectionBody} for code in (401, 403, 404, 422)}


def _may_read(state: AdminState, caller: Principal, project: str, has_usage: bool = False) -> None:
    declared = project in state.nodes and state.nodes[project].kind == "project"
    # Usage of an undeclared project is over budget, not lost: admins see it as such.
    if not declared and not (has_usage and caller.role == "admin"):
        raise HTTPException(404, f"no project {project!r}")
    if caller.role != "admin" and caller.name not in state.leads_of(project):
        raise HTTPException(403, f"{caller.name} does not lead {project} (nor a group above it)")


@router.get(
    "/projects/{project}/balance",
    response_model=BalanceOut,
    responses=ERRORS,
    summary="Allocated, charged, held and remaining GPU-hours per allocation, now or as of an instant",
)
async def balance(
    project: ProjectName,
    caller: Caller,
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
        _may_read(state, caller, project, has_usage=service.store.project_days(project) is not None)
        return BalanceOut.of(service.balance(project, at, state), period)

    return await run_in_threadpool(read)


@router.get(
    "/projects/{project}/history",
    response_model=list[EventOut],
    responses=ERRORS,
    summary="The audit trail: every admin event that touched the project, oldest first",
)
async def history(project: ProjectName, caller: Caller, service: Admins) -> list[EventOut]:
    def read() -> list[EventOut]:
        state = service.state()
        _may_read(state, caller, project)
        return [EventOut.of(e) for e in state.history_of(project)]

    return await run_in_threadpool(read)
