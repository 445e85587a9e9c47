"""Allocation requests: a project's lead asks for more GPU-hours, a later end of an allocation, or
a time-slice window, with a reason; admins approve (possibly another amount) or deny, with a
comment. An approval is the same admin event `budget apply` or the admin routes would write
(`AllocationGranted`, `AllocationExtended`, `AgreementGranted`), followed by the decision, in one
batch: balances, history and the plan diff show it. Every step is an admin event with its actor.

Who: the project's leads (and admins) ask and read its requests; only admins decide and see every
open request. Another project's lead gets 403, as for its balance.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool

from allmende.domain.admin_state import AdminState
from allmende.domain.allocation_requests import AllocationRequest, request_id_of
from allmende.domain.allocations import default_allocation_id, quarter_bounds, quarter_of
from allmende.schemas.admin_events import (
    AdminEvent,
    AgreementGranted,
    AllocationAdjusted,
    AllocationExtended,
    AllocationGranted,
    AllocationRequestDecided,
    AllocationRequested,
)
from allmende.services.admin_service import AdminService
from allmende.services.api.access import require_project
from allmende.services.api.admin_models import (
    AllocationRequestIn,
    AllocationRequestOut,
    CommandResult,
    DecisionIn,
    EventOut,
    hours_to_units,
)
from allmende.services.api.auth import Admin, Principal, Reader
from allmende.services.api.deps import Admins
from allmende.services.api.routes_admin import ERRORS, IdempotencyKey, _base, _run
from allmende.services.api.routes_usage import ProjectName

router = APIRouter(prefix="/v1", tags=["requests"])
RequestId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")]


def _out(state: AdminState, request: AllocationRequest) -> AllocationRequestOut:
    granted = request.decided.granted_event_id if request.decided else None
    return AllocationRequestOut.of(request, state.by_id.get(granted) if granted else None)


def _asked(
    service: AdminService, caller: Principal, project: str, body: AllocationRequestIn, key: str | None
) -> AllocationRequested:
    fields: dict[str, object] = {}
    if body.kind == "gpu-hours":
        if body.gpu_hours is None:
            raise ValueError("a request for GPU-hours says how many (gpu_hours)")
        label = body.period or quarter_of(service.now())
        start, end = quarter_bounds(label)
        fields = {"amount_units": hours_to_units(body.gpu_hours), "period": label, "period_start": start,
                  "period_end": end, "cluster": body.cluster}  # fmt: skip
    elif body.kind == "extension":
        if body.extend_to is None or body.extend_to.tzinfo is None or body.allocation_id is None:
            raise ValueError("an extension names the allocation and its new end, with a time zone")
        fields = {"allocation_id": body.allocation_id, "extend_to": int(body.extend_to.timestamp())}
    else:
        fields = {"cluster": body.cluster, "gpus": body.gpus, "window": body.window}
    return AllocationRequested(
        **_base(service, caller.name, body.reason, key, "request"),
        request_id=request_id_of(key, uuid.uuid4().hex),
        project=project,
        kind=body.kind,
        **fields,
    )


@router.post(
    "/projects/{project}/requests",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Ask for more GPU-hours, a later end, or a time-slice window (the project's leads)",
)
async def ask(
    project: ProjectName,
    body: AllocationRequestIn,
    caller: Reader,
    service: Admins,
    key: IdempotencyKey = None,
) -> CommandResult:
    require_project(await run_in_threadpool(service.state), caller, project)
    try:
        event = _asked(service, caller, project, body, key)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return await _run(service, [event])


@router.get(
    "/projects/{project}/requests",
    response_model=list[AllocationRequestOut],
    responses=ERRORS,
    summary="The project's requests and their decisions, newest first",
)
async def project_requests(
    project: ProjectName, caller: Reader, service: Admins
) -> list[AllocationRequestOut]:
    state = await run_in_threadpool(service.state)
    require_project(state, caller, project)
    mine = [r for r in state.requests.values() if r.project == project]
    return [_out(state, r) for r in reversed(mine)]


@router.get(
    "/admin/requests",
    response_model=list[AllocationRequestOut],
    responses=ERRORS,
    summary="Every project's requests (open ones by default), oldest first",
)
async def all_requests(
    admin: Admin,
    service: Admins,
    status: Annotated[Literal["open", "approved", "denied", "all"], Query()] = "open",
) -> list[AllocationRequestOut]:
    state = await run_in_threadpool(service.state)
    return [_out(state, r) for r in state.requests.values() if status in ("all", r.status)]


def _grant(
    service: AdminService, state: AdminState, admin: str, request: AllocationRequest, body: DecisionIn
) -> AdminEvent:
    """The event an approval writes: what `budget apply` or the admin routes would."""
    asked, rid = request.asked, request.request_id
    envelope = _base(service, admin, body.comment or asked.reason, rid, "request-grant")
    if asked.kind == "gpu-hours":
        assert asked.period is not None and asked.period_start is not None and asked.period_end is not None
        units = hours_to_units(body.gpu_hours) if body.gpu_hours is not None else asked.amount_units
        # The id a plan's allocation of the project, period and cluster has: a top-up of the plan's
        # allocation adjusts it (the plan diff then shows the plan file is behind); else a grant a
        # later plan listing it would take over.
        allocation_id = default_allocation_id(asked.project, asked.period, asked.cluster, None)
        held = state.allocations.get(allocation_id)
        if held is not None and not held.expired:
            return AllocationAdjusted(**envelope, allocation_id=allocation_id, delta_units=units)
        return AllocationGranted(
            **envelope, allocation_id=allocation_id, project=asked.project, period=asked.period,
            period_start=asked.period_start, period_end=asked.period_end, amount_units=units,
            cluster=asked.cluster,
        )  # fmt: skip
    if body.gpu_hours is not None:
        raise ValueError(f"request {rid} is for {asked.kind}, not GPU-hours: approve it without gpu_hours")
    if asked.kind == "extension":
        assert asked.allocation_id is not None and asked.extend_to is not None
        return AllocationExtended(**envelope, allocation_id=asked.allocation_id, period_end=asked.extend_to)
    assert asked.cluster is not None and asked.gpus is not None and asked.window is not None
    return AgreementGranted(
        **envelope, agreement_id=f"{asked.project}-{rid}", project=asked.project, cluster=asked.cluster,
        gpus=asked.gpus, window=asked.window,
    )  # fmt: skip


@router.post(
    "/admin/requests/{request_id}/decision",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Approve (possibly another amount) or deny a request, with a comment",
)
async def decide(request_id: RequestId, body: DecisionIn, admin: Admin, service: Admins) -> CommandResult:
    state = await run_in_threadpool(service.state)
    request = state.requests.get(request_id)
    if request is None:
        raise HTTPException(404, f"no request {request_id!r}")
    wanted = "approved" if body.decision == "approve" else "denied"
    if request.decided is not None:
        held = request.decided
        if held.decision != wanted:
            raise HTTPException(409, f"request {request_id} was {held.decision} by {held.actor} already")
        # A retry: what the decision wrote, unchanged (its grant may have changed what a new
        # approval would build, e.g. the allocation it created now exists).
        granted = state.by_id.get(held.granted_event_id) if held.granted_event_id else None
        return CommandResult(applied=[], unchanged=[EventOut.of(e) for e in (granted, held) if e is not None])
    events: list[AdminEvent] = []
    try:
        if body.decision == "approve":
            events.append(_grant(service, state, admin.name, request, body))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    events.append(
        AllocationRequestDecided(
            **_base(service, admin.name, body.comment, request_id, "request-decision"),
            request_id=request_id,
            decision="approved" if events else "denied",
            granted_event_id=events[0].event_id if events else None,
        )
    )
    return await _run(service, events)
