"""Budgets from the in-memory usage (hour slots) and the holds: what the admission service spends.

The ledger in ClickHouse is exact to the second; the admission service must not ask it on every
request, so it keeps charge units per (hour, cluster, GPU type) from the ledger-entry stream
(`domain.fairshare.usage.UsageLedger`). An hour is credited to the allocation segment its start
falls in: exact for periods that begin and end on the hour (quarters, days), as plan files give.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping, Sequence

from allmende.domain.admission_model import BudgetLine
from allmende.domain.allocations import Allocation
from allmende.domain.balances import ChargeRow, ProjectBalance, covering, project_balance, segments
from allmende.domain.fairshare.usage import BUCKET_S, Slot, UsageLedger


class _SegmentSums:
    """Charge units per (allocation segment, cluster, GPU type), from hour slots added one by one."""

    def __init__(self, allocations: Sequence[Allocation]) -> None:
        self.segs = segments(allocations)
        self._starts = [s for s, _ in self.segs]
        self.totals: dict[tuple[int, str, str], int] = {}
        self.total = 0  # of every slot, inside a segment or not

    def add(self, slot: Slot, units: int) -> None:
        self.total += units
        hour, cluster, gpu_type = slot
        at = hour * BUCKET_S
        i = bisect.bisect_right(self._starts, at) - 1
        if i >= 0 and at < self.segs[i][1]:
            key = (i, cluster, gpu_type)
            left = self.totals.get(key, 0) + units
            if left:
                self.totals[key] = left
            else:
                self.totals.pop(key, None)  # a segment without charges has no row

    def rows(self) -> list[ChargeRow]:
        return [
            ChargeRow(self.segs[i][0], self.segs[i][1], cluster, gpu_type, units, 0)
            for (i, cluster, gpu_type), units in sorted(self.totals.items())
        ]


def _sums(allocations: Sequence[Allocation], slots: Mapping[Slot, int]) -> _SegmentSums:
    sums = _SegmentSums(allocations)
    for slot, units in slots.items():
        sums.add(slot, units)
    return sums


def live_balance(
    project: str,
    now: int,
    allocations: Sequence[Allocation],
    slots: Mapping[Slot, int],
    held: Mapping[str, int],
) -> ProjectBalance:
    """The balance from the hours as they are now (no cache: every call walks them)."""
    sums = _sums(allocations, slots)
    return project_balance(project, now, allocations, sums.rows(), sums.total, 0, held)


class ChargeRowsCache:
    """Charge units per allocation segment for each project, kept from the usage's changes: a
    decision then costs the project's allocation segments, not its history of hours."""

    def __init__(self) -> None:
        self._followed: dict[str, tuple[Hashable, _SegmentSums]] = {}

    def balance_of(
        self,
        project: str,
        usage: UsageLedger,
        allocations_key: Hashable,
        now: int,
        allocations: Sequence[Allocation],
        held: Mapping[str, int],
    ) -> ProjectBalance:
        """`live_balance` on the usage's hours of `project`, kept up to date from the usage's
        changes (`UsageLedger.follow`): a decision costs the slots that changed since the last
        one, not the project's history. Counted again when the allocations (`allocations_key`)
        or the usage ledger change, or the usage did not keep the changes."""
        key = (usage.generation, allocations_key)
        followed = self._followed.get(project)
        changes = usage.changes(project) if followed is not None and followed[0] == key else None
        if followed is None or changes is None:
            usage.follow(project)
            sums = _sums(allocations, usage.hours.get(project, {}))
            self._followed[project] = (key, sums)
        else:
            sums = followed[1]
            for slot, units in changes:
                sums.add(slot, units)
        return project_balance(project, now, allocations, sums.rows(), sums.total, 0, held)


def budget_lines(balance: ProjectBalance, now: int, cluster: str, gpu_type: str) -> tuple[BudgetLine, ...]:
    """The allocations that may pay for a job on (cluster, GPU type) now, in paying order."""
    by_id = {line.allocation.allocation_id: line for line in balance.allocations}
    payers = covering([line.allocation for line in balance.allocations], now, now + 1, cluster, gpu_type)
    return tuple(
        BudgetLine(a.allocation_id, a.period, by_id[a.allocation_id].available_units)
        for a in payers
        if not a.expired
    )
