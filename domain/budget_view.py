"""Budgets from the in-memory usage (hour slots) and the holds: what the admission service spends.

The ledger in ClickHouse is exact to the second; the admission service must not ask it on every
request, so it keeps charge units per (hour, cluster, GPU type) from the ledger-entry stream
(`domain.fairshare_usage.UsageLedger`). An hour is credited to the allocation segment its start
falls in: exact for periods that begin and end on the hour (quarters, days), as plan files give.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping, Sequence

from domain.admission_model import BudgetLine
from domain.allocations import Allocation
from domain.balances import ChargeRow, ProjectBalance, covering, project_balance, segments
from domain.fairshare_usage import BUCKET_S, Slot


def rows_from_hours(allocations: Sequence[Allocation], slots: Mapping[Slot, int]) -> list[ChargeRow]:
    segs = segments(allocations)
    starts = [s for s, _ in segs]
    totals: dict[tuple[int, str, str], int] = {}
    for (hour, cluster, gpu_type), units in slots.items():
        at = hour * BUCKET_S
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < segs[i][1]:
            key = (i, cluster, gpu_type)
            totals[key] = totals.get(key, 0) + units
    return [
        ChargeRow(segs[i][0], segs[i][1], cluster, gpu_type, units, 0)
        for (i, cluster, gpu_type), units in sorted(totals.items())
    ]


def live_balance(
    project: str,
    now: int,
    allocations: Sequence[Allocation],
    slots: Mapping[Slot, int],
    held: Mapping[str, int],
) -> ProjectBalance:
    """The balance from the hours as they are now (no cache: every call walks them)."""
    return ChargeRowsCache().balance(project, None, now, allocations, slots, held)


class ChargeRowsCache:
    """`rows_from_hours` and the total per project, computed again only when the caller's key
    (its usage's version, the allocations' revision) changes: a decision then costs the project's
    allocation segments, not its history of hours."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Hashable, list[ChargeRow], int]] = {}

    def balance(
        self,
        project: str,
        key: Hashable,
        now: int,
        allocations: Sequence[Allocation],
        slots: Mapping[Slot, int],
        held: Mapping[str, int],
    ) -> ProjectBalance:
        """`live_balance`, equal to it for the same inputs as long as `key` names them."""
        cached = self._rows.get(project)
        if cached is None or cached[0] != key:
            cached = (key, rows_from_hours(allocations, slots), sum(slots.values()))
            self._rows[project] = cached
        _, rows, total = cached
        return project_balance(project, now, allocations, rows, total, 0, held)


def budget_lines(balance: ProjectBalance, now: int, cluster: str, gpu_type: str) -> tuple[BudgetLine, ...]:
    """The allocations that may pay for a job on (cluster, GPU type) now, in paying order."""
    by_id = {line.allocation.allocation_id: line for line in balance.allocations}
    payers = covering([line.allocation for line in balance.allocations], now, now + 1, cluster, gpu_type)
    return tuple(
        BudgetLine(a.allocation_id, a.period, by_id[a.allocation_id].available_units)
        for a in payers
        if not a.expired
    )
