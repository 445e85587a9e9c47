"""Usage read side: GPU-hours per project and day, from the `usage_daily` projection."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool

from allmende.schemas.events import NAME_MAX_LENGTH, NAME_PATTERN
from allmende.services.admin_service import AdminService
from allmende.services.api.access import readable_projects, require_project
from allmende.services.api.auth import Principal, Reader
from allmende.services.api.deps import Admins, Store
from allmende.services.api.models import ErrorBody, ProjectUsage, UsageDay, gpu_hours

router = APIRouter(prefix="/v1", tags=["usage"])

MAX_RANGE_DAYS = 3_700  # ten years: a bound on every query
# A project is a name (docs/security.md, "Identifiers"): anything else is refused with a 422.
ProjectName = Annotated[str, Path(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)]


def _default_range(
    span: tuple[dt.date, dt.date], first: dt.date | None, last: dt.date | None
) -> tuple[dt.date, dt.date]:
    """The range asked for, with what is missing filled in from the recorded days, and never
    longer than MAX_RANGE_DAYS: the default range answers whatever one bad event recorded (the
    newest days shown); only a range the caller spelled out whole can be refused as too long."""
    longest = dt.timedelta(days=MAX_RANGE_DAYS)
    if last is None:
        last = span[1] if first is None else min(span[1], first + longest)
    if first is None:
        first = max(span[0], last - longest)
    return first, last


def _usage(
    service: AdminService,
    caller: Principal,
    project: str,
    first: dt.date | None,
    last: dt.date | None,
    group_by: str | None,
) -> ProjectUsage:
    store = service.store
    span = store.project_days(project)
    require_project(service.state(), caller, project, has_usage=span is not None)
    if span is None:
        raise HTTPException(404, f"no usage has been recorded for project {project!r}")
    first, last = _default_range(span, first, last)
    if last < first:
        raise HTTPException(422, f"'to' ({last}) is before 'from' ({first})")
    if (last - first).days > MAX_RANGE_DAYS:
        raise HTTPException(422, f"a range covers at most {MAX_RANGE_DAYS} days")
    rows = store.usage_by_day(project, first, last, group_by)
    days = [
        UsageDay(day=d, group=k if group_by else None, gpu_seconds=s, gpu_hours=gpu_hours(s))
        for d, k, s in rows
    ]
    total = sum(d.gpu_seconds for d in days)
    return ProjectUsage(
        project=project,
        first_day=first,
        last_day=last,
        group_by=group_by,
        total_gpu_seconds=total,
        total_gpu_hours=gpu_hours(total),
        days=days,
    )


@router.get(
    "/projects/{project}/usage",
    response_model=ProjectUsage,
    responses={code: {"model": ErrorBody} for code in (401, 403, 404, 422)},
    summary="GPU-hours of a project per UTC day and in total (admins, and the project's leads)",
)
async def project_usage(
    caller: Reader,
    service: Admins,
    project: ProjectName,
    from_: Annotated[dt.date | None, Query(alias="from", description="first day (UTC), inclusive")] = None,
    to: Annotated[dt.date | None, Query(description="last day (UTC), inclusive")] = None,
    group_by: Annotated[
        Literal["user", "cluster", "gpu_type", "priority_class"] | None,
        Query(description="split each day by this dimension: who or what burns the hours"),
    ] = None,
) -> ProjectUsage:
    return await run_in_threadpool(_usage, service, caller, project, from_, to, group_by)


@router.get(
    "/projects",
    response_model=list[str],
    responses={code: {"model": ErrorBody} for code in (401, 403)},
    summary="Projects that have recorded usage and the caller may read",
)
async def projects(caller: Reader, service: Admins, store: Store) -> list[str]:
    def read() -> list[str]:
        with_usage = store.projects()
        readable = set(readable_projects(service.state(), caller, with_usage))
        return [p for p in with_usage if p in readable]

    return await run_in_threadpool(read)
