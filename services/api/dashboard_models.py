"""Response models of the dashboard routes (docs/dashboard-api.md): metadata and flat `rows`.

Every response has `rows`, a list of flat objects, which `format=csv` returns as CSV: one model
per table keeps the JSON and the CSV the same columns in the same order.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, Field

from allmende.domain.squatting import IDLE_UNITS_PER_GPU_SECOND
from allmende.services.api.admin_models import units_to_hours
from allmende.services.api.models import SECONDS_PER_HOUR, gpu_hours

__all__ = ["gpu_hours", "units_to_hours"]


def idle_hours(idle_units: int) -> Decimal:
    """Idle GPU-hours of idle units (10,000 per fully idle GPU-second), to 4 places."""
    return (Decimal(idle_units) / (IDLE_UNITS_PER_GPU_SECOND * SECONDS_PER_HOUR)).quantize(Decimal("0.0001"))


def percent(share: Fraction | None) -> Decimal | None:
    if share is None:
        return None
    return (Decimal(share.numerator * 100) / Decimal(share.denominator)).quantize(Decimal("0.01"))


def instant(at: int | None) -> str | None:
    if at is None:
        return None
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PeriodRow(BaseModel):
    period: str
    start: str
    end: str


class PeriodsOut(BaseModel):
    rows: list[PeriodRow]


class ProjectRow(BaseModel):
    project: str


class ProjectsOut(BaseModel):
    rows: list[ProjectRow]


class _PeriodMeta(BaseModel):
    period: str
    period_start: str
    period_end: str
    as_of: str = Field(description="usage up to this instant; default: the ledger's clock")


class ForecastOut(BaseModel):
    basis: Literal["period_to_date", "trailing_7d"]
    charged_gpu_hours_per_day: Decimal
    exhaustion_at: str | None = Field(description="when allocated is spent at this rate; null: it lasts")
    days_left: int | None
    lasts_period: bool
    projected_charged_gpu_hours_at_end: Decimal


class BurnDayRow(BaseModel):
    day: dt.date
    gpu_hours: Decimal
    charged_gpu_hours: Decimal
    cumulative_charged_gpu_hours: Decimal
    even_burn_gpu_hours: Decimal


class BurnOut(_PeriodMeta):
    project: str
    allocated_gpu_hours: Decimal
    charged_gpu_hours: Decimal = Field(description="every charge of the project in the period")
    held_gpu_hours: Decimal
    remaining_gpu_hours: Decimal = Field(description="as `allmende budget balance` shows it")
    over_budget_gpu_hours: Decimal
    elapsed_percent: Decimal
    spent_percent: Decimal | None = Field(description="(charged + held) / allocated; null: none allocated")
    holds_count_as_spent: bool = True
    forecasts: list[ForecastOut]
    rows: list[BurnDayRow]


class BreakdownRow(BaseModel):
    key: str
    gpu_hours: Decimal
    charged_gpu_hours: Decimal
    idle_gpu_hours: Decimal


class BreakdownOut(_PeriodMeta):
    project: str
    by: str
    rows: list[BreakdownRow]


class RunningRow(BaseModel):
    job_id: str
    user: str
    cluster: str
    gpus: int
    priority_class: str
    lane: str | None
    since: str | None
    hosts: str
    requested_s: int | None = Field(description="the run time the job asked for, in seconds (null: unknown)")
    overrun_s: int | None = Field(
        description="seconds it has run past its request plus ALLMENDE_OVERRUN_GRACE_S (null: it has not)"
    )
    overran: bool = Field(description="it has run past its request plus the grace")


class RunningOut(BaseModel):
    project: str
    rows: list[RunningRow]


class HoldRow(BaseModel):
    job_id: str
    held_charged_gpu_hours: Decimal
    expires_at: str | None


class HoldsOut(BaseModel):
    project: str
    rows: list[HoldRow]


class PreemptionRow(BaseModel):
    job_id: str
    user: str
    cluster: str
    at: str | None
    reason: str


class PreemptionsOut(_PeriodMeta):
    project: str
    rows: list[PreemptionRow]


class TimeSliceRow(BaseModel):
    agreement_id: str
    cluster: str
    gpus: int
    window_start: str | None
    window_end: str | None
    guaranteed_gpu_hours: Decimal
    used_gpu_hours: Decimal
    used_percent: Decimal | None


class TimeSlicesOut(_PeriodMeta):
    project: str
    rows: list[TimeSliceRow]


class SquattingRow(BaseModel):
    job_id: str
    user: str
    cluster: str
    idle_since: str | None
    idle_until: str | None
    idle_hours: Decimal
    idle_gpu_hours: Decimal
    idle_charged_gpu_hours: Decimal
    gpu_hours: Decimal
    charged_gpu_hours: Decimal
    ongoing: bool


class SquattingOut(_PeriodMeta):
    project: str
    max_utilization_percent: Decimal
    grace_minutes: Decimal
    rows: list[SquattingRow]


class OverviewRow(BaseModel):
    project: str
    allocated_gpu_hours: Decimal
    charged_gpu_hours: Decimal
    held_gpu_hours: Decimal
    remaining_gpu_hours: Decimal
    elapsed_percent: Decimal
    spent_percent: Decimal | None
    exhaustion_at: str | None
    days_left: int | None
    lasts_period: bool
    over_budget_gpu_hours: Decimal
    idle_gpu_hours: Decimal


class OverviewOut(_PeriodMeta):
    elapsed_percent: Decimal
    rows: list[OverviewRow]
    # Admins only (else None): GPU-hours of GPUs busy with no job on them in the period, from the
    # GPUs' own samples (docs/dcgm.md), and on how many nodes: use nobody can be charged for.
    unaccounted_gpu_hours: Decimal | None = None
    unaccounted_nodes: int | None = None


class ClusterDayRow(BaseModel):
    cluster: str
    day: dt.date
    gpus: int
    used_gpu_hours: Decimal
    capacity_gpu_hours: Decimal
    utilization_percent: Decimal


class ClusterUtilizationOut(_PeriodMeta):
    rows: list[ClusterDayRow]


class FairShareRow(BaseModel):
    node_id: str
    parent_id: str | None
    depth: int
    is_leaf: bool
    raw_shares: str
    norm_shares: float
    effective_usage: float | None  # null: not shown to this caller (docs/security.md)
    factor: float | None


class FairShareOut(BaseModel):
    as_of: str | None
    algorithm: str
    rows: list[FairShareRow]
