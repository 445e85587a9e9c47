"""Alert events: burn warnings of a project's budget, raised and cleared once per crossing; a
cluster that ran more GPUs than it has (`CapacityExceeded`, once per episode); and a job squatting
on its GPUs (`SquattingFlagged`, once per idle stretch).

They travel on `<prefix>.alerts` (one partition, kept forever: the burn alerter is its one writer
and rebuilds from it at start which warnings are active), keyed by the condition
(`{project}/{period}/{condition}`). A condition is `early-exhaustion` (the trailing-7-day forecast
runs out more than `days_early` days before the period ends) or `budget-share:<share>` (charged +
held reached that share of the allocation, e.g. `budget-share:0.8`). `crossing` counts the times
the condition became true (1, 2, ...); the event id derives from the condition and the crossing,
so a retried or concurrent publication is the same event. Instants are UTC Unix seconds; amounts
are charge units (`domain.charging`, 10^6 per weighted GPU-second); `message` is the sentence for
the project lead that the webhooks also get.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from allmende.schemas.events import Identifier, UnixSeconds, parse_with

Units = Annotated[int, Field(ge=0, le=2**62, strict=True)]
SignedUnits = Annotated[int, Field(ge=-(2**62), le=2**62, strict=True)]
Condition = Annotated[
    str, Field(pattern=r"^(early-exhaustion|budget-share:[0-9]+(\.[0-9]+)?|expires-in:[0-9]{1,4}d)$")
]
Crossing = Annotated[int, Field(ge=1, strict=True)]
MAX_LISTED = 50  # jobs and projects named in one capacity alert


class _AlertEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Annotated[str, Field(min_length=1, max_length=400)]
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    actor: Identifier = "burn-alerter"

    project: Identifier
    period: Identifier
    condition: Condition
    crossing: Crossing
    message: Annotated[str, Field(min_length=1, max_length=2000)]

    # What the warning was computed from (the project's burn rate as of `as_of`).
    as_of: UnixSeconds
    period_end: UnixSeconds
    allocated_units: Units
    charged_units: Units
    held_units: Units
    remaining_units: SignedUnits  # allocated - charged - held: negative when over budget
    trailing_units_per_day: Units  # the trailing-7-day rate
    exhaustion_at: UnixSeconds | None  # at that rate; None: the budget lasts the period

    # The record key on the topic, filled from the event's fields.
    KEY: ClassVar[str] = "{project}/{period}/{condition}"

    @property
    def key(self) -> str:
        """The key on the topic: the condition."""
        return self.KEY.format_map(self.__dict__)


class BurnWarningRaised(_AlertEnvelope):
    """The condition became true (its `crossing`-th time)."""

    type: Literal["BurnWarningRaised"] = "BurnWarningRaised"


class BurnWarningCleared(_AlertEnvelope):
    """The condition of the `crossing`-th warning is false again (`resolved`), or is no longer
    among the configured thresholds (`unconfigured`)."""

    type: Literal["BurnWarningCleared"] = "BurnWarningCleared"
    why: Literal["resolved", "unconfigured"] = "resolved"


class CapacityExceeded(BaseModel):
    """A cluster ran more GPUs than it has during [start, end) (as far as the ledger showed when it
    was raised): some of that usage was reported wrongly. Raised once per episode (its cluster and
    start); `jobs` are the runs that pushed it over (the last to start), `projects` theirs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["CapacityExceeded"] = "CapacityExceeded"
    event_id: Annotated[str, Field(min_length=1, max_length=400)]
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    actor: Identifier = "capacity-watch"
    cluster: Identifier
    capacity_gpus: Annotated[int, Field(ge=0, strict=True)]
    peak_gpus: Annotated[int, Field(ge=0, strict=True)]
    start: UnixSeconds
    end: UnixSeconds
    jobs: Annotated[list[Annotated[str, Field(max_length=400)]], Field(max_length=MAX_LISTED)]
    projects: Annotated[list[Identifier], Field(max_length=MAX_LISTED)]
    message: Annotated[str, Field(min_length=1, max_length=2000)]

    KEY: ClassVar[str] = "capacity/{cluster}"

    @property
    def key(self) -> str:
        return self.KEY.format_map(self.__dict__)


class SquattingFlagged(BaseModel):
    """A running job has held its GPUs under the squatting threshold for longer than the grace
    period (`domain.squatting`): raised once per idle stretch (the job and `idle_since`), to its
    user and its project's leads through the webhooks. Figures as of `as_of` (the ledger's clock);
    GPU-seconds exact, charges in charge units."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["SquattingFlagged"] = "SquattingFlagged"
    event_id: Annotated[str, Field(min_length=1, max_length=400)]  # squat/<job>/<idle_since>
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    actor: Identifier = "squat-watch"
    job_id: Annotated[str, Field(min_length=1, max_length=200)]
    project: Identifier
    user: Annotated[str, Field(max_length=200)]
    cluster: Annotated[str, Field(max_length=200)]
    leads: Annotated[list[Identifier], Field(max_length=MAX_LISTED)]
    gpus: Annotated[int, Field(ge=0, strict=True)]  # held in the idle stretch's latest piece
    idle_since: UnixSeconds
    as_of: UnixSeconds
    idle_gpu_seconds: Annotated[int, Field(ge=0, strict=True)]
    gpu_seconds: Annotated[int, Field(ge=0, strict=True)]  # the job's so far
    charge_units: Units  # what the job has cost so far
    message: Annotated[str, Field(min_length=1, max_length=2000)]

    KEY: ClassVar[str] = "squat/{job_id}"

    @property
    def key(self) -> str:
        return self.KEY.format_map(self.__dict__)


AlertEvent = Annotated[
    BurnWarningRaised | BurnWarningCleared | CapacityExceeded | SquattingFlagged, Field(discriminator="type")
]
BurnWarning = BurnWarningRaised | BurnWarningCleared
ALERT_EVENT_TYPES: tuple[type[BaseModel], ...] = (
    BurnWarningRaised, BurnWarningCleared, CapacityExceeded, SquattingFlagged,
)  # fmt: skip
_adapter: TypeAdapter[AlertEvent] = TypeAdapter(AlertEvent)


def parse_alert_event(raw: bytes) -> AlertEvent:
    return parse_with(_adapter, raw)


def encode_alert_event(event: AlertEvent) -> bytes:
    return orjson.dumps(event.model_dump(mode="json"))


def alert_event_json_schema() -> dict[str, object]:
    return _adapter.json_schema()
