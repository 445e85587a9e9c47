"""Admission events: every decision, every hold placed and released, every host health change.

They travel on `<prefix>.admission` (one partition: the admission service is its one writer and
rebuilds its state from it at start), keyed by job id (host events: `host:<cluster>/<host>`).
Instants are UTC Unix seconds; amounts are charge units (`domain.charging`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from allmende.schemas.events import Identifier, UnixSeconds, parse_with

Units = Annotated[int, Field(ge=0, le=2**62, strict=True)]


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Annotated[str, Field(min_length=1, max_length=400)]
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    actor: Identifier

    # The record key on the topic, filled from the event's fields: "node:{node_id}".
    KEY: ClassVar[str]

    @property
    def key(self) -> str:
        """The key on the topic."""
        return self.KEY.format_map(self.__dict__)


class ReasonRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    code: str
    message: str


class VictimRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    job_id: str
    project: str
    gpus: int
    code: str
    reason: str


class AdmissionDecided(_Envelope):
    """The answer given to the scheduler for one request of one job."""

    type: Literal["AdmissionDecided"] = "AdmissionDecided"
    job_id: Identifier
    project: Identifier
    user: Identifier
    cluster: Identifier
    gpu_type: Identifier
    gpus: Annotated[int, Field(ge=1, le=1_000_000, strict=True)]
    priority_class: Literal["preemptible", "standard", "non-preemptible"]
    interactive: bool
    requested_seconds: Annotated[int, Field(ge=1, strict=True)]
    attempt: Annotated[int, Field(ge=1)] = 1  # a queued job asks again: the next attempt
    verdict: Literal["admit", "queue", "reject"]
    lane: Literal["interactive", "time-slice", "budget", "opportunistic"] | None
    reasons: tuple[ReasonRecord, ...]
    rate: Units
    expected_units: Units
    available_before_units: Units
    available_after_units: Units
    fairshare_factor: float
    preempt: tuple[VictimRecord, ...] = ()

    KEY: ClassVar[str] = "{job_id}"


class HoldPlaced(_Envelope):
    """Units reserved on allocations for an admitted job's expected charge (two-phase spending)."""

    type: Literal["HoldPlaced"] = "HoldPlaced"
    job_id: Identifier
    project: Identifier
    allocations: tuple[tuple[Identifier, Units], ...]
    expires_at: UnixSeconds

    KEY: ClassVar[str] = "{job_id}"


class HoldReleased(_Envelope):
    """What is left of a hold goes back: the job ended, or never started in time."""

    type: Literal["HoldReleased"] = "HoldReleased"
    job_id: Identifier
    reason: Literal["finished", "preempted", "expired"]

    KEY: ClassVar[str] = "{job_id}"


class HostUnhealthy(_Envelope):
    """Every job on the host becomes a preemption victim, whatever its class."""

    type: Literal["HostUnhealthy"] = "HostUnhealthy"
    cluster: Identifier
    host: Identifier
    reason: Annotated[str, Field(max_length=1000)] = ""

    KEY: ClassVar[str] = "host:{cluster}/{host}"


class HostRecovered(_Envelope):
    type: Literal["HostRecovered"] = "HostRecovered"
    cluster: Identifier
    host: Identifier

    KEY: ClassVar[str] = "host:{cluster}/{host}"


AdmissionEvent = Annotated[
    AdmissionDecided | HoldPlaced | HoldReleased | HostUnhealthy | HostRecovered,
    Field(discriminator="type"),
]
ADMISSION_EVENT_TYPES: tuple[type[BaseModel], ...] = (
    AdmissionDecided,
    HoldPlaced,
    HoldReleased,
    HostUnhealthy,
    HostRecovered,
)
_adapter: TypeAdapter[AdmissionEvent] = TypeAdapter(AdmissionEvent)


def parse_admission_event(raw: bytes) -> AdmissionEvent:
    return parse_with(_adapter, raw)


def encode_admission_event(event: AdmissionEvent) -> bytes:
    return orjson.dumps(event.model_dump(mode="json"))


def admission_event_json_schema() -> dict[str, object]:
    return _adapter.json_schema()
