"""Job lifecycle events: the one source of truth for what travels on `allmende.job-events`.

Every event is a flat JSON object: the envelope fields (`event_id`, `type`, `schema_version`,
`occurred_at`, `producer`, `job_id`) plus the fields of its type. Instants are UTC Unix seconds
(integers). Type names are stable strings, never Python import paths, so moving a class does not
break stored events.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

SCHEMA_VERSION = 1
T = TypeVar("T")

# Bounds keep garbage out of the ledger: 2001-09-09 .. 2286-11-20 in Unix seconds.
UnixSeconds = Annotated[int, Field(ge=1_000_000_000, lt=10_000_000_000, strict=True)]
Identifier = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@/+-]+$")]
MAX_GPUS = 100_000  # GPUs of one job, one cluster or one time-slice agreement (docs/security.md)
GpuCount = Annotated[int, Field(ge=0, le=MAX_GPUS, strict=True)]

# The names people choose for projects, groups, organisations, clusters and users (leads): a letter
# or digit first, then letters, digits, `_ @ + -` and single dots between them; at most 64
# characters. No `/`, no `..`, no `:`, no space or control character: a name is safe in a path, a
# URL segment, a header and a Slurm account. The plan file and the admin API check it
# (docs/security.md, "Identifiers"); `Identifier` above stays the wider rule of ids the platform
# composes (allocation ids are `project/period/...`) and of the job events' contract.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_@+-]*(\.[A-Za-z0-9_@+-]+)*$"
NAME_MAX_LENGTH = 64
_NAME = re.compile(NAME_PATTERN)


def valid_name(value: str) -> str:
    """`value` if it is a name (NAME_PATTERN), else ValueError with a sentence saying the rule."""
    if len(value) > NAME_MAX_LENGTH or not _NAME.fullmatch(value):
        shown = repr(value if len(value) <= NAME_MAX_LENGTH else value[:NAME_MAX_LENGTH] + "...")
        raise ValueError(
            f"{shown} is not a valid id: a letter or digit first, then letters, digits, '_', '@', '+', '-'"
            f" and single dots, at most {NAME_MAX_LENGTH} characters (no '/', '..', ':', spaces or "
            "control characters)"
        )
    return value


Name = Annotated[
    str,
    Field(min_length=1, max_length=NAME_MAX_LENGTH, json_schema_extra={"pattern": NAME_PATTERN}),
    AfterValidator(valid_name),
]


class PriorityClass(StrEnum):
    """What a job may be interrupted for; the charge policy prices each class."""

    PREEMPTIBLE = "preemptible"
    STANDARD = "standard"
    NON_PREEMPTIBLE = "non-preemptible"


class FinishStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Identifier
    schema_version: Literal[1] = 1
    occurred_at: UnixSeconds
    producer: Identifier
    job_id: Identifier


class JobSubmitted(_Envelope):
    """A job entered the queue; carries the attribution every ledger entry of the job gets."""

    type: Literal["JobSubmitted"] = "JobSubmitted"
    project: Identifier
    user: Identifier
    cluster: Identifier
    gpu_type: Identifier
    gpus: Annotated[int, Field(ge=1, le=MAX_GPUS, strict=True)]
    priority_class: PriorityClass
    interactive: bool = False
    requested_seconds: Annotated[int, Field(ge=1, le=366 * 86_400, strict=True)]


class JobStarted(_Envelope):
    """A run of the job began on `gpus` GPUs (a preempted job may start again)."""

    type: Literal["JobStarted"] = "JobStarted"
    gpus: Annotated[int, Field(ge=1, le=MAX_GPUS, strict=True)]
    hosts: tuple[Identifier, ...] = ()


class JobUsageSample(_Envelope):
    """A meter reading: the job held `gpus_in_use` GPUs since the previous reading."""

    type: Literal["JobUsageSample"] = "JobUsageSample"
    gpus_in_use: GpuCount
    gpu_utilization: Annotated[float, Field(ge=0.0, le=1.0)]


class _RunEnd(_Envelope):
    # The scheduler knows when the run started; carrying it lets the meter recover a run whose
    # JobStarted was lost.
    started_at: UnixSeconds | None = None


class JobPreempted(_RunEnd):
    type: Literal["JobPreempted"] = "JobPreempted"
    reason: Annotated[str, Field(min_length=1, max_length=500)]


class JobFinished(_RunEnd):
    type: Literal["JobFinished"] = "JobFinished"
    status: FinishStatus


JobEvent = Annotated[
    JobSubmitted | JobStarted | JobUsageSample | JobPreempted | JobFinished,
    Field(discriminator="type"),
]
JOB_EVENT_TYPES: tuple[type[BaseModel], ...] = (
    JobSubmitted,
    JobStarted,
    JobUsageSample,
    JobPreempted,
    JobFinished,
)
_job_event_adapter: TypeAdapter[JobEvent] = TypeAdapter(JobEvent)


class ContractError(ValueError):
    """The bytes are not a valid job event; `reason` says why, for the dead-letter record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_with(adapter: TypeAdapter[T], raw: bytes) -> T:
    """Decode and validate one record of a contract, or raise ContractError with a readable reason."""
    try:
        return adapter.validate_json(raw)
    except ValidationError as exc:
        raise ContractError(f"contract violation: {validation_problems(exc)}") from None


def parse_job_event(raw: bytes) -> JobEvent:
    return parse_with(_job_event_adapter, raw)


def validation_problems(exc: ValidationError, limit: int = 5) -> str:
    """The first few problems of a validation error, as `field.path: message; ...`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:limit]
    )


def encode_event(event: BaseModel) -> bytes:
    return orjson.dumps(event.model_dump(mode="json"))


def job_event_json_schema() -> dict[str, object]:
    return _job_event_adapter.json_schema()
