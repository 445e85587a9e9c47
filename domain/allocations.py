"""Allocations: GPU-hour budgets of a project for a period, and what happens to them.

An allocation holds charge units (`domain.charging`) for [start, end), optionally only for one
cluster and/or one GPU type. Its allocated amount moves by grants, adjustments and transfers; at
the period's end it expires, and what is unused is forfeited unless the allocation rolls over,
in which case it becomes a new allocation for the next period of the same length.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace

from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND

SECONDS_PER_HOUR = 3600
UNITS_PER_GPU_HOUR = CHARGE_UNITS_PER_GPU_SECOND * SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class Allocation:
    allocation_id: str
    project: str
    period: str
    start: int
    end: int
    cluster: str | None
    gpu_type: str | None
    rollover: bool
    granted_units: int
    adjusted_units: int = 0
    transferred_in_units: int = 0
    transferred_out_units: int = 0
    expired: bool = False
    forfeited_units: int = 0
    rolled_over_to: str | None = None
    granted_at: int = 0
    event_ids: tuple[str, ...] = field(default=(), compare=False)

    @property
    def allocated_units(self) -> int:
        return (
            self.granted_units + self.adjusted_units + self.transferred_in_units - self.transferred_out_units
        )

    def specificity(self) -> int:
        """How narrowly it is scoped: usage goes to the most specific allocation that covers it."""
        return (2 if self.cluster is not None else 0) + (1 if self.gpu_type is not None else 0)

    def covers(self, at: int, cluster: str, gpu_type: str) -> bool:
        return (
            self.start <= at < self.end
            and (self.cluster is None or self.cluster == cluster)
            and (self.gpu_type is None or self.gpu_type == gpu_type)
        )

    def scope(self) -> str:
        parts = [
            f"cluster {self.cluster}" if self.cluster else "",
            f"{self.gpu_type} GPUs" if self.gpu_type else "",
        ]
        return ", ".join(p for p in parts if p) or "any cluster"

    def with_event(self, event_id: str, **changes: object) -> Allocation:
        return replace(self, event_ids=(*self.event_ids, event_id), **changes)  # type: ignore[arg-type]


def default_allocation_id(project: str, period: str, cluster: str | None, gpu_type: str | None) -> str:
    """`olmo-ft/2027-Q1`, narrowed by scope: `olmo-ft/2027-Q1/b300-a/B300`."""
    return "/".join(part for part in (project, period, cluster, gpu_type) if part)


def rollover_successor(allocation: Allocation, new_id: str, unused_units: int, event_id: str) -> Allocation:
    """The allocation that takes over the unused units: the next quarter, or the next period of the
    same length when the period is not a calendar quarter."""
    start, end = next_period(allocation.start, allocation.end)
    return Allocation(
        allocation_id=new_id,
        project=allocation.project,
        period=period_label(start, end),
        start=start,
        end=end,
        cluster=allocation.cluster,
        gpu_type=allocation.gpu_type,
        rollover=allocation.rollover,
        granted_units=unused_units,
        granted_at=allocation.end,
        event_ids=(event_id,),
    )


def next_period(start: int, end: int) -> tuple[int, int]:
    label = period_label(start, end)
    if "-Q" in label:
        year, quarter = (int(x) for x in label.split("-Q"))
        return quarter_bounds(f"{year + quarter // 4}-Q{quarter % 4 + 1}")
    return end, end + (end - start)


def quarter_start(at: int) -> int:
    """The start of the UTC calendar quarter holding `at`."""
    moment = dt.datetime.fromtimestamp(at, dt.UTC)
    return int(dt.datetime(moment.year, 3 * ((moment.month - 1) // 3) + 1, 1, tzinfo=dt.UTC).timestamp())


def quarter_of(at: int) -> str:
    """The label of the UTC calendar quarter holding `at`: `2027-Q1`."""
    moment = dt.datetime.fromtimestamp(at, dt.UTC)
    return f"{moment.year}-Q{(moment.month - 1) // 3 + 1}"


def quarter_bounds(label: str) -> tuple[int, int]:
    """`2027-Q1` -> [2027-01-01T00:00Z, 2027-04-01T00:00Z) in UTC Unix seconds."""
    try:
        year_text, quarter_text = label.split("-Q")
        year, quarter = int(year_text), int(quarter_text)
    except ValueError:
        raise ValueError(f"{label!r} is not a quarter like 2027-Q1") from None
    if not 1 <= quarter <= 4 or not 1970 <= year <= 9999:
        raise ValueError(f"{label!r} is not a quarter like 2027-Q1")
    first = dt.datetime(year, 3 * quarter - 2, 1, tzinfo=dt.UTC)
    last = dt.datetime(year + (quarter == 4), 1 if quarter == 4 else 3 * quarter + 1, 1, tzinfo=dt.UTC)
    return int(first.timestamp()), int(last.timestamp())


def period_label(start: int, end: int) -> str:
    """`2027-Q1` for a calendar quarter (UTC), else `2027-01-15..2027-02-15`."""
    first = dt.datetime.fromtimestamp(start, dt.UTC)
    if first.month % 3 == 1 and first.day == 1 and start % 86_400 == 0:
        label = f"{first.year}-Q{(first.month + 2) // 3}"
        if quarter_bounds(label) == (start, end):
            return label
    last = dt.datetime.fromtimestamp(end, dt.UTC)
    return f"{first:%Y-%m-%d}..{last:%Y-%m-%d}"
