"""Admin events: the organisation, budgets, charge policy and time-slice agreements.

They travel on `<prefix>.admin-events`, one partition (one total order: the audit trail), keyed
by the aggregate they change. Every event says who did it (`actor`), when (`occurred_at`, UTC
Unix seconds), why (`reason`) and through what (`source`: `api`, or `plan:<name>` for the
quarterly plan file). Ids are deterministic: a retried command produces the same `event_id`, which
every consumer applies once.

Amounts are integers: budgets in charge units (`domain.charging`, 10^6 per weighted GPU-second,
so one GPU-hour at weight 1.00 is 3.6e9), rates in hundredths.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from allmende.schemas.events import Identifier, UnixSeconds, parse_with

ChargeUnits = Annotated[int, Field(ge=0, le=2**62, strict=True)]
SignedChargeUnits = Annotated[int, Field(ge=-(2**62), le=2**62, strict=True)]
Rate = Annotated[int, Field(ge=0, le=10_000, strict=True)]  # hundredths, at most 100x
Shares = Annotated[int, Field(ge=0, le=1_000_000, strict=True)] | Literal["parent"]
Reason = Annotated[str, Field(max_length=1000)]
Weekdays = Annotated[tuple[Annotated[int, Field(ge=0, le=6)], ...], Field(min_length=1, max_length=7)]


class _AdminEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Annotated[str, Field(min_length=1, max_length=400)]
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    actor: Identifier
    reason: Reason = ""
    source: Annotated[str, Field(min_length=1, max_length=200)] = "api"

    # The record key on the topic, filled from the event's fields: "node:{node_id}".
    KEY: ClassVar[str]

    @property
    def aggregate(self) -> str:
        """The key on the topic: what the event changes."""
        return self.KEY.format_map(self.__dict__)


class NodeDeclared(_AdminEnvelope):
    """A node of the organisation tree is declared or changed (same node id: an update)."""

    type: Literal["NodeDeclared"] = "NodeDeclared"
    node_id: Identifier
    parent: Identifier | None = None  # None: directly under the root
    kind: Literal["organisation", "group", "project"]
    shares: Shares = 1
    leads: tuple[Identifier, ...] = ()

    KEY: ClassVar[str] = "node:{node_id}"


class ClusterDeclared(_AdminEnvelope):
    type: Literal["ClusterDeclared"] = "ClusterDeclared"
    cluster: Identifier
    gpu_type: Identifier
    gpus: Annotated[int, Field(ge=1, le=1_000_000, strict=True)]

    KEY: ClassVar[str] = "cluster:{cluster}"


class PolicyChanged(_AdminEnvelope):
    """A charge policy version, in force from `effective_from` until the next one."""

    type: Literal["PolicyChanged"] = "PolicyChanged"
    policy_id: Identifier
    effective_from: UnixSeconds
    gpu_type_weights: dict[Identifier, Rate]
    default_gpu_type_weight: Rate
    priority_multipliers: dict[Literal["preemptible", "standard", "non-preemptible"], Rate]
    interactive_rate: Rate = 100

    KEY: ClassVar[str] = "policy"


class AllocationGranted(_AdminEnvelope):
    """A budget for `project` over [period_start, period_end), optionally for one cluster/GPU type."""

    type: Literal["AllocationGranted"] = "AllocationGranted"
    allocation_id: Identifier
    project: Identifier
    period: Annotated[str, Field(min_length=1, max_length=100)]  # a label, e.g. 2027-Q1
    period_start: UnixSeconds
    period_end: UnixSeconds
    amount_units: ChargeUnits
    cluster: Identifier | None = None
    gpu_type: Identifier | None = None
    rollover: bool = False  # at expiry unused units move to the next quarter (or period)

    KEY: ClassVar[str] = "allocation:{allocation_id}"


class AllocationAdjusted(_AdminEnvelope):
    """The allocated amount changes by `delta_units` (the reason is mandatory)."""

    type: Literal["AllocationAdjusted"] = "AllocationAdjusted"
    allocation_id: Identifier
    delta_units: SignedChargeUnits

    KEY: ClassVar[str] = "allocation:{allocation_id}"


class AllocationTransferred(_AdminEnvelope):
    """Units move from one allocation to another: both sides in this one event, so never half done."""

    type: Literal["AllocationTransferred"] = "AllocationTransferred"
    transfer_id: Identifier
    from_allocation: Identifier
    to_allocation: Identifier
    amount_units: Annotated[int, Field(ge=1, le=2**62, strict=True)]

    KEY: ClassVar[str] = "transfer:{transfer_id}"


class AllocationExpired(_AdminEnvelope):
    """The period ended: what was unused is forfeited, or rolled into `rollover_allocation_id`."""

    type: Literal["AllocationExpired"] = "AllocationExpired"
    allocation_id: Identifier
    unused_units: ChargeUnits
    rollover_allocation_id: Identifier | None = None

    KEY: ClassVar[str] = "allocation:{allocation_id}"


class FixedWindowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed"] = "fixed"
    start: UnixSeconds
    end: UnixSeconds


class WeeklyWindowSpec(BaseModel):
    """Weekdays 0 (Monday) .. 6 at hour:minute local time in `time_zone`, for `duration_s`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["weekly"] = "weekly"
    weekdays: Weekdays
    hour: Annotated[int, Field(ge=0, le=23, strict=True)]
    minute: Annotated[int, Field(ge=0, le=59, strict=True)] = 0
    duration_s: Annotated[int, Field(ge=1, le=7 * 86_400, strict=True)]
    time_zone: Annotated[str, Field(min_length=1, max_length=64)]
    valid_from: UnixSeconds
    valid_until: UnixSeconds


WindowSpec = Annotated[FixedWindowSpec | WeeklyWindowSpec, Field(discriminator="kind")]


class AgreementGranted(_AdminEnvelope):
    """`project` is guaranteed `gpus` GPUs of `cluster` whenever `window` is open."""

    type: Literal["AgreementGranted"] = "AgreementGranted"
    agreement_id: Identifier
    project: Identifier
    cluster: Identifier
    gpus: Annotated[int, Field(ge=1, le=1_000_000, strict=True)]
    window: WindowSpec

    KEY: ClassVar[str] = "agreement:{agreement_id}"


class AgreementRevoked(_AdminEnvelope):
    type: Literal["AgreementRevoked"] = "AgreementRevoked"
    agreement_id: Identifier

    KEY: ClassVar[str] = "agreement:{agreement_id}"


class UsageDisputed(_AdminEnvelope):
    """A job's usage is held as disputed: its cluster ran more GPUs than it has while the job ran,
    and the job was among the runs that pushed it over (the last to start). Until an admin resolves
    it the meter charges the job to no project (its entries are unattributed)."""

    type: Literal["UsageDisputed"] = "UsageDisputed"
    job_id: Identifier
    project: Identifier  # the job's project, as the ledger showed it
    cluster: Identifier
    episode_start: UnixSeconds
    episode_end: UnixSeconds
    peak_gpus: Annotated[int, Field(ge=0, strict=True)]
    capacity_gpus: Annotated[int, Field(ge=0, strict=True)]

    KEY: ClassVar[str] = "dispute:{job_id}"


class DisputeResolved(_AdminEnvelope):
    """An admin's decision on disputed usage: `charge` (the job is charged to its project again)
    or `drop` (it stays charged to no project)."""

    type: Literal["DisputeResolved"] = "DisputeResolved"
    job_id: Identifier
    action: Literal["charge", "drop"]

    KEY: ClassVar[str] = "dispute:{job_id}"


class AllocationExtended(_AdminEnvelope):
    """An open allocation's period ends later (an approved extension): `period_end` is the new end."""

    type: Literal["AllocationExtended"] = "AllocationExtended"
    allocation_id: Identifier
    period_end: UnixSeconds

    KEY: ClassVar[str] = "allocation:{allocation_id}"


class AllocationRequested(_AdminEnvelope):
    """A project's lead asks for more (the event's `reason` is their why, mandatory):

    - `gpu-hours`: a new allocation of `amount_units` over [period_start, period_end), optionally
      for one `cluster`;
    - `extension`: allocation `allocation_id` to end at `extend_to` instead;
    - `time-slice`: an agreement of `gpus` GPUs of `cluster` whenever `window` is open.

    An admin approves (the grant that `budget apply` would write, then `AllocationRequestDecided`)
    or denies it."""

    type: Literal["AllocationRequested"] = "AllocationRequested"
    request_id: Identifier
    project: Identifier
    kind: Literal["gpu-hours", "extension", "time-slice"]
    amount_units: ChargeUnits = 0
    period: Annotated[str, Field(max_length=100)] | None = None
    period_start: UnixSeconds | None = None
    period_end: UnixSeconds | None = None
    allocation_id: Identifier | None = None
    extend_to: UnixSeconds | None = None
    cluster: Identifier | None = None
    gpus: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None
    window: WindowSpec | None = None

    KEY: ClassVar[str] = "request:{request_id}"


class AllocationRequestDecided(_AdminEnvelope):
    """An admin's decision on a request (`reason`: their comment). An approval follows the event
    it granted (`granted_event_id`: an AllocationGranted, AllocationExtended or AgreementGranted,
    possibly of another amount than asked) in the same batch."""

    type: Literal["AllocationRequestDecided"] = "AllocationRequestDecided"
    request_id: Identifier
    decision: Literal["approved", "denied"]
    granted_event_id: Annotated[str, Field(min_length=1, max_length=400)] | None = None

    KEY: ClassVar[str] = "request:{request_id}"


AdminEvent = Annotated[
    NodeDeclared
    | ClusterDeclared
    | PolicyChanged
    | AllocationGranted
    | AllocationAdjusted
    | AllocationTransferred
    | AllocationExpired
    | AgreementGranted
    | AgreementRevoked
    | UsageDisputed
    | DisputeResolved
    | AllocationExtended
    | AllocationRequested
    | AllocationRequestDecided,
    Field(discriminator="type"),
]
ADMIN_EVENT_TYPES: tuple[type[BaseModel], ...] = (
    NodeDeclared,
    ClusterDeclared,
    PolicyChanged,
    AllocationGranted,
    AllocationAdjusted,
    AllocationTransferred,
    AllocationExpired,
    AgreementGranted,
    AgreementRevoked,
    UsageDisputed,
    DisputeResolved,
    AllocationExtended,
    AllocationRequested,
    AllocationRequestDecided,
)
_admin_event_adapter: TypeAdapter[AdminEvent] = TypeAdapter(AdminEvent)


def parse_admin_event(raw: bytes) -> AdminEvent:
    return parse_with(_admin_event_adapter, raw)


def encode_admin_event(event: AdminEvent) -> bytes:
    return orjson.dumps(event.model_dump(mode="json"))


def admin_event_json_schema() -> dict[str, object]:
    return _admin_event_adapter.json_schema()
