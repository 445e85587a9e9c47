"""Response models of the public API (one model per direction)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from pydantic import BaseModel, Field

SECONDS_PER_HOUR = 3600


def gpu_hours(gpu_seconds: int) -> Decimal:
    """Exact GPU-hours for display: integer seconds / 3600, to 4 decimal places (0.36 s)."""
    return (Decimal(gpu_seconds) / SECONDS_PER_HOUR).quantize(Decimal("0.0001"))


class UsageDay(BaseModel):
    day: dt.date
    group: str | None = Field(default=None, description="value of group_by, when given")
    gpu_seconds: int
    gpu_hours: Decimal


class ProjectUsage(BaseModel):
    project: str
    first_day: dt.date
    last_day: dt.date
    group_by: str | None
    total_gpu_seconds: int
    total_gpu_hours: Decimal
    days: list[UsageDay]


class Health(BaseModel):
    status: str
    clickhouse: str
    writer: str
    writer_batches: int
    writer_caught_up: bool
    fairshare: str = "disabled"
    alerts: str = "disabled"  # the burn alerter's last round: shown, not counted against "ok"
    # Seconds since the admin state (budgets, organisation) last reached the end of its log:
    # Kafka away, reads answer from that state, this old (also in every response's header).
    admin_state_age_s: float | None = None
    # "leader" (decides and writes), "standby" (one of several instances: follows, answers
    # reads, refuses writes with 503 not-leader) or "disabled".
    admission: str = "disabled"


class ErrorBody(BaseModel):
    detail: str
