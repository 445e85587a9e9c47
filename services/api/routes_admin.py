"""Admin routes: the organisation, charge policy, allocations, agreements and the plan file.

Every change is an admin event with the caller as actor. Send an `Idempotency-Key` header to make
a retry safe: the same key gives the same event id, answered as `unchanged` the second time.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, TypedDict

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

from allmende.core.dead_letters import Letter, RefusedLetters, mended_by_plan
from allmende.domain.admin_state import CHARGED, DISPUTED, DROPPED, AdminRejected, Dispute, Overbooked
from allmende.domain.allocations import default_allocation_id, period_label, quarter_bounds
from allmende.domain.capacity import Episode, RunOnCluster, pushed_over
from allmende.domain.plan import PlanConflict
from allmende.domain.plan_file import PlanInvalid, rates_in_hundredths
from allmende.schemas.admin_events import (
    AdminEvent,
    AgreementGranted,
    AgreementRevoked,
    AllocationAdjusted,
    AllocationGranted,
    AllocationTransferred,
    ClusterDeclared,
    DisputeResolved,
    NodeDeclared,
    PolicyChanged,
)
from allmende.schemas.events import NAME_MAX_LENGTH, NAME_PATTERN
from allmende.services.admin_service import AdminService, Outcome
from allmende.services.api.access import own_nodes, path_nodes
from allmende.services.api.admin_models import (
    AdjustRequest,
    AgreementRequest,
    ChangeOut,
    ClusterOut,
    ClusterRequest,
    CommandResult,
    DisputeOut,
    EpisodeOut,
    EventOut,
    GrantRequest,
    NodeOut,
    NodeRequest,
    OrganisationOut,
    OverCapacityOut,
    PlanRequest,
    PlanResult,
    PolicyRequest,
    RefusedKind,
    RefusedLetterOut,
    RefusedOut,
    RejectionBody,
    ResolveRequest,
    RevokeRequest,
    RunOut,
    TransferRequest,
    hours_to_units,
)
from allmende.services.api.auth import Admin, Reader
from allmende.services.api.dashboard_views import DashboardViews
from allmende.services.api.deps import Admins

router = APIRouter(prefix="/v1/admin", tags=["admin"])
ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": RejectionBody} for code in (401, 403, 404, 409, 422)
}
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200, pattern=r"^[A-Za-z0-9._:@/+-]+$",
           description="the same key makes a retry answer `unchanged` instead of acting twice"),
]  # fmt: skip


def rejection(exc: PlanInvalid | PlanConflict | AdminRejected) -> HTTPException:
    """The HTTP answer to a refused command: 404 unknown, 409 conflicts, 422 invalid."""
    if isinstance(exc, PlanInvalid):
        problems = [{"line": line, "field": field, "message": msg} for line, field, msg in exc.problems]
        return HTTPException(422, {"detail": str(exc), "code": "plan-invalid", "problems": problems})
    if isinstance(exc, PlanConflict):
        return HTTPException(409, {"detail": str(exc), "code": "conflict"})
    status = {"unknown": 404, "invalid": 422}.get(exc.code, 409)
    body: dict[str, object] = {"detail": str(exc), "code": exc.code}
    if isinstance(exc, Overbooked):
        body["conflicting"] = list(exc.conflicting)
    return HTTPException(status, body)


class _Envelope(TypedDict):
    event_id: str
    occurred_at: int
    actor: str
    reason: str
    source: str


def _base(service: AdminService, actor: str, reason: str, key: str | None, kind: str) -> _Envelope:
    """The envelope of an API command's event; the idempotency key fixes its id."""
    return {
        "event_id": f"api:{kind}:{key}" if key else f"api:{kind}:{uuid.uuid4().hex}",
        "occurred_at": service.now(),
        "actor": actor,
        "reason": reason,
        "source": "api",
    }


async def _run(service: AdminService, events: list[AdminEvent]) -> CommandResult:
    try:
        outcome = await run_in_threadpool(service.submit, events)
    except (AdminRejected, PlanConflict) as exc:
        raise rejection(exc) from None
    return _result(outcome)


def _result(outcome: Outcome) -> CommandResult:
    return CommandResult(
        applied=[EventOut.of(e) for e in outcome.applied],
        unchanged=[EventOut.of(e) for e in outcome.unchanged],
    )


@router.post(
    "/nodes", response_model=CommandResult, responses=ERRORS, summary="Declare or change a node of the tree"
)
async def declare_node(
    body: NodeRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    event = NodeDeclared(
        **_base(service, admin.name, body.reason, key, "node"),
        node_id=body.node_id, parent=body.parent, kind=body.kind, shares=body.shares, leads=tuple(body.leads),
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/clusters", response_model=CommandResult, responses=ERRORS, summary="Declare or change a cluster"
)
async def declare_cluster(
    body: ClusterRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    event = ClusterDeclared(
        **_base(service, admin.name, body.reason, key, "cluster"),
        cluster=body.cluster, gpu_type=body.gpu_type, gpus=body.gpus,
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/policies",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Add a charge policy version, in force from its effective time (never before charged usage)",
)
async def change_policy(
    body: PolicyRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    if body.effective_from.tzinfo is None:
        raise HTTPException(422, "effective_from needs a time zone (Z or an offset)")
    try:
        rates = rates_in_hundredths(
            body.gpu_type_weights,
            body.default_gpu_type_weight,
            body.priority_multipliers,
            body.interactive_rate,
        )
        event = PolicyChanged(
            **_base(service, admin.name, body.reason, key, "policy"),
            policy_id=body.policy_id, effective_from=int(body.effective_from.timestamp()), **rates,
        )  # fmt: skip
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return await _run(service, [event])


@router.post("/allocations", response_model=CommandResult, responses=ERRORS, summary="Grant a budget")
async def grant(
    body: GrantRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    try:
        if body.period is not None:
            start, end = quarter_bounds(body.period)
            label = body.period
        elif body.start is not None and body.end is not None and body.start.tzinfo and body.end.tzinfo:
            start, end = int(body.start.timestamp()), int(body.end.timestamp())
            label = period_label(start, end)
        else:
            raise ValueError("give a period (2027-Q1) or a start and an end with a time zone")
        allocation_id = body.allocation_id or default_allocation_id(
            body.project, label, body.cluster, body.gpu_type
        )
        event = AllocationGranted(
            **_base(service, admin.name, body.reason, key, "grant"),
            allocation_id=allocation_id, project=body.project, period=label, period_start=start,
            period_end=end, amount_units=hours_to_units(body.gpu_hours), cluster=body.cluster,
            gpu_type=body.gpu_type, rollover=body.rollover,
        )  # fmt: skip
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return await _run(service, [event])


AllocationId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@/+-]+$")]


@router.post(
    "/allocations/{allocation_id:path}/adjustments",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Change an allocation's amount (with a reason)",
)
async def adjust(
    allocation_id: AllocationId,
    body: AdjustRequest,
    admin: Admin,
    service: Admins,
    key: IdempotencyKey = None,
) -> CommandResult:
    try:
        delta = hours_to_units(abs(body.delta_gpu_hours)) * (1 if body.delta_gpu_hours >= 0 else -1)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    event = AllocationAdjusted(
        **_base(service, admin.name, body.reason, key, "adjust"),
        allocation_id=allocation_id, delta_units=delta,
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/transfers", response_model=CommandResult, responses=ERRORS, summary="Move GPU-hours between allocations"
)
async def transfer(
    body: TransferRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    try:
        units = hours_to_units(body.gpu_hours)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    base = _base(service, admin.name, body.reason, key, "transfer")
    event = AllocationTransferred(
        **base,
        transfer_id=str(base["event_id"]).removeprefix("api:transfer:"),
        from_allocation=body.from_allocation, to_allocation=body.to_allocation, amount_units=units,
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/agreements",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Grant a time-slice agreement (refused when it would overbook the cluster)",
)
async def grant_agreement(
    body: AgreementRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    event = AgreementGranted(
        **_base(service, admin.name, body.reason, key, "agreement"),
        agreement_id=body.agreement_id, project=body.project, cluster=body.cluster, gpus=body.gpus,
        window=body.window,
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/agreements/{agreement_id}/revocation",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Revoke a time-slice agreement",
)
async def revoke_agreement(
    agreement_id: AllocationId, body: RevokeRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    event = AgreementRevoked(
        **_base(service, admin.name, body.reason, key or f"revoke-{agreement_id}", "revoke"),
        agreement_id=agreement_id,
    )  # fmt: skip
    return await _run(service, [event])


@router.post(
    "/expiry", response_model=CommandResult, responses=ERRORS, summary="Expire allocations whose period ended"
)
async def expire(admin: Admin, service: Admins) -> CommandResult:
    return _result(await run_in_threadpool(service.expire_due, admin.name))


async def _plan(service: AdminService, body: PlanRequest, actor: str, apply: bool) -> PlanResult:
    try:
        applied: list[str] = []
        if apply:
            changes, outcome = await run_in_threadpool(service.apply_plan, body.text, actor)
            applied = [e.event_id for e in outcome.applied]
            # The log's clock may have moved the instants: show the events as appended.
            stored = {e.event_id: e for e in outcome.applied}
            changes = [replace(c, event=stored.get(c.event.event_id, c.event)) for c in changes]
        else:
            changes = await run_in_threadpool(service.plan, body.text, actor)
    except (PlanInvalid, PlanConflict, AdminRejected) as exc:
        raise rejection(exc) from None
    return PlanResult(changes=[ChangeOut.of(c) for c in changes], applied=apply, applied_events=applied)


@router.post(
    "/plan/diff", response_model=PlanResult, responses=ERRORS, summary="What a plan file would change"
)
async def plan_diff(body: PlanRequest, admin: Admin, service: Admins) -> PlanResult:
    return await _plan(service, body, admin.name, apply=False)


@router.post(
    "/plan/apply", response_model=PlanResult, responses=ERRORS, summary="Apply a plan file (idempotent)"
)
async def plan_apply(body: PlanRequest, admin: Admin, service: Admins) -> PlanResult:
    return await _plan(service, body, admin.name, apply=True)


@router.get(
    "/organisation",
    response_model=OrganisationOut,
    responses=ERRORS,
    summary="The tree, clusters, policies (admins: all of it; a lead: their own nodes and agreements)",
    description="Admins read the whole organisation. A project lead reads the nodes they lead and "
    "their subtrees, the path above them (ids, kinds and shares; `leads` null), the clusters and "
    "the charge policies (what their jobs run on and are charged by), and the agreements of their "
    "own projects. The scheduler is refused: admission needs nothing of it. See docs/security.md.",
)
async def organisation(caller: Reader, service: Admins) -> OrganisationOut:
    state = await run_in_threadpool(service.state)
    own = own_nodes(state, caller)
    shown = own | path_nodes(state, own)
    projects = {n for n in own if state.nodes[n].kind == "project"}
    everything = caller.role == "admin"
    agreements = sorted((k, a) for k, a in state.agreements.items() if everything or a.project in projects)
    return OrganisationOut(
        nodes=[
            NodeOut(
                node_id=n.node_id, kind=n.kind, parent=n.parent, shares=n.shares,
                leads=list(n.leads) if n.node_id in own else None,
            )
            for n in sorted(state.nodes.values(), key=lambda n: n.node_id)
            if n.node_id in shown
        ],
        clusters=[
            ClusterOut(cluster=c.cluster, gpu_type=c.gpu_type, gpus=c.gpus) for c in state.clusters.values()
        ],
        policies=[EventOut.of(p) for p in sorted(state.policies.values(), key=lambda p: p.effective_from)],
        agreements=[EventOut.of(a) for _, a in agreements],
        revoked_agreements=sorted(k for k in state.revoked if everything or k in dict(agreements)),
    )  # fmt: skip


@router.get(
    "/refused",
    response_model=RefusedOut,
    responses=ERRORS,
    summary="Usage and commands refused, per kind, and the newest refusals with their reasons",
    description="Read from the dead-letter topic (the newest 500 letters; every count). A kind an "
    "admin mends by declaring what the plan lacks (an unknown project or cluster, a GPU type, a "
    "cluster's size) is re-driven afterwards with `allmende dead-letters redrive --code CODE`. "
    "Kafka away: the figures last read, with their age.",
)
async def refused(
    admin: Admin,
    request: Request,
    code: Annotated[str | None, Query(max_length=64, description="only letters of this code")] = None,
    limit: Annotated[int, Query(ge=1, le=RefusedLetters.KEEP)] = 100,
) -> RefusedOut:
    letters_follower: RefusedLetters = request.app.state.refused
    with contextlib.suppress(Exception):  # Kafka away: answer from the last read, saying how old
        await run_in_threadpool(letters_follower.follow, 2.0)
    counts, latest, age = letters_follower.snapshot()
    return RefusedOut(
        kinds=[
            RefusedKind(stage=stage, code=c, count=n, redrivable=mended_by_plan(stage, c))
            for (stage, c), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        letters=[_letter_out(item) for item in latest if code is None or item.letter.kind == code][:limit],
        age_s=age,
    )


def _letter_out(item: Letter) -> RefusedLetterOut:
    letter = item.letter
    key = None if letter.key_b64 is None else base64.b64decode(letter.key_b64).decode("utf-8", "replace")
    return RefusedLetterOut(
        offset=item.offset,
        stage=letter.stage,
        code=letter.kind,
        reason=letter.reason,
        key=key,
        source=f"{letter.source_topic}/{letter.source_partition}@{letter.source_offset}",
        refused_at=_utc(letter.refused_at),
    )


@router.get(
    "/over-capacity",
    response_model=OverCapacityOut,
    responses=ERRORS,
    summary="Clusters that ran more GPUs than they have, and the runs that pushed them over",
    description="From the ledger's pieces over the look-back (ALLMENDE_CAPACITY_LOOKBACK_S, 7 days, "
    "before the ledger's clock). Such usage was reported wrongly (twice, or by a broken producer); "
    "it is charged as reported, and the alerter raises each episode once (`CapacityExceeded` on "
    "the alerts topic and the webhooks, `allmende_cluster_over_capacity_gpus`).",
)
async def over_capacity(admin: Admin, request: Request) -> OverCapacityOut:
    views: DashboardViews = request.app.state.dashboard

    def read() -> OverCapacityOut:
        since = views.ledger_clock() - views.capacity_lookback_s
        return OverCapacityOut(
            since=_utc(since),
            episodes=[_episode_out(e, runs) for e, runs in views.over_capacity()],
        )

    return await run_in_threadpool(read)


def _episode_out(e: Episode, runs: Sequence[RunOnCluster]) -> EpisodeOut:
    return EpisodeOut(
        cluster=e.cluster,
        capacity_gpus=e.capacity,
        peak_gpus=e.peak,
        excess_gpus=e.excess,
        start=_utc(e.start),
        end=_utc(e.end),
        pushed_over=[_run_out(r) for r in pushed_over(e, runs)],
        runs=[_run_out(r) for r in runs],
    )


def _run_out(run: RunOnCluster) -> RunOut:
    return RunOut(job_id=run.job_id, project=run.project, started_at=_utc(run.started_at), gpus=run.gpus)


def _utc(at: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(at, dt.UTC)


JobId = Annotated[str, Path(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)]
_STATUS = {DISPUTED: "disputed", CHARGED: "charged", DROPPED: "dropped"}


@router.get(
    "/disputes",
    response_model=list[DisputeOut],
    responses=ERRORS,
    summary="Usage held as disputed (a cluster ran more GPUs than it has), and how each was resolved",
    description="A disputed job is charged to no project until an admin resolves it "
    "(`POST /v1/admin/disputes/{job_id}/resolution`). Newest first.",
)
async def disputes(admin: Admin, service: Admins) -> list[DisputeOut]:
    state = await run_in_threadpool(service.state)
    found = sorted(state.disputes.values(), key=lambda d: (-d.raised.occurred_at, d.raised.job_id))
    return [_dispute_out(d) for d in found]


def _dispute_out(d: Dispute) -> DisputeOut:
    raised, resolved = d.raised, d.resolved
    return DisputeOut(
        job_id=raised.job_id,
        project=raised.project,
        cluster=raised.cluster,
        episode_start=_utc(raised.episode_start),
        episode_end=_utc(raised.episode_end),
        peak_gpus=raised.peak_gpus,
        capacity_gpus=raised.capacity_gpus,
        raised_at=_utc(raised.occurred_at),
        reason=raised.reason,
        status=_STATUS[d.stage],
        resolved_by=resolved.actor if resolved else None,
        resolved_at=_utc(resolved.occurred_at) if resolved else None,
        resolution_reason=resolved.reason if resolved else None,
    )


@router.post(
    "/disputes/{job_id}/resolution",
    response_model=CommandResult,
    responses=ERRORS,
    summary="Resolve disputed usage: charge it to the job's project, or drop it",
    description="An admin event on the audit trail. The meter re-emits the job's entries within "
    "seconds: attributed to its project again (`charge`), or left charged to no project (`drop`).",
)
async def resolve_dispute(
    job_id: JobId, body: ResolveRequest, admin: Admin, service: Admins, key: IdempotencyKey = None
) -> CommandResult:
    event = DisputeResolved(
        **_base(service, admin.name, body.reason, key or f"resolve-{job_id}-{body.action}", "resolve"),
        job_id=job_id,
        action=body.action,
    )
    return await _run(service, [event])
