"""Balances: allocated, charged, held and remaining per allocation, from allocations and charges.

Charges reach the balance as rows per *segment*: the time between consecutive boundaries of the
project's allocation periods, so that inside one segment the same allocations are in force.
Segments are taken in time order, so earlier use spends a budget first. Inside a segment the
covering allocations are filled most specific first (cluster and GPU type, then cluster, then GPU
type, then any; ties to the earlier grant), each up to what it has left, and what one cannot take
spills to the next. What no allocation covers is *unallocated*; what the covering allocations
cannot take is *overspent*. Both are over-budget usage: recorded and shown, never dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allmende.domain.allocations import Allocation


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
    held_units: int

    @property
    def allocated_units(self) -> int:
        return self.allocation.allocated_units

    @property
    def remaining_units(self) -> int:
        """What can still be spent; 0 once expired; below 0 only when holds exceed what is left."""
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
    unallocated_units: int  # charges no allocation covers
    overspent_units: int  # charges the covering allocations had no room for
    total_charged_units: int
    total_gpu_seconds: int

    @property
    def over_budget_units(self) -> int:
        return self.unallocated_units + self.overspent_units


def segments(allocations: Iterable[Allocation]) -> list[tuple[int, int]]:
    """The elementary segments of the allocation periods, sorted; covered by at least one period."""
    periods = [(a.start, a.end) for a in allocations]
    cuts = sorted({t for period in periods for t in period})
    return [(s, e) for s, e in itertools.pairwise(cuts) if any(ps <= s and e <= pe for ps, pe in periods)]


def covering(
    allocations: Sequence[Allocation], start: int, end: int, cluster: str, gpu_type: str
) -> list[Allocation]:
    """The allocations that may pay for use in [start, end) on `cluster`, in the order they pay."""
    found = [
        a for a in allocations if a.start <= start and end <= a.end and a.covers(start, cluster, gpu_type)
    ]
    return sorted(found, key=lambda a: (-a.specificity(), a.granted_at, a.allocation_id))


def project_balance(
    project: str,
    as_of: int,
    allocations: Sequence[Allocation],
    rows: Iterable[ChargeRow],
    total_charged_units: int,
    total_gpu_seconds: int,
    held: Mapping[str, int] | None = None,
) -> ProjectBalance:
    """Spend the rows on the allocations in time order; the rest of the total is over budget."""
    charged = {a.allocation_id: 0 for a in allocations}
    overspent = 0
    for row in sorted(rows, key=lambda r: (r.start, r.end, r.cluster, r.gpu_type)):
        left = row.charge_units
        payers = covering(allocations, row.start, row.end, row.cluster, row.gpu_type)
        for a in payers:
            if left <= 0:
                break
            take = min(left, max(0, a.allocated_units - charged[a.allocation_id]))
            charged[a.allocation_id] += take
            left -= take
        if payers:
            if left < 0:  # net negative use in a segment (a correction): give it back to the first payer
                charged[payers[0].allocation_id] += left
            else:
                overspent += left
    lines = tuple(
        AllocationBalance(a, charged[a.allocation_id], (held or {}).get(a.allocation_id, 0))
        for a in allocations
    )
    matched = sum(line.charged_units for line in lines) + overspent
    return ProjectBalance(
        project=project,
        as_of=as_of,
        allocations=lines,
        unallocated_units=total_charged_units - matched,
        overspent_units=overspent,
        total_charged_units=total_charged_units,
        total_gpu_seconds=total_gpu_seconds,
    )
