"""The JSON (and CSV) behind the dashboard pages: burn rate, breakdowns, jobs, squatting, overview.

docs/dashboard-api.md is the contract. Every route needs a reader's token (an admin, or the lead
of the project); every table comes as JSON rows or, with `format=csv`, the same rows as CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel

from allmende.domain.admin_state import AdminState
from allmende.services.api import dashboard_models as m
from allmende.services.api.access import declared_project, readable_projects, require_project
from allmende.services.api.auth import Principal, Reader
from allmende.services.api.dashboard_views import DashboardViews, Period, periods_of
from allmende.services.api.models import ErrorBody
from allmende.services.api.routes_fairshare import visible_nodes
from allmende.services.api.routes_usage import ProjectName

router = APIRouter(prefix="/v1/dashboard", tags=["dashboards"])
ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorBody} for c in (401, 403, 404, 422)}
CSV: dict[str, Any] = {"text/csv": {"schema": {"type": "string"}, "description": "with format=csv: the rows"}}
T = TypeVar("T", bound=BaseModel)

PeriodName = Annotated[
    str | None,
    Query(max_length=100, description="an allocation period, e.g. 2021-Q2; default: the ledger clock's"),
]
AsOf = Annotated[
    dt.datetime | None,
    Query(description="usage up to this instant (ISO 8601 with a zone, or Unix seconds); default: the "
          "ledger's clock, the latest charged instant"),
]  # fmt: skip
Format = Annotated[Literal["json", "csv"], Query(description="json, or csv: the rows alone")]


def _views(request: Request) -> DashboardViews:
    views: DashboardViews = request.app.state.dashboard
    return views


Views = Annotated[DashboardViews, Depends(_views)]


def rows_csv(model: BaseModel) -> str:
    """The model's `rows` as CSV: a header of the row keys, values as the JSON writes them."""
    rows = model.model_dump(mode="json")["rows"]
    out = io.StringIO()
    fields = list(type(model).model_fields["rows"].annotation.__args__[0].model_fields)  # type: ignore[union-attr]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return out.getvalue()


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


async def _answer(fmt: str, name: str, build: Callable[[], T]) -> T | Response:
    model = await run_in_threadpool(build)
    if fmt == "csv":
        return Response(
            rows_csv(model),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}.csv"'},
        )
    return model


def _instant(as_of: dt.datetime | None) -> int | None:
    if as_of is None:
        return None
    if as_of.tzinfo is None:
        raise HTTPException(422, "as_of needs a time zone (Z or an offset)")
    return int(as_of.timestamp())


def _project_scope(
    views: DashboardViews, caller: Principal, project: str, period: str | None, as_of: int | None
) -> tuple[AdminState, Period]:
    state = views.state()
    # Only an undeclared project needs the ledger asked whether it has usage (admins see it).
    has_usage = declared_project(state, project) or views.admin.store.project_days(project) is not None
    require_project(state, caller, project, has_usage=has_usage)
    return state, views.period(state, period, as_of)


@router.get("/periods", response_model=m.PeriodsOut, responses=ERRORS, summary="Periods with allocations")
async def periods(caller: Reader, views: Views, format: Format = "json") -> m.PeriodsOut | Response:
    def build() -> m.PeriodsOut:
        known = periods_of(views.state())
        return m.PeriodsOut(
            rows=[
                m.PeriodRow(period=n, start=m.instant(s) or "", end=m.instant(e) or "")
                for n, (s, e) in known.items()
            ]
        )

    return await _answer(format, "periods", build)


@router.get(
    "/projects", response_model=m.ProjectsOut, responses=ERRORS, summary="Projects the caller may read"
)
async def projects(caller: Reader, views: Views, format: Format = "json") -> m.ProjectsOut | Response:
    def build() -> m.ProjectsOut:
        with_usage = views.admin.store.projects() if caller.role == "admin" else []
        names = readable_projects(views.state(), caller, [p for p in with_usage if p])
        return m.ProjectsOut(rows=[m.ProjectRow(project=p) for p in names])

    return await _answer(format, "projects", build)


@router.get(
    "/projects/{project}/burn",
    response_model=m.BurnOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Allocation against cumulative charge, the even-burn line, daily burn and two forecasts",
    description="Holds count as spent for the forecast. Forecasts: from the period-to-date rate and "
    "from the trailing 7 days' rate.",
)
async def burn(
    project: ProjectName, caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None,
    format: Format = "json",
) -> m.BurnOut | Response:  # fmt: skip
    at = _instant(as_of)

    def build() -> m.BurnOut:
        state, scope = _project_scope(views, caller, project, period, at)
        return views.burn(state, project, scope, as_of_given=at is not None)

    return await _answer(format, f"{project}-burn", build)


@router.get(
    "/projects/{project}/breakdown",
    response_model=m.BreakdownOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Who and what burns the budget: GPU-hours, charge and idle GPU-hours per value of `by`",
)
async def breakdown(
    project: ProjectName, caller: Reader, views: Views,
    by: Annotated[Literal["cluster", "gpu_type", "user", "priority_class"], Query()] = "user",
    period: PeriodName = None, as_of: AsOf = None, format: Format = "json",
) -> m.BreakdownOut | Response:  # fmt: skip
    at = _instant(as_of)

    def build() -> m.BreakdownOut:
        _, scope = _project_scope(views, caller, project, period, at)
        return views.breakdown(project, scope, by)

    return await _answer(format, f"{project}-by-{by}", build)


@router.get(
    "/projects/{project}/running",
    response_model=m.RunningOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="The project's jobs that hold GPUs now (from the admission state)",
)
async def running(
    project: ProjectName, caller: Reader, views: Views, format: Format = "json"
) -> m.RunningOut | Response:
    def build() -> m.RunningOut:
        _project_scope_only(views, caller, project)
        return views.running(project)

    return await _answer(format, f"{project}-running", build)


@router.get(
    "/projects/{project}/holds",
    response_model=m.HoldsOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="The project's active holds: charge promised to admitted jobs, less what they spent",
)
async def holds(
    project: ProjectName, caller: Reader, views: Views, format: Format = "json"
) -> m.HoldsOut | Response:
    def build() -> m.HoldsOut:
        _project_scope_only(views, caller, project)
        return views.holds(project)

    return await _answer(format, f"{project}-holds", build)


def _project_scope_only(views: DashboardViews, caller: Principal, project: str) -> None:
    state = views.state()
    require_project(state, caller, project, has_usage=views.admin.store.project_days(project) is not None)


@router.get(
    "/projects/{project}/preemptions",
    response_model=m.PreemptionsOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Preemptions the project's jobs suffered in the period",
)
async def preemptions(
    project: ProjectName, caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None,
    format: Format = "json",
) -> m.PreemptionsOut | Response:  # fmt: skip
    at = _instant(as_of)

    def build() -> m.PreemptionsOut:
        _, scope = _project_scope(views, caller, project, period, at)
        return views.preemptions(project, scope)

    return await _answer(format, f"{project}-preemptions", build)


@router.get(
    "/projects/{project}/timeslices",
    response_model=m.TimeSlicesOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Each time-slice window of the project's agreements and how much of its guarantee was used",
    description="Used: the project's GPU-seconds on the cluster inside the window, at most the guarantee.",
)
async def timeslices(
    project: ProjectName, caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None,
    format: Format = "json",
) -> m.TimeSlicesOut | Response:  # fmt: skip
    at = _instant(as_of)

    def build() -> m.TimeSlicesOut:
        state, scope = _project_scope(views, caller, project, period, at)
        return views.timeslices(state, project, scope)

    return await _answer(format, f"{project}-timeslices", build)


@router.get(
    "/projects/{project}/squatting",
    response_model=m.SquattingOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Jobs that held GPUs under the utilisation threshold for longer than the grace period",
    description="ALLMENDE_SQUAT_MAX_UTILIZATION (default 0.05) and ALLMENDE_SQUAT_GRACE_S (default 1800).",
)
async def squatting(
    project: ProjectName, caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None,
    format: Format = "json",
) -> m.SquattingOut | Response:  # fmt: skip
    at = _instant(as_of)

    def build() -> m.SquattingOut:
        _, scope = _project_scope(views, caller, project, period, at)
        return views.squatting(project, scope)

    return await _answer(format, f"{project}-squatting", build)


@router.get(
    "/overview",
    response_model=m.OverviewOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="Every readable project: allocation, charge, holds, forecast, over-budget and idle GPU-hours",
)
async def overview(
    caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None, format: Format = "json"
) -> m.OverviewOut | Response:
    at = _instant(as_of)

    def build() -> m.OverviewOut:
        state = views.state()
        return views.overview(state, caller, views.period(state, period, at), as_of_given=at is not None)

    return await _answer(format, "overview", build)


@router.get(
    "/clusters/utilization",
    response_model=m.ClusterUtilizationOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="GPU-hours used per cluster and day against the declared capacity",
)
async def cluster_utilization(
    caller: Reader, views: Views, period: PeriodName = None, as_of: AsOf = None, format: Format = "json"
) -> m.ClusterUtilizationOut | Response:
    at = _instant(as_of)

    def build() -> m.ClusterUtilizationOut:
        state = views.state()
        return views.cluster_utilization(state, views.period(state, period, at))

    return await _answer(format, "cluster-utilization", build)


@router.get(
    "/fairshare",
    response_model=m.FairShareOut,
    responses={**ERRORS, 200: {"content": CSV}},
    summary="The fair-share tree as rows (leads: their subtrees, and the path above with shares only)",
)
async def fairshare(caller: Reader, views: Views, format: Format = "json") -> m.FairShareOut | Response:
    def build() -> m.FairShareOut:
        calculator = views.fairshare
        snapshot = calculator.latest if calculator is not None else None
        records = visible_nodes(views.state(), caller, snapshot.records) if snapshot else []
        return m.FairShareOut(
            as_of=m.instant(snapshot.as_of) if snapshot else None,
            algorithm=snapshot.algorithm if snapshot else "",
            rows=[
                m.FairShareRow(
                    node_id=r.node_id,
                    parent_id=r.parent_id,
                    depth=r.depth,
                    is_leaf=r.is_leaf,
                    raw_shares=str(r.raw_shares),
                    norm_shares=r.norm_shares,
                    effective_usage=r.effective_usage,
                    factor=r.factor,
                )
                for r in records
            ],
        )

    return await _answer(format, "fairshare", build)
