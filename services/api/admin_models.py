"""Request and response models of the admin and balance API (one model per direction).

GPU-hours cross the API as exact decimals; inside they are integer charge units.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from allmende.domain.allocation_requests import AllocationRequest
from allmende.domain.allocations import UNITS_PER_GPU_HOUR
from allmende.domain.balances import AllocationBalance, ProjectBalance
from allmende.domain.plan import Change
from allmende.domain.plan_file import MAX_GPU_HOURS, Gpus, Leads, Rate, exact_int
from allmende.schemas.admin_events import AdminEvent, AllocationAdjusted, AllocationGranted, WindowSpec
from allmende.schemas.events import Identifier, Name

# Projects, groups, clusters and users are `Name`s, as in the plan file (docs/security.md); the
# sizes are the plan's too: at most MAX_GPUS GPUs, at most MAX_GPU_HOURS weighted GPU-hours.
GpuHours = Annotated[Decimal, Field(ge=0, le=MAX_GPU_HOURS, decimal_places=9)]
Reason = Annotated[str, Field(max_length=1000)]


def units_to_hours(units: int) -> Decimal:
    """Exact weighted GPU-hours of charge units, to 1e-9 (one charge unit is 2.8e-13 of an hour)."""
    return (Decimal(units) / UNITS_PER_GPU_HOUR).quantize(Decimal("0.000000001"))


def hours_to_units(hours: Decimal) -> int:
    return exact_int(hours, UNITS_PER_GPU_HOUR, "GPU-hours")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: Reason = ""


class NodeRequest(_Request):
    node_id: Name
    kind: Literal["organisation", "group", "project"]
    parent: Name | None = None
    shares: Annotated[int, Field(ge=0, le=1_000_000)] | Literal["parent"] = 1
    leads: Leads = []


class ClusterRequest(_Request):
    cluster: Name
    gpu_type: Identifier
    gpus: Gpus


class PolicyRequest(_Request):
    policy_id: Identifier
    effective_from: dt.datetime
    gpu_type_weights: dict[Identifier, Rate] = {}
    default_gpu_type_weight: Rate = Decimal(1)
    priority_multipliers: dict[Literal["preemptible", "standard", "non-preemptible"], Rate]
    interactive_rate: Rate = Decimal(1)


class GrantRequest(_Request):
    allocation_id: Identifier | None = Field(
        default=None, description="default: project/period[/cluster][/gpu_type]"
    )
    project: Name
    period: str | None = Field(default=None, description="a quarter, e.g. 2027-Q1; or give start and end")
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    gpu_hours: GpuHours
    cluster: Name | None = None
    gpu_type: Identifier | None = None
    rollover: bool = False


class AdjustRequest(_Request):
    delta_gpu_hours: Annotated[Decimal, Field(ge=-MAX_GPU_HOURS, le=MAX_GPU_HOURS, decimal_places=9)]
    reason: Annotated[str, Field(min_length=1, max_length=1000)]


class TransferRequest(_Request):
    from_allocation: Identifier
    to_allocation: Identifier
    gpu_hours: Annotated[Decimal, Field(gt=0, le=MAX_GPU_HOURS, decimal_places=9)]


class AgreementRequest(_Request):
    agreement_id: Identifier
    project: Name
    cluster: Name
    gpus: Gpus
    window: WindowSpec


class RevokeRequest(_Request):
    pass


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, Field(min_length=1, max_length=1_000_000, description="the plan file (YAML)")]


class EventOut(BaseModel):
    event_id: str
    type: str
    occurred_at: int
    actor: str
    reason: str
    source: str
    data: dict[str, Any]

    @classmethod
    def of(cls, event: AdminEvent) -> EventOut:
        data = event.model_dump(mode="json")
        envelope = {k: data.pop(k) for k in ("event_id", "type", "occurred_at", "actor", "reason", "source")}
        data.pop("schema_version", None)
        return cls(**envelope, data=data)


class CommandResult(BaseModel):
    applied: list[EventOut]
    unchanged: list[EventOut] = Field(description="already on the log: this request was a retry")


class ChangeOut(BaseModel):
    action: str
    target: str
    detail: str
    event: EventOut

    @classmethod
    def of(cls, change: Change) -> ChangeOut:
        return cls(
            action=change.action, target=change.target, detail=change.detail, event=EventOut.of(change.event)
        )


class PlanResult(BaseModel):
    changes: list[ChangeOut]
    applied: bool = Field(description="false for a diff: nothing was changed")
    applied_events: list[str] = Field(default=[], description="ids of the events this apply appended")


class AllocationBalanceOut(BaseModel):
    allocation_id: str
    period: str
    start: int
    end: int
    scope: str
    cluster: str | None
    gpu_type: str | None
    expired: bool
    allocated_gpu_hours: Decimal
    charged_gpu_hours: Decimal
    held_gpu_hours: Decimal
    remaining_gpu_hours: Decimal
    forfeited_gpu_hours: Decimal
    allocated_units: int
    charged_units: int
    held_units: int
    remaining_units: int

    @classmethod
    def of(cls, line: AllocationBalance) -> AllocationBalanceOut:
        a = line.allocation
        return cls(
            allocation_id=a.allocation_id, period=a.period, start=a.start, end=a.end, scope=a.scope(),
            cluster=a.cluster, gpu_type=a.gpu_type, expired=a.expired,
            allocated_gpu_hours=units_to_hours(line.allocated_units),
            charged_gpu_hours=units_to_hours(line.charged_units),
            held_gpu_hours=units_to_hours(line.held_units),
            remaining_gpu_hours=units_to_hours(line.remaining_units),
            forfeited_gpu_hours=units_to_hours(a.forfeited_units),
            allocated_units=line.allocated_units, charged_units=line.charged_units,
            held_units=line.held_units, remaining_units=line.remaining_units,
        )  # fmt: skip


class BalanceOut(BaseModel):
    project: str
    as_of: int
    allocations: list[AllocationBalanceOut]
    over_budget_gpu_hours: Decimal = Field(
        description="charges no allocation paid for: recorded, never dropped"
    )
    over_budget_units: int
    unallocated_units: int = Field(description="charges no allocation covers (period, cluster, GPU type)")
    overspent_units: int = Field(description="charges the covering allocations had no room left for")
    total_charged_gpu_hours: Decimal
    total_charged_units: int
    total_gpu_seconds: int

    @classmethod
    def of(cls, balance: ProjectBalance, period: str | None) -> BalanceOut:
        lines = [
            AllocationBalanceOut.of(b) for b in balance.allocations if period in (None, b.allocation.period)
        ]
        return cls(
            project=balance.project, as_of=balance.as_of, allocations=lines,
            over_budget_gpu_hours=units_to_hours(balance.over_budget_units),
            over_budget_units=balance.over_budget_units, unallocated_units=balance.unallocated_units,
            overspent_units=balance.overspent_units,
            total_charged_gpu_hours=units_to_hours(balance.total_charged_units),
            total_charged_units=balance.total_charged_units, total_gpu_seconds=balance.total_gpu_seconds,
        )  # fmt: skip


class NodeOut(BaseModel):
    node_id: str
    kind: str
    parent: str | None
    shares: int | str
    leads: list[str] | None = Field(description="null: not shown to this caller (a node above a lead's own)")


class ClusterOut(BaseModel):
    cluster: str
    gpu_type: str
    gpus: int


class OrganisationOut(BaseModel):
    nodes: list[NodeOut]
    clusters: list[ClusterOut]
    policies: list[EventOut]
    agreements: list[EventOut]
    revoked_agreements: list[str]


class RejectionBody(BaseModel):
    detail: str
    code: str
    conflicting: list[str] = []
    problems: list[dict[str, Any]] = []


class RefusedKind(BaseModel):
    stage: str = Field(description="who refused: meter, ledger-writer, admin-log")
    code: str = Field(description="what kind of refusal: contract, conflict, unknown-project, "
                      "unknown-cluster, gpu-type, over-capacity, future-instant, unexpected")  # fmt: skip
    count: int
    redrivable: bool = Field(description="an admin mends it by declaring what the plan lacks, then re-drives")


class RefusedLetterOut(BaseModel):
    offset: int = Field(
        description="the letter's offset on the dead-letter topic (`allmende dead-letters redrive --offset`)"
    )
    stage: str
    code: str
    reason: str
    key: str | None = Field(description="the refused record's key (a job id), as text")
    source: str = Field(description="topic/partition@offset of the refused record")
    refused_at: dt.datetime


class RefusedOut(BaseModel):
    kinds: list[RefusedKind] = Field(
        description="every refusal since the topic began, counted per stage and code"
    )
    letters: list[RefusedLetterOut] = Field(description="the newest refusals, newest first")
    age_s: float | None = Field(description="seconds since the dead-letter topic was last read to its end "
                                "(null: not yet: Kafka away since the API started)")  # fmt: skip


class RunOut(BaseModel):
    job_id: str
    project: str
    started_at: dt.datetime = Field(description="its first piece in the ledger")
    gpus: int = Field(description="the most GPUs it used during the episode")


class EpisodeOut(BaseModel):
    cluster: str
    capacity_gpus: int
    peak_gpus: int
    excess_gpus: int
    start: dt.datetime
    end: dt.datetime
    pushed_over: list[RunOut] = Field(
        description="the runs that pushed it over: the last to start, until their GPUs cover the excess"
    )
    runs: list[RunOut] = Field(description="every run on the cluster during the episode")


class OverCapacityOut(BaseModel):
    since: dt.datetime = Field(
        description="the look-back's start (ALLMENDE_CAPACITY_LOOKBACK_S before the ledger's clock)"
    )
    episodes: list[EpisodeOut] = Field(description="newest first, at most 20")


class ResolveRequest(_Request):
    action: Literal["charge", "drop"] = Field(
        description="charge: the job is charged to its project again; drop: it stays charged to no project"
    )


class DisputeOut(BaseModel):
    job_id: str
    project: str
    cluster: str
    episode_start: dt.datetime
    episode_end: dt.datetime
    peak_gpus: int
    capacity_gpus: int
    raised_at: dt.datetime
    reason: str
    status: Literal["disputed", "charged", "dropped"]
    resolved_by: str | None
    resolved_at: dt.datetime | None
    resolution_reason: str | None


class AllocationRequestIn(BaseModel):
    """A lead's request for more (docs/auth.md): give the fields of its kind."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["gpu-hours", "extension", "time-slice"]
    reason: Annotated[str, Field(min_length=1, max_length=1000, description="what it is for")]
    gpu_hours: GpuHours | None = Field(default=None, description="gpu-hours: how many")
    period: str | None = Field(default=None, description="gpu-hours: a quarter (default: the current one)")
    cluster: Name | None = Field(default=None, description="gpu-hours: only on it; time-slice: where")
    allocation_id: Identifier | None = Field(default=None, description="extension: which allocation")
    extend_to: dt.datetime | None = Field(default=None, description="extension: the new end (with a zone)")
    gpus: Gpus | None = Field(default=None, description="time-slice: GPUs guaranteed")
    window: WindowSpec | None = Field(default=None, description="time-slice: when")


class DecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "deny"]
    comment: Annotated[str, Field(max_length=1000)] = ""
    gpu_hours: GpuHours | None = Field(
        default=None, description="approve a gpu-hours request with another amount than asked"
    )


class AllocationRequestOut(BaseModel):
    request_id: str
    project: str
    kind: str
    status: Literal["open", "approved", "denied"]
    asked_by: str
    asked_at: int
    reason: str
    gpu_hours: Decimal | None
    period: str | None
    cluster: str | None
    allocation_id: str | None
    extend_to: int | None
    gpus: int | None
    window: dict[str, Any] | None
    decided_by: str | None = None
    decided_at: int | None = None
    comment: str | None = None
    granted_event_id: str | None = None
    granted_gpu_hours: Decimal | None = None

    @classmethod
    def of(cls, request: AllocationRequest, granted: AdminEvent | None) -> AllocationRequestOut:
        a, d = request.asked, request.decided
        granted_units = (
            granted.amount_units
            if isinstance(granted, AllocationGranted)
            else granted.delta_units
            if isinstance(granted, AllocationAdjusted)
            else None
        )
        return cls(
            request_id=a.request_id, project=a.project, kind=a.kind, status=request.status,
            asked_by=a.actor, asked_at=a.occurred_at, reason=a.reason,
            gpu_hours=units_to_hours(a.amount_units) if a.kind == "gpu-hours" else None,
            period=a.period, cluster=a.cluster, allocation_id=a.allocation_id, extend_to=a.extend_to,
            gpus=a.gpus, window=a.window.model_dump(mode="json") if a.window else None,
            decided_by=d.actor if d else None, decided_at=d.occurred_at if d else None,
            comment=d.reason if d else None, granted_event_id=d.granted_event_id if d else None,
            granted_gpu_hours=units_to_hours(granted_units) if granted_units is not None else None,
        )  # fmt: skip
