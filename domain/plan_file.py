"""The quarterly plan file (YAML): its model, and errors that name the line and the field.

A plan describes one period (a quarter by default): clusters, the organisation tree, the charge
policy, allocations and time-slice agreements. `domain.plan` diffs it against the admin state.
Amounts are exact: GPU-hours and rates are decimals in the file and integers after parsing; a value
that does not convert exactly (a rate with three decimals) is an error, never rounded.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from allmende.domain.allocations import UNITS_PER_GPU_HOUR, default_allocation_id, quarter_bounds
from allmende.domain.charging import RATE_SCALE
from allmende.schemas.events import MAX_GPUS, Name

# Ids the platform composes or only refers to (the plan, policies, allocations, agreements, GPU
# types): the events' wider rule. Projects, groups, clusters and users (leads) are `Name`s: the
# one rule of docs/security.md, "Identifiers", that the admin API checks too.
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@/+-]+$")]
# Sizes (docs/security.md): a cluster or an agreement of at most MAX_GPUS GPUs; a budget, a
# transfer or an adjustment of at most MAX_GPU_HOURS weighted GPU-hours (3.6e18 charge units: a
# signed 64-bit integer holds it); at most MAX_LEADS leads per node.
MAX_GPU_HOURS = 10**9
MAX_LEADS = 100
Gpus = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Leads = Annotated[list[Name], Field(max_length=MAX_LEADS)]


EARLIEST, LATEST = 1_000_000_000, 10_000_000_000  # the events' bounds: 2001-09-09 .. 2286-11-20


def _zoned(value: int | dt.datetime | dt.date) -> int | dt.datetime | dt.date:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        raise ValueError(f"{value.isoformat()} has no time zone; add Z or an offset")
    if not EARLIEST <= to_unix(value, "instant") < LATEST:
        raise ValueError(f"{value} is outside 2001-09-09 .. 2286-11-20")
    return value


# Unix seconds, a date (midnight UTC) or a datetime with a zone: never a wall-clock time without one.
Instant = Annotated[int | dt.datetime | dt.date, AfterValidator(_zoned)]
DAY_NAMES = {"mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5, "sun": 6}


class PlanInvalid(ValueError):
    """A plan file that cannot be used; `problems` are (line, field, message)."""

    def __init__(self, problems: list[tuple[int | None, str, str]]) -> None:
        self.problems = problems
        super().__init__(
            "; ".join(
                f"line {line}: {field}: {msg}" if line else f"{field}: {msg}" for line, field, msg in problems
            )
        )


def to_unix(value: Instant, what: str) -> int:
    """An instant from the file: Unix seconds, a UTC date (midnight) or a datetime with a zone."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{what} {value.isoformat()} has no time zone; add Z or an offset")
        return int(value.timestamp())
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp())
    return value


def exact_int(value: Decimal, scale: int, what: str) -> int:
    scaled = value * scale
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{what} {value} is finer than 1/{scale}")
    return int(scaled)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeriodSpec(_Model):
    start: Instant
    end: Instant

    @model_validator(mode="after")
    def _ordered(self) -> PeriodSpec:
        if to_unix(self.end, "end") <= to_unix(self.start, "start"):
            raise ValueError("the period ends before it starts")
        return self


class ClusterSpec(_Model):
    name: Name
    gpu_type: Id
    gpus: Gpus


class NodeSpec(_Model):
    id: Name
    kind: Literal["organisation", "group", "project"]
    parent: Name | None = None
    shares: Annotated[int, Field(ge=0, le=1_000_000)] | Literal["parent"] = 1
    leads: Leads = []


def _hundredths_only(value: Decimal) -> Decimal:
    exact_int(value, RATE_SCALE, "rate")
    return value


Rate = Annotated[Decimal, Field(ge=0, le=100), AfterValidator(_hundredths_only)]  # a factor, to 0.01


class PolicySpec(_Model):
    id: Id
    effective_from: Instant | None = None  # default: the period's start
    gpu_type_weights: dict[Id, Rate] = {}
    default_gpu_type_weight: Rate = Decimal(1)
    priority_multipliers: dict[Literal["preemptible", "standard", "non-preemptible"], Rate]
    interactive_rate: Rate = Decimal(1)

    @field_validator("priority_multipliers")
    @classmethod
    def _every_class(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        missing = {"preemptible", "standard", "non-preemptible"} - set(value)
        if missing:
            raise ValueError(f"needs a multiplier for every priority class; missing {sorted(missing)}")
        return value

    def hundredths(self) -> dict[str, Any]:
        return rates_in_hundredths(
            self.gpu_type_weights,
            self.default_gpu_type_weight,
            self.priority_multipliers,
            self.interactive_rate,
        )


def rates_in_hundredths(
    weights: Mapping[str, Decimal],
    default_weight: Decimal,
    multipliers: Mapping[Any, Decimal],  # keyed by priority class (a Literal in the models)
    interactive: Decimal,
) -> dict[str, Any]:
    """Decimal factors (1.25) as the integer hundredths (125) a PolicyChanged event carries."""

    def h(value: Decimal, what: str) -> int:
        return exact_int(value, RATE_SCALE, what)

    return {
        "gpu_type_weights": {k: h(v, f"weight of {k}") for k, v in weights.items()},
        "default_gpu_type_weight": h(default_weight, "default_gpu_type_weight"),
        "priority_multipliers": {k: h(v, f"multiplier of {k}") for k, v in multipliers.items()},
        "interactive_rate": h(interactive, "interactive_rate"),
    }


class AllocationSpec(_Model):
    project: Name
    gpu_hours: Annotated[Decimal, Field(ge=0, le=MAX_GPU_HOURS)]
    id: Id | None = None
    cluster: Name | None = None
    gpu_type: Id | None = None
    rollover: bool = False

    @field_validator("gpu_hours")
    @classmethod
    def _exact(cls, value: Decimal) -> Decimal:
        exact_int(value, UNITS_PER_GPU_HOUR, "gpu_hours")
        return value

    def allocation_id(self, period: str) -> str:
        return self.id or default_allocation_id(self.project, period, self.cluster, self.gpu_type)

    @property
    def amount_units(self) -> int:
        return exact_int(self.gpu_hours, UNITS_PER_GPU_HOUR, "gpu_hours")


class FixedSpec(_Model):
    start: Instant
    end: Instant


class WeeklySpec(_Model):
    days: Annotated[list[str | int], Field(min_length=1, max_length=7)]
    start: Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]  # HH:MM local time
    hours: Annotated[Decimal, Field(gt=0, le=168)]
    time_zone: str
    valid_from: Instant | None = None  # default: the period's start

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # "Europe" is a directory, not a zone
            raise ValueError(f"unknown time zone {value!r}; use an IANA name like Europe/Berlin") from None
        return value

    valid_until: Instant | None = None  # default: the period's end

    @field_validator("days")
    @classmethod
    def _days(cls, value: list[str | int]) -> list[str | int]:
        for day in value:
            if isinstance(day, str) and day.lower()[:3] not in DAY_NAMES:
                raise ValueError(f"unknown day {day!r}; use mon .. sun")
            if isinstance(day, int) and not 0 <= day <= 6:
                raise ValueError(f"day {day} is not 0 (Monday) .. 6 (Sunday)")
        return value

    def weekdays(self) -> tuple[int, ...]:
        return tuple(sorted({DAY_NAMES[d.lower()[:3]] if isinstance(d, str) else d for d in self.days}))

    @field_validator("hours")
    @classmethod
    def _whole_seconds(cls, value: Decimal) -> Decimal:
        exact_int(value, 3600, "hours")
        return value


class AgreementSpec(_Model):
    id: Id
    project: Name
    cluster: Name
    gpus: Gpus
    fixed: FixedSpec | None = None
    weekly: WeeklySpec | None = None

    @model_validator(mode="after")
    def _one_window(self) -> AgreementSpec:
        if (self.fixed is None) == (self.weekly is None):
            raise ValueError("give exactly one window: fixed or weekly")
        return self


class Plan(_Model):
    plan: Id
    period: str | PeriodSpec
    clusters: list[ClusterSpec] = []
    organisation: list[NodeSpec] = []
    policy: PolicySpec | None = None
    allocations: list[AllocationSpec] = []
    agreements: list[AgreementSpec] = []

    @field_validator("period")
    @classmethod
    def _period(cls, value: str | PeriodSpec) -> str | PeriodSpec:
        if isinstance(value, str) and not EARLIEST <= quarter_bounds(value)[0] < LATEST:
            raise ValueError(f"{value} is outside 2001-09-09 .. 2286-11-20")
        return value

    @field_validator("clusters", "organisation", "agreements")
    @classmethod
    def _unique(cls, items: list[Any]) -> list[Any]:
        # Two entries with one id would make every apply flip between them: never idempotent.
        ids = [getattr(item, "name", None) or item.id for item in items]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"listed more than once: {', '.join(twice)}")
        return items

    @model_validator(mode="after")
    def _unique_allocations(self) -> Plan:
        ids = [a.allocation_id(self.period_label()) for a in self.allocations]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"allocations listed more than once: {', '.join(twice)} (give them ids)")
        return self

    def bounds(self) -> tuple[int, int]:
        if isinstance(self.period, str):
            return quarter_bounds(self.period)
        return to_unix(self.period.start, "period start"), to_unix(self.period.end, "period end")

    def period_label(self) -> str:
        if isinstance(self.period, str):
            return self.period
        start, end = self.bounds()
        from allmende.domain.allocations import period_label

        return period_label(start, end)


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the value at `loc` in the composed YAML, or of its nearest parent."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            found = node.value[part]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def locate(text: str, where: tuple[str | int, ...]) -> int | None:
    """The line of a place in the file (("allocations", 2)), to point a refusal at it."""
    try:
        return _line_of(yaml.compose(text, Loader=yaml.SafeLoader), where) if where else None
    except yaml.YAMLError:
        return None


def parse_plan(text: str) -> Plan:
    """Parse and validate a plan file; PlanInvalid lists every problem with its line and field."""
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PlanInvalid(
            [(mark.line + 1 if mark else None, "<file>", str(getattr(exc, "problem", exc)))]
        ) from None
    if not isinstance(data, dict):
        raise PlanInvalid([(1, "<file>", "a plan is a mapping with plan, period, allocations, ...")])
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = _data_path(data, err["loc"])
            field = ".".join(str(p) for p in loc) or "<file>"
            problems.append((_line_of(tree, loc), field, err["msg"]))
        raise PlanInvalid(problems) from None
    return plan


def _data_path(data: Any, loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The parts of a pydantic error location that are keys or indexes of the data.

    pydantic puts the union member it tried ("int", "function-after[...]") into the location;
    those are not fields of the file.
    """
    path: list[int | str] = []
    for part in loc:
        is_key = isinstance(data, dict) and part in data
        is_index = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if is_key or is_index:
            data = data[part]
        elif data is not None and not isinstance(data, dict | list):
            break
        else:
            if isinstance(data, dict) and isinstance(part, str) and _is_field_name(part):
                path.append(part)  # a missing field: name it, it has no line of its own
                break
            continue
        path.append(part)
    return tuple(path)


_FIELD_NAMES = {
    name
    for model in (Plan, PeriodSpec, ClusterSpec, NodeSpec, PolicySpec, AllocationSpec, FixedSpec, WeeklySpec)
    for name in model.model_fields
} | set(AgreementSpec.model_fields)


def _is_field_name(part: str) -> bool:
    return part in _FIELD_NAMES
