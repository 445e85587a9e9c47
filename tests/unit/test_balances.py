"""Balances: segments of the allocation periods, which allocation pays, and what is over budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.allocations import Allocation
from allmende.domain.balances import ChargeRow, ProjectBalance, covering, project_balance, segments
from allmende.domain.budget_view import ChargeRowsCache, live_balance
from allmende.domain.charging import PolicyTimeline, flat_policy
from allmende.domain.fairshare.usage import UsageLedger
from allmende.schemas.ledger import LedgerEntry
from tests.unit.admin_builders import DAY, Q1, T0, adjust, grant, transfer, utc, world

PROPERTY = settings(max_examples=300, deadline=None, database=None)
JAN = (T0, utc(2027, 2, 1))
FEB = (utc(2027, 2, 1), utc(2027, 3, 1))
MAR = (utc(2027, 3, 1), Q1[1])
APRIL = (Q1[1], utc(2027, 5, 1))


def alloc(
    allocation_id: str, period: tuple[int, int] = Q1, *, cluster: str | None = None,
    gpu_type: str | None = None, units: int = 1000, granted_at: int = 0, expired: bool = False,
) -> Allocation:  # fmt: skip
    return Allocation(
        allocation_id=allocation_id, project="proj", period="p", start=period[0], end=period[1],
        cluster=cluster, gpu_type=gpu_type, rollover=False, granted_units=units, granted_at=granted_at,
        expired=expired,
    )  # fmt: skip


def row(period: tuple[int, int], units: int, cluster: str = "c1", gpu_type: str = "H100") -> ChargeRow:
    return ChargeRow(period[0], period[1], cluster, gpu_type, units, gpu_seconds=abs(units) // 10)


def balance(
    allocations: list[Allocation],
    rows: list[ChargeRow],
    total: int | None = None,
    held: dict[str, int] | None = None,
) -> ProjectBalance:
    """The balance with the project's total defaulting to the sum of the rows."""
    units = sum(r.charge_units for r in rows) if total is None else total
    return project_balance("proj", Q1[1], allocations, rows, units, sum(r.gpu_seconds for r in rows), held)


def charged(result: ProjectBalance) -> dict[str, int]:
    return {line.allocation.allocation_id: line.charged_units for line in result.allocations}


# -- segments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("periods", "expected"),
    [
        ([], []),
        ([(0, 10)], [(0, 10)]),
        ([(0, 10), (5, 15)], [(0, 5), (5, 10), (10, 15)]),
        ([(5, 15), (0, 10)], [(0, 5), (5, 10), (10, 15)]),
        ([(0, 30), (10, 20)], [(0, 10), (10, 20), (20, 30)]),
        ([(0, 10), (0, 10)], [(0, 10)]),
        ([(0, 10), (10, 20)], [(0, 10), (10, 20)]),
        ([(0, 10), (20, 30)], [(0, 10), (20, 30)]),
        ([(0, 10), (5, 25), (20, 30)], [(0, 5), (5, 10), (10, 20), (20, 25), (25, 30)]),
    ],
    ids=[
        "no allocations have no segments",
        "one period is one segment",
        "two overlapping periods cut each other into three",
        "the order of the allocations does not matter",
        "a nested period cuts the outer one into three",
        "the same period twice is one segment",
        "touching periods stay two segments",
        "the gap between two periods is not a segment",
        "a chain of overlaps cuts at every boundary",
    ],
)
def test_segments_are_the_elementary_pieces_of_the_periods(
    periods: list[tuple[int, int]], expected: list[tuple[int, int]]
) -> None:
    allocations = [alloc(f"a{n}", (T0 + s, T0 + e)) for n, (s, e) in enumerate(periods)]
    assert segments(allocations) == [(T0 + s, T0 + e) for s, e in expected]


# -- which allocation pays ----------------------------------------------------------------------

# Granted in the reverse order of their specificity, so that specificity is seen to win over time.
SCOPED = [
    alloc("any", granted_at=4),
    alloc("gpu", gpu_type="H100", granted_at=3),
    alloc("clu", cluster="c1", granted_at=2),
    alloc("both", cluster="c1", gpu_type="H100", granted_at=1),
]


@pytest.mark.parametrize(
    ("allocations", "period", "cluster", "gpu_type", "expected"),
    [
        (SCOPED, JAN, "c1", "H100", ["both", "clu", "gpu", "any"]),
        (SCOPED, JAN, "c1", "B300", ["clu", "any"]),
        (SCOPED, JAN, "c2", "H100", ["gpu", "any"]),
        (SCOPED, JAN, "c2", "B300", ["any"]),
        (list(reversed(SCOPED)), JAN, "c1", "H100", ["both", "clu", "gpu", "any"]),
        (
            [alloc("late", granted_at=T0), alloc("early", granted_at=T0 - DAY)],
            JAN,
            "c1",
            "H100",
            ["early", "late"],
        ),
        ([alloc("b", granted_at=5), alloc("a", granted_at=5)], JAN, "c1", "H100", ["a", "b"]),
        (SCOPED, APRIL, "c1", "H100", []),
        ([alloc("jan", JAN)], (JAN[1] - DAY, JAN[1] + DAY), "c1", "H100", []),
        ([alloc("jan", JAN)], JAN, "c1", "H100", ["jan"]),
        ([alloc("feb-c1", FEB, cluster="c1"), alloc("any")], JAN, "c1", "H100", ["any"]),
    ],
    ids=[
        "cluster and GPU type before cluster before GPU type before any",
        "a cluster allocation pays for another GPU type on its cluster",
        "a GPU-type allocation pays on another cluster",
        "an unscoped allocation pays for anything",
        "the order they are given in does not matter",
        "of two equally specific allocations the earlier grant pays first",
        "a tie in grant time goes to the smaller id",
        "use outside every period has no payer",
        "use that runs past the end of a period is not covered by it",
        "use exactly over the period is covered",
        "a more specific allocation for another time does not pay",
    ],
)
def test_covering_orders_the_payers_most_specific_first_and_earlier_grant_on_ties(
    allocations: list[Allocation], period: tuple[int, int], cluster: str, gpu_type: str, expected: list[str]
) -> None:
    payers = covering(allocations, period[0], period[1], cluster, gpu_type)
    assert [a.allocation_id for a in payers] == expected


# -- the balance --------------------------------------------------------------------------------


def test_rows_go_to_the_most_specific_allocation_that_covers_them() -> None:
    allocations = [alloc("any", units=1000), alloc("both", cluster="c1", gpu_type="H100", units=500)]
    rows = [row(JAN, 300, "c1", "H100"), row(JAN, 200, "c2", "B300"), row(FEB, 100, "c1", "B300")]

    result = balance(allocations, rows)

    assert charged(result) == {"any": 300, "both": 300}
    assert [line.remaining_units for line in result.allocations] == [700, 200]
    assert (result.unallocated_units, result.overspent_units, result.over_budget_units) == (0, 0, 0)
    assert result.total_charged_units == 600


@pytest.mark.parametrize(
    ("allocations", "rows", "expected", "overspent"),
    [
        (
            [alloc("any", units=1000), alloc("both", cluster="c1", gpu_type="H100", units=500)],
            [row(JAN, 700)],
            {"any": 200, "both": 500},
            0,
        ),
        (
            [alloc("any", units=100), alloc("both", cluster="c1", gpu_type="H100", units=500)],
            [row(JAN, 700)],
            {"any": 100, "both": 500},
            100,
        ),
        (
            [
                alloc("clu", cluster="c1", units=100),
                alloc("gpu", gpu_type="H100", units=100),
                alloc("any", units=100),
            ],
            [row(JAN, 250)],
            {"clu": 100, "gpu": 100, "any": 50},
            0,
        ),
        ([alloc("any", units=100)], [row(JAN, 60), row(FEB, 60), row(MAR, 60)], {"any": 100}, 80),
        ([alloc("any", units=0)], [row(JAN, 60)], {"any": 0}, 60),
    ],
    ids=[
        "what the specific allocation cannot take spills to the general one",
        "what no covering allocation can take is overspent",
        "the spill passes through every covering allocation in order",
        "an allocation fills up over time and the rest is overspent",
        "an empty allocation takes nothing",
    ],
)
def test_what_one_allocation_cannot_take_spills_to_the_next_and_then_is_overspent(
    allocations: list[Allocation], rows: list[ChargeRow], expected: dict[str, int], overspent: int
) -> None:
    result = balance(allocations, rows)

    assert charged(result) == expected
    assert result.overspent_units == overspent
    assert result.unallocated_units == 0
    assert result.over_budget_units == overspent


def test_earlier_use_spends_a_budget_first_whatever_order_the_rows_arrive_in() -> None:
    # `quarter` pays first wherever it covers; `february` only pays in February.
    allocations = [alloc("quarter", units=100, granted_at=1), alloc("february", FEB, units=100, granted_at=2)]
    in_time_order = [row(JAN, 100), row(FEB, 100)]

    for rows in (in_time_order, list(reversed(in_time_order))):
        result = balance(allocations, rows)
        assert charged(result) == {"quarter": 100, "february": 100}
        assert result.overspent_units == 0


@pytest.mark.parametrize(
    ("allocations", "rows", "total", "unallocated"),
    [
        ([alloc("q1")], [row(JAN, 100), row(APRIL, 40)], 140, 40),
        ([alloc("q1")], [row(JAN, 100)], 175, 75),
        ([alloc("c1", cluster="c1")], [row(JAN, 100, "c1"), row(JAN, 30, "c2")], 130, 30),
        (
            [alloc("h100", gpu_type="H100")],
            [row(JAN, 100, "c1", "H100"), row(JAN, 20, "c1", "B300")],
            120,
            20,
        ),
        ([], [row(JAN, 100)], 100, 100),
        ([alloc("q1")], [], 0, 0),
    ],
    ids=[
        "use after every period is unallocated",
        "use the rows do not show (outside every segment) is unallocated",
        "use on a cluster no allocation covers is unallocated",
        "use on a GPU type no allocation covers is unallocated",
        "without allocations everything is unallocated",
        "no use, nothing unallocated",
    ],
)
def test_use_no_allocation_covers_is_unallocated_and_never_dropped(
    allocations: list[Allocation], rows: list[ChargeRow], total: int, unallocated: int
) -> None:
    result = balance(allocations, rows, total=total)

    assert result.unallocated_units == unallocated
    assert result.over_budget_units == unallocated
    assert sum(charged(result).values()) + result.overspent_units + result.unallocated_units == total


@pytest.mark.parametrize(
    ("units", "use", "held", "remaining", "available"),
    [
        (1000, 300, 0, 700, 700),
        (1000, 300, 150, 550, 550),
        (1000, 1000, 0, 0, 0),
        (1000, 300, 800, -100, 0),
        (1000, 0, 0, 1000, 1000),
    ],
    ids=[
        "remaining is allocated minus charged",
        "held units are not available either",
        "a fully spent allocation has nothing left",
        "holds beyond what is left make remaining negative, but nothing is available",
        "an unused allocation has everything left",
    ],
)
def test_remaining_is_allocated_minus_charged_minus_held(
    units: int, use: int, held: int, remaining: int, available: int
) -> None:
    result = balance([alloc("a1", units=units)], [row(JAN, use)] if use else [], held={"a1": held})
    (line,) = result.allocations

    assert (line.allocated_units, line.charged_units, line.held_units) == (units, use, held)
    assert line.remaining_units == remaining == line.allocated_units - line.charged_units - line.held_units
    assert line.available_units == available


@pytest.mark.parametrize(
    ("use", "held"),
    [(300, 0), (0, 0), (1000, 0), (300, 200)],
    ids=[
        "a partly used expired allocation has nothing left",
        "an unused expired allocation has nothing left",
        "a fully used expired allocation has nothing left",
        "holds on an expired allocation change nothing",
    ],
)
def test_an_expired_allocation_shows_its_charges_and_nothing_remaining(use: int, held: int) -> None:
    result = balance(
        [alloc("a1", units=1000, expired=True)], [row(JAN, use)] if use else [], held={"a1": held}
    )
    (line,) = result.allocations

    assert line.charged_units == use
    assert (line.remaining_units, line.available_units) == (0, 0)


def test_a_correction_with_negative_charges_is_given_back_to_the_first_payer() -> None:
    result = balance(
        [alloc("any"), alloc("both", cluster="c1", gpu_type="H100")], [row(JAN, 100), row(FEB, -30)]
    )

    assert charged(result) == {"any": 0, "both": 70}
    assert (result.unallocated_units, result.overspent_units) == (0, 0)


def test_lines_follow_the_allocations_and_unused_ones_show_zero() -> None:
    allocations = [alloc("b"), alloc("a", cluster="c9"), alloc("c", APRIL)]
    result = balance(allocations, [row(JAN, 10)])

    assert [line.allocation.allocation_id for line in result.allocations] == ["b", "a", "c"]
    assert charged(result) == {"b": 10, "a": 0, "c": 0}
    assert (result.project, result.as_of) == ("proj", Q1[1])


def test_the_balance_of_a_folded_state_counts_grants_adjustments_and_transfers() -> None:
    state = world(
        grant("a1", units=1000),
        grant("a2", units=0, cluster="c1"),
        transfer("a1", "a2", 300),
        adjust("a2", 50),
    )
    allocations = state.allocations_of("proj")

    result = balance(allocations, [row(JAN, 400, "c1"), row(JAN, 100, "c2")])

    assert {line.allocation.allocation_id: line.allocated_units for line in result.allocations} == {
        "a1": 700,
        "a2": 350,
    }
    assert charged(result) == {"a1": 150, "a2": 350}
    assert [line.remaining_units for line in result.allocations] == [550, 0]


# -- nothing is ever dropped --------------------------------------------------------------------

CLUSTERS = st.sampled_from(["c1", "c2"])
GPU_TYPES = st.sampled_from(["H100", "B300"])
BOUNDS = st.integers(min_value=0, max_value=12).map(lambda d: T0 + d * DAY)


@st.composite
def allocations_strategy(draw: st.DrawFn) -> list[Allocation]:
    found = []
    for n in range(draw(st.integers(min_value=0, max_value=5))):
        start, end = sorted(draw(st.lists(BOUNDS, min_size=2, max_size=2, unique=True)))
        found.append(
            alloc(
                f"a{n}",
                (start, end),
                cluster=draw(st.none() | CLUSTERS),
                gpu_type=draw(st.none() | GPU_TYPES),
                units=draw(st.integers(min_value=0, max_value=1000)),
                granted_at=draw(st.integers(min_value=0, max_value=3)),
                expired=draw(st.booleans()),
            )
        )
    return found


@PROPERTY
@given(data=st.data(), allocations=allocations_strategy())
def test_every_charge_unit_is_charged_to_an_allocation_overspent_or_unallocated(
    data: st.DataObject, allocations: list[Allocation]
) -> None:
    # Rows on the allocations' own segments (as the ledger gives them) and on arbitrary days.
    spans = segments(allocations) + data.draw(
        st.lists(st.tuples(BOUNDS, BOUNDS).filter(lambda p: p[0] < p[1]), max_size=3)
    )
    rows = [
        ChargeRow(start, end, data.draw(CLUSTERS), data.draw(GPU_TYPES), data.draw(st.integers(0, 600)), 1)
        for start, end in data.draw(st.lists(st.sampled_from(spans), max_size=12) if spans else st.just([]))
    ]
    outside = data.draw(st.integers(min_value=0, max_value=500))  # use no row shows
    total = sum(r.charge_units for r in rows) + outside

    result = balance(allocations, rows, total=total)

    lines = charged(result)
    assert sum(lines.values()) + result.overspent_units + result.unallocated_units == total
    assert result.over_budget_units == result.overspent_units + result.unallocated_units
    uncovered = sum(
        r.charge_units for r in rows if not covering(allocations, r.start, r.end, r.cluster, r.gpu_type)
    )
    assert result.unallocated_units == uncovered + outside
    for line in result.allocations:
        assert 0 <= line.charged_units <= max(0, line.allocated_units)
        if line.allocation.expired:
            assert line.remaining_units == 0
    if result.overspent_units:
        assert any(line.charged_units == line.allocated_units for line in result.allocations)


# -- the admission service's kept sums ---------------------------------------------------------

CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["e1", "e2", "e3", "e4"]), st.integers(0, 5),
        st.integers(T0 - DAY, T0 + 12 * DAY), st.integers(1, 3 * DAY), st.integers(0, 8),
        st.sampled_from(["c1", "c2"]), st.sampled_from(["H100", "B300"]),
    ),
    max_size=25,
)  # fmt: skip
FLAT = PolicyTimeline([flat_policy()])


@PROPERTY
@given(
    allocations=allocations_strategy(), batches=st.lists(CHANGES, min_size=1, max_size=4), cut=st.booleans()
)
def test_sums_kept_from_the_usages_changes_give_the_live_balance(
    allocations: list[Allocation], batches: list[list[tuple[str, int, int, int, int, str, str]]], cut: bool
) -> None:
    cache, usage = ChargeRowsCache(), UsageLedger()
    now, held = T0 + DAY, {a.allocation_id: 7 for a in allocations[:1]}
    for n, batch in enumerate(batches):
        for entry_id, version, start, seconds, gpus, cluster, gpu_type in batch:
            usage.apply(
                LedgerEntry(
                    entry_id=entry_id, job_id=f"job-{entry_id}", version=version, interval_start=start,
                    interval_end=start + seconds, gpus=gpus, project="proj", user="u", cluster=cluster,
                    gpu_type=gpu_type, priority_class="standard", interactive=False, source_event_id="s",
                ),
                FLAT,
            )  # fmt: skip
        # Half way, the allocations change (a new key): the sums are counted again.
        kept = allocations if not cut or n < len(batches) // 2 else allocations[:1]
        got = cache.balance_of("proj", usage, len(kept), now, kept, held)
        assert got == live_balance("proj", now, kept, usage.hours.get("proj", {}), held)
