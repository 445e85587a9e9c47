"""Balances: allocated, charged, held and remaining per allocation, from allocations and charges.

Charges reach the balance as rows per *segment*: the time between consecutive boundaries of the
project's allocation periods, so that inside one segment the same allocations are in force. Each
row (segment, cluster, GPU type) goes to the most specific allocation covering it (cluster and
GPU type, then cluster, then GPU type, then any; ties go to the earlier grant). What no allocation
covers is over-budget usage: recorded and shown, never dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from domain.allocations import Allocation


@dataclass(frozen=True, slots=True)
class ChargeRow:
    """Charges of one project in [start, end) on one cluster and GPU type."""

    start: int
    end: int
    cluster: str
    gpu_type: str
    charge_units: int
    gpu_seconds: int


@dataclass(frozen=True, slots=True)
class AllocationBalance:
    allocation: Allocation
    charged_units: int
    charged_gpu_seconds: int
    held_units: int

    @property
    def allocated_units(self) -> int:
        return self.allocation.allocated_units

    @property
    def remaining_units(self) -> int:
        """Negative when the allocation is overspent (usage is never refused after the fact)."""
        if self.allocation.expired:
            return 0
        return self.allocated_units - self.charged_units - self.held_units

    @property
    def available_units(self) -> int:
        return max(0, self.remaining_units)


@dataclass(frozen=True, slots=True)
class ProjectBalance:
    project: str
    as_of: int
    allocations: tuple[AllocationBalance, ...]
    unallocated_units: int  # charges no allocation covers: over-budget usage
    unallocated_gpu_seconds: int
    total_charged_units: int
    total_gpu_seconds: int


def segments(allocations: Iterable[Allocation]) -> list[tuple[int, int]]:
    """The elementary segments of the allocation periods, sorted; covered by at least one period."""
    periods = [(a.start, a.end) for a in allocations]
    cuts = sorted({t for period in periods for t in period})
    return [(s, e) for s, e in itertools.pairwise(cuts) if any(ps <= s and e <= pe for ps, pe in periods)]


def best_allocation(
    allocations: Sequence[Allocation], start: int, end: int, cluster: str, gpu_type: str
) -> Allocation | None:
    covering = [
        a for a in allocations if a.start <= start and end <= a.end and a.covers(start, cluster, gpu_type)
    ]
    if not covering:
        return None
    return min(covering, key=lambda a: (-a.specificity(), a.granted_at, a.allocation_id))


def project_balance(
    project: str,
    as_of: int,
    allocations: Sequence[Allocation],
    rows: Iterable[ChargeRow],
    total_charged_units: int,
    total_gpu_seconds: int,
    held: Mapping[str, int] | None = None,
) -> ProjectBalance:
    """Assign the segment rows to allocations; the rest of the project's total is unallocated."""
    charged: dict[str, list[int]] = {a.allocation_id: [0, 0] for a in allocations}
    for row in rows:
        target = best_allocation(allocations, row.start, row.end, row.cluster, row.gpu_type)
        if target is not None:
            charged[target.allocation_id][0] += row.charge_units
            charged[target.allocation_id][1] += row.gpu_seconds
    lines = tuple(
        AllocationBalance(
            a, charged[a.allocation_id][0], charged[a.allocation_id][1], (held or {}).get(a.allocation_id, 0)
        )
        for a in allocations
    )
    matched_units = sum(line.charged_units for line in lines)
    matched_seconds = sum(line.charged_gpu_seconds for line in lines)
    return ProjectBalance(
        project=project,
        as_of=as_of,
        allocations=lines,
        unallocated_units=total_charged_units - matched_units,
        unallocated_gpu_seconds=total_gpu_seconds - matched_seconds,
        total_charged_units=total_charged_units,
        total_gpu_seconds=total_gpu_seconds,
    )
