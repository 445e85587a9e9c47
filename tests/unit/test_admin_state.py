"""The admin state: the fold of the admin log, and the rules a new admin event must pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.admin_state import (
    CHARGED,
    DISPUTED,
    DROPPED,
    AdminRejected,
    AdminState,
    Conflict,
    InsufficientBudget,
    InvalidChange,
    Overbooked,
    RetroactivePolicy,
    UnknownReference,
)
from allmende.domain.allocations import Allocation
from allmende.schemas.admin_events import AdminEvent, DisputeResolved, UsageDisputed
from tests.unit.admin_builders import (
    BEFORE,
    DAY,
    FRI,
    HOUR,
    MON,
    Q1,
    T0,
    THU,
    TUE,
    WED,
    adjust,
    agreement,
    cluster,
    expire,
    fixed,
    grant,
    node,
    organisation,
    policy,
    revoke,
    transfer,
    utc,
    weekly,
    world,
)

PROPERTY = settings(max_examples=200, deadline=None, database=None)
NOW = T0  # the instant a command is checked at, unless a case says otherwise


def allocated(state: AdminState) -> dict[str, int]:
    return {key: a.allocated_units for key, a in sorted(state.allocations.items())}


# -- the fold: idempotence ----------------------------------------------------------------------


def test_an_event_applied_again_is_recognised_as_a_duplicate_and_folded_once() -> None:
    state = world(grant("a1", units=1000))
    event = adjust("a1", 500)

    assert state.apply(event) is True
    assert state.apply(event) is False

    assert state.allocations["a1"].allocated_units == 1500
    assert state.history.count(event) == 1


def test_a_different_event_under_an_id_already_applied_is_ignored() -> None:
    state = world(grant("a1", units=1000), adjust("a1", 500, event_id="retry-1"))

    assert state.apply(adjust("a1", 900, event_id="retry-1")) is False

    assert state.allocations["a1"].allocated_units == 1500


def test_folding_the_log_twice_gives_the_same_state_as_folding_it_once() -> None:
    log = [
        *organisation(),
        grant("a1", units=1000),
        grant("a2", units=200),
        adjust("a1", 50),
        transfer("a1", "a2", 300),
        agreement("g1", 4),
        revoke("g1"),
        expire("a2", 500),
    ]

    assert AdminState.of([*log, *log]) == AdminState.of(log)
    assert AdminState.of([*log, *reversed(log)]) == AdminState.of(log)


# -- the fold: amounts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([grant("a1", units=1000)], {"a1": 1000}),
        ([grant("a1", units=1000), adjust("a1", 250)], {"a1": 1250}),
        ([grant("a1", units=1000), adjust("a1", -400)], {"a1": 600}),
        ([grant("a1", units=1000), adjust("a1", 250), adjust("a1", -100, reason="fix")], {"a1": 1150}),
        ([grant("a1", units=1000), adjust("a1", -1000)], {"a1": 0}),
        (
            [grant("a1", units=1000), grant("a2", units=200), transfer("a1", "a2", 300)],
            {"a1": 700, "a2": 500},
        ),
        (
            [
                grant("a1", units=1000),
                grant("a2", units=200),
                transfer("a1", "a2", 300),
                transfer("a2", "a1", 300),
            ],
            {"a1": 1000, "a2": 200},
        ),
        (
            [grant("a1", units=1000), grant("b1", "other", 100), transfer("a1", "b1", 50)],
            {"a1": 950, "b1": 150},
        ),
        (
            [
                grant("a1", units=1000),
                grant("a2", units=0),
                transfer("a1", "a2", 400),
                adjust("a2", -100),
                adjust("a1", 7),
            ],
            {"a1": 607, "a2": 300},
        ),
    ],
    ids=[
        "a grant allocates exactly its amount",
        "an adjustment adds its delta",
        "a negative adjustment takes units away",
        "adjustments add up",
        "an allocation can be adjusted down to exactly zero",
        "a transfer moves units from one allocation to the other",
        "a transfer back restores both sides",
        "a transfer may move units to another project's allocation",
        "grants, transfers and adjustments combine exactly",
    ],
)
def test_grants_adjustments_and_transfers_move_allocated_amounts_exactly(
    events: list[AdminEvent], expected: dict[str, int]
) -> None:
    assert allocated(world(*events)) == expected


def test_an_allocation_keeps_its_grant_adjustments_and_transfers_apart() -> None:
    state = world(
        grant("a1", units=1000),
        grant("a2", units=10),
        adjust("a1", 30),
        transfer("a1", "a2", 200),
        transfer("a2", "a1", 5),
    )
    a1 = state.allocations["a1"]

    assert (a1.granted_units, a1.adjusted_units, a1.transferred_in_units, a1.transferred_out_units) == (
        1000,
        30,
        5,
        200,
    )
    assert len(a1.event_ids) == 4


@PROPERTY
@given(
    grants=st.lists(st.integers(min_value=0, max_value=10**12), min_size=3, max_size=3),
    moves=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2),
            st.integers(min_value=0, max_value=2),
            st.integers(min_value=1, max_value=10**12),
        ).filter(lambda m: m[0] != m[1]),
        max_size=20,
    ),
)
def test_transfers_conserve_the_sum_of_allocated_units(
    grants: list[int], moves: list[tuple[int, int, int]]
) -> None:
    ids = ["x0", "x1", "x2"]
    events: list[AdminEvent] = [grant(i, units=g) for i, g in zip(ids, grants, strict=True)]
    events += [
        transfer(ids[src], ids[dst], units, transfer_id=f"t{n}") for n, (src, dst, units) in enumerate(moves)
    ]

    state = world(*events)

    assert sum(allocated(state).values()) == sum(grants)
    for n, key in enumerate(ids):
        moved_in = sum(u for src, dst, u in moves if dst == n)
        moved_out = sum(u for src, dst, u in moves if src == n)
        assert state.allocations[key].allocated_units == grants[n] + moved_in - moved_out


# -- the fold: expiry ---------------------------------------------------------------------------


def test_expiry_without_rollover_forfeits_the_unused_units() -> None:
    state = world(grant("a1", units=1000), expire("a1", 300))
    a1 = state.allocations["a1"]

    assert a1.expired is True
    assert a1.forfeited_units == 300
    assert a1.rolled_over_to is None
    assert a1.allocated_units == 1000  # what was allocated stays on record
    assert set(state.allocations) == {"a1"}


@pytest.mark.parametrize(
    ("start", "end", "successor_start", "successor_end", "successor_label"),
    [
        (T0, T0 + 30 * DAY, T0 + 30 * DAY, T0 + 60 * DAY, "2027-01-31..2027-03-02"),
        (T0 + 14 * DAY, Q1[1], Q1[1], Q1[1] + 76 * DAY, "2027-04-01..2027-06-16"),
        (T0, T0 + HOUR, T0 + HOUR, T0 + 2 * HOUR, "2027-01-01..2027-01-01"),
        (*Q1, utc(2027, 4, 1), utc(2027, 7, 1), "2027-Q2"),
        (utc(2027, 4, 1), utc(2027, 7, 1), utc(2027, 7, 1), utc(2027, 10, 1), "2027-Q3"),
        (utc(2027, 10, 1), utc(2028, 1, 1), utc(2028, 1, 1), utc(2028, 4, 1), "2028-Q1"),
    ],
    ids=[
        "a 30-day period rolls into the next 30 days",
        "the second half of a quarter is no quarter: it rolls into the next 76 days",
        "an hour rolls into the next hour",
        "a 90-day first quarter rolls into the 91-day second quarter",
        "the second quarter rolls into the third",
        "the fourth quarter rolls into the first quarter of the next year",
    ],
)
def test_expiry_with_rollover_moves_the_unused_units_into_the_next_period(
    start: int, end: int, successor_start: int, successor_end: int, successor_label: str
) -> None:
    state = world(
        grant(
            "a1", units=1000, start=start, end=end, period="p", cluster="c1", gpu_type="H100", rollover=True
        ),
        expire("a1", 300, rollover_to="a1+rollover", at=end),
    )
    a1, successor = state.allocations["a1"], state.allocations["a1+rollover"]

    assert (a1.expired, a1.forfeited_units, a1.rolled_over_to) == (True, 0, "a1+rollover")
    assert (successor.start, successor.end) == (successor_start, successor_end)
    assert successor.period == successor_label
    assert (successor.project, successor.cluster, successor.gpu_type) == ("proj", "c1", "H100")
    assert successor.rollover is True
    assert successor.granted_units == successor.allocated_units == 300
    assert successor.expired is False


def test_a_rolled_over_allocation_can_be_used_and_rolls_over_again() -> None:
    state = world(
        grant("a1", units=1000, rollover=True),
        expire("a1", 300, rollover_to="a1+r"),
        adjust("a1+r", 20, at=Q1[1] + DAY),
    )
    successor = state.allocations["a1+r"]
    assert successor.allocated_units == 320

    again = expire("a1+r", 320, rollover_to="a1+r+r", at=successor.end)
    state.check(again, now=successor.end)
    state.apply(again)

    assert state.allocations["a1+r"].expired is True
    assert state.allocations["a1+r+r"].granted_units == 320
    assert state.allocations["a1+r+r"].start == successor.end


# -- the fold: reading the past -----------------------------------------------------------------

# The log order is not the clock order: the adjustment occurred after the second grant, but was
# logged before it.
AS_OF_LOG: list[AdminEvent] = [
    *organisation(),
    grant("a1", units=1000, at=T0 - 10 * DAY),
    adjust("a1", 500, at=T0 + 5 * DAY),
    grant("a2", units=200, at=T0 + DAY),
    transfer("a1", "a2", 100, at=T0 + 20 * DAY),
    agreement("g1", 4, at=T0 + 2 * DAY),
    revoke("g1", at=T0 + 3 * DAY),
]


@pytest.mark.parametrize(
    ("at", "expected", "active_agreements"),
    [
        (T0 - 10 * DAY - 1, {}, []),
        (T0 - 10 * DAY, {"a1": 1000}, []),
        (T0 + DAY, {"a1": 1000, "a2": 200}, []),
        (T0 + 2 * DAY, {"a1": 1000, "a2": 200}, ["g1"]),
        (T0 + 3 * DAY, {"a1": 1000, "a2": 200}, []),
        (T0 + 5 * DAY - 1, {"a1": 1000, "a2": 200}, []),
        (T0 + 5 * DAY, {"a1": 1500, "a2": 200}, []),
        (T0 + 20 * DAY, {"a1": 1400, "a2": 300}, []),
    ],
    ids=[
        "a second before the first grant there is nothing",
        "an event counts from the second it occurred (inclusive)",
        "a later grant logged after an adjustment counts from its own time",
        "an agreement is active once granted",
        "and inactive once revoked",
        "an adjustment does not count a second early",
        "the adjustment counts when it occurred, though logged before the second grant",
        "a transfer counts on both sides",
    ],
)
def test_as_of_is_the_fold_of_the_events_that_had_occurred_by_then(
    at: int, expected: dict[str, int], active_agreements: list[str]
) -> None:
    state = AdminState.of(AS_OF_LOG)

    past = state.as_of(at)

    assert past == AdminState.of(e for e in AS_OF_LOG if e.occurred_at <= at)
    assert allocated(past) == expected
    assert [a.agreement_id for a in past.active_agreements()] == active_agreements
    assert state == AdminState.of(AS_OF_LOG)  # reading the past leaves the present alone


def test_as_of_any_instant_equals_the_fold_of_events_up_to_it() -> None:
    state = AdminState.of(AS_OF_LOG)
    instants = sorted({e.occurred_at + d for e in AS_OF_LOG for d in (-1, 0, 1)})

    for at in instants:
        assert state.as_of(at) == AdminState.of(e for e in AS_OF_LOG if e.occurred_at <= at), at


# -- the fold: history and leads ----------------------------------------------------------------


def test_history_of_a_project_lists_every_event_that_touched_it_in_log_order() -> None:
    touching: dict[str, AdminEvent] = {
        "own node": node("proj", "nlp", leads=["alice"], at=BEFORE + 1),
        "policy": policy("p1"),
        "grant": grant("a1", units=1000),
        "adjustment": adjust("a1", 10),
        "transfer in": transfer("b1", "a1", 5),
        "transfer out": transfer("a1", "b2", 7),
        "agreement": agreement("g1", 2),
        "revocation": revoke("g1"),
        "expiry": expire("a1", 100, rollover_to="a1+r"),
        "successor's adjustment": adjust("a1+r", 1, at=Q1[1] + 1),
    }
    elsewhere: dict[str, AdminEvent] = {
        "ancestor node": node("nlp", "inst", kind="group", leads=["gina"], at=BEFORE + 1),
        "cluster": cluster("c3", "A100", 2),
        "other project's grant": grant("b1", "other", 50),
        "other project's second grant": grant("b2", "other", 50),
        "other project's adjustment": adjust("b1", 3),
        "transfer between others": transfer("b2", "b1", 1),
        "other project's agreement": agreement("h1", 2, project="other"),
        "other project's revocation": revoke("h1"),
    }
    log = [
        *organisation(),
        elsewhere["ancestor node"],
        touching["own node"],
        elsewhere["cluster"],
        touching["policy"],
        elsewhere["other project's grant"],
        elsewhere["other project's second grant"],
        touching["grant"],
        touching["adjustment"],
        elsewhere["other project's adjustment"],
        touching["transfer in"],
        touching["transfer out"],
        elsewhere["transfer between others"],
        elsewhere["other project's agreement"],
        touching["agreement"],
        elsewhere["other project's revocation"],
        touching["revocation"],
        touching["expiry"],
        touching["successor's adjustment"],
    ]
    state = AdminState.of(log)

    history = state.history_of("proj")

    own_declaration = next(e for e in organisation() if getattr(e, "node_id", None) == "proj")
    assert history == [own_declaration, *touching.values()]
    assert not any(e in history for e in elsewhere.values())


def test_history_of_an_unknown_project_holds_only_price_changes() -> None:
    state = world(grant("a1"), policy("p1"))
    assert state.history_of("nobody") == [policy("p1")]


@pytest.mark.parametrize(
    ("project", "extra", "expected"),
    [
        ("proj", [], {"alice", "gina", "dana"}),
        ("nlp", [], {"gina", "dana"}),
        ("other", [], {"bob", "dana"}),
        ("solo", [], {"sam"}),
        ("nobody", [], set()),
        ("proj", [node("proj", "inst", leads=["alice"], at=BEFORE + 1)], {"alice", "dana"}),
        ("proj", [node("nlp", "inst", kind="group", leads=[], at=BEFORE + 1)], {"alice", "dana"}),
    ],
    ids=[
        "a project's leads include the leads of its group and organisation",
        "a group's leads include its organisation's",
        "a project directly under the organisation has its own and the organisation's leads",
        "a project under the root has only its own leads",
        "an unknown project has no leads",
        "after a move the leads follow the new place in the tree",
        "a group that drops its leads no longer contributes them",
    ],
)
def test_leads_of_a_node_include_the_leads_of_its_ancestors(
    project: str, extra: list[AdminEvent], expected: set[str]
) -> None:
    assert world(*extra).leads_of(project) == expected


# -- the rules: rejections ----------------------------------------------------------------------


def rejected(
    state: AdminState,
    event: AdminEvent,
    error: type[AdminRejected],
    code: str,
    *,
    now: int = NOW,
    charged: Callable[[Allocation], int] = lambda _: 0,
    charge_horizon: int | None = None,
) -> AdminRejected:
    """Check `event`, expect exactly `error` with `code`, and make sure the state did not change."""
    before = state.copy()
    with pytest.raises(AdminRejected) as caught:
        state.check(event, now=now, charged=charged, charge_horizon=charge_horizon)
    assert type(caught.value) is error
    assert caught.value.code == code
    assert str(caught.value)  # a message for people
    assert state == before
    return caught.value


@pytest.mark.parametrize(
    ("history", "event", "error", "code"),
    [
        ([], node("team", "proj", kind="group"), InvalidChange, "invalid"),
        ([], node("team", "proj"), InvalidChange, "invalid"),
        ([], node("team", "nowhere"), InvalidChange, "invalid"),
        ([], node("inst", "nlp", kind="organisation", at=BEFORE + 1), InvalidChange, "invalid"),
        ([], node("nlp", "nlp", kind="group", at=BEFORE + 1), InvalidChange, "invalid"),
        ([node("deep", "nlp", kind="group")], node("inst", "deep", kind="group"), InvalidChange, "invalid"),
        ([], node("loose", kind="group", shares="parent"), InvalidChange, "invalid"),
        ([], node("root", kind="group"), InvalidChange, "invalid"),
        ([], node("nlp", "inst", kind="project", at=BEFORE + 1), InvalidChange, "invalid"),
        ([grant("a1")], node("proj", "nlp", kind="group", at=BEFORE + 1), InvalidChange, "invalid"),
        ([], node("inst", kind="project", at=BEFORE + 1), InvalidChange, "invalid"),
    ],
    ids=[
        "a group under a project is refused: projects are leaves",
        "a project under a project is refused",
        "a node under an undeclared parent is refused",
        "moving the organisation under its own group would make a cycle",
        "a node under itself would make a cycle",
        "a cycle through a deeper descendant is refused",
        "'parent' shares directly under the root are refused",
        "the implicit root cannot be declared",
        "a group with children cannot become a project",
        "a top-level organisation with children cannot become a project either",
        "a project holding allocations stays a project",
    ],
)
def test_the_tree_rules(
    history: list[AdminEvent], event: AdminEvent, error: type[AdminRejected], code: str
) -> None:
    rejected(world(*history), event, error, code)


@pytest.mark.parametrize(
    ("history", "event", "now", "error", "code"),
    [
        ([], grant("a1", "nobody"), NOW, UnknownReference, "unknown"),
        ([], grant("a1", "nlp"), NOW, UnknownReference, "unknown"),
        ([], grant("a1", cluster="c9"), NOW, UnknownReference, "unknown"),
        ([grant("a1")], grant("a1", units=5), NOW, Conflict, "conflict"),
        ([grant("a1")], grant("a1", "other", units=5, cluster="c1"), NOW, Conflict, "conflict"),
        ([], grant("a1", start=T0, end=T0 - 1), NOW, InvalidChange, "invalid"),
        ([], grant("a1", start=T0, end=T0), NOW, InvalidChange, "invalid"),
        ([], grant("a1", cluster="c1", gpu_type="B300"), NOW, InvalidChange, "invalid"),
        ([], adjust("a9", 5), NOW, UnknownReference, "unknown"),
        ([grant("a1")], adjust("a1", 5, reason=""), NOW, InvalidChange, "invalid"),
        ([grant("a1")], adjust("a1", 5, reason="   "), NOW, InvalidChange, "invalid"),
        ([grant("a1", units=1000)], adjust("a1", -1001), NOW, InsufficientBudget, "insufficient-budget"),
        (
            [grant("a1", units=1000), grant("a2", units=0), transfer("a1", "a2", 600)],
            adjust("a1", -401),
            NOW,
            InsufficientBudget,
            "insufficient-budget",
        ),
        ([grant("a1"), grant("a2")], transfer("a1", "a1", 5), NOW, InvalidChange, "invalid"),
        ([grant("a2")], transfer("a9", "a2", 5), NOW, UnknownReference, "unknown"),
        ([grant("a1")], transfer("a1", "a9", 5), NOW, UnknownReference, "unknown"),
        (
            [grant("a1", units=1000), grant("a2")],
            transfer("a1", "a2", 1001),
            NOW,
            InsufficientBudget,
            "insufficient-budget",
        ),
        ([], expire("a9", 0), Q1[1], UnknownReference, "unknown"),
        ([grant("a1")], expire("a1", 0), Q1[1] - 1, InvalidChange, "invalid"),
        ([grant("a1"), expire("a1", 0)], adjust("a1", 5), Q1[1], InvalidChange, "invalid"),
        (
            [grant("a1"), grant("a2"), expire("a1", 0)],
            transfer("a1", "a2", 5),
            Q1[1],
            InvalidChange,
            "invalid",
        ),
        (
            [grant("a1"), grant("a2"), expire("a2", 0)],
            transfer("a1", "a2", 5),
            Q1[1],
            InvalidChange,
            "invalid",
        ),
        ([grant("a1"), expire("a1", 0)], expire("a1", 0, at=Q1[1] + 1), Q1[1] + 1, InvalidChange, "invalid"),
        (
            [grant("a1"), grant("a2", end=Q1[1] + DAY)],
            expire("a1", 7, rollover_to="a2"),
            Q1[1],
            Conflict,
            "conflict",
        ),
        ([grant("a1")], expire("a1", 7, rollover_to="a1+next"), Q1[1], InvalidChange, "invalid"),
        ([grant("a1")], expire("a1", 10**15), Q1[1], InvalidChange, "invalid"),
    ],
    ids=[
        "a grant to an unknown project is refused",
        "a grant to a group is refused: only projects hold budgets",
        "a grant on an unknown cluster is refused",
        "a grant under an existing allocation id is refused",
        "a grant under an existing allocation id is refused even with another scope",
        "a period that ends before it starts is refused",
        "a period that ends when it starts is refused",
        "a grant for a GPU type the cluster does not have is refused",
        "an adjustment of an unknown allocation is refused",
        "an adjustment without a reason is refused",
        "an adjustment with a blank reason is refused",
        "an adjustment below zero is refused",
        "an adjustment below zero counting transfers out is refused",
        "a transfer to the same allocation is refused",
        "a transfer from an unknown allocation is refused",
        "a transfer to an unknown allocation is refused",
        "a transfer of more than is allocated is refused",
        "an expiry of an unknown allocation is refused",
        "an expiry a second before the period ends is refused",
        "an adjustment of an expired allocation is refused",
        "a transfer from an expired allocation is refused",
        "a transfer to an expired allocation is refused",
        "an allocation expires only once",
        "a rollover into an existing allocation id is refused rather than overwriting it",
        "a rollover of an allocation that does not roll over is refused",
        "more units unused than the allocation holds is refused",
    ],
)
def test_the_allocation_rules(
    history: list[AdminEvent], event: AdminEvent, now: int, error: type[AdminRejected], code: str
) -> None:
    rejected(world(*history), event, error, code, now=now)


@pytest.mark.parametrize(
    ("charged", "amount", "error"),
    [
        ({"a1": 700}, 301, InsufficientBudget),
        ({"a1": 700}, 300, None),
        ({"a1": 700, "a2": 10_000}, 300, None),
        ({"a1": 1200}, 1, InsufficientBudget),
        ({}, 1000, None),
    ],
    ids=[
        "more than allocated minus charged is refused",
        "exactly what is left may be moved",
        "charges on the receiving side do not matter",
        "an overspent allocation has nothing to give",
        "with nothing charged everything may be moved",
    ],
)
def test_a_transfer_may_move_only_what_the_ledger_has_not_charged(
    charged: dict[str, int], amount: int, error: type[AdminRejected] | None
) -> None:
    state = world(grant("a1", units=1000), grant("a2", units=0))
    seen: list[str] = []

    def charges(a: Allocation) -> int:
        seen.append(a.allocation_id)
        return charged.get(a.allocation_id, 0)

    event = transfer("a1", "a2", amount)
    if error is None:
        state.check(event, now=NOW, charged=charges)
    else:
        rejected(state, event, error, error.code, charged=charges)
    assert "a1" in seen


@pytest.mark.parametrize(
    ("history", "event", "error", "code"),
    [
        ([], agreement("g1", project="nobody"), UnknownReference, "unknown"),
        ([], agreement("g1", project="nlp"), UnknownReference, "unknown"),
        ([], agreement("g1", cluster="c9"), UnknownReference, "unknown"),
        ([], agreement("g1", 9), InvalidChange, "invalid"),
        ([], agreement("g1", 5, cluster="c2"), InvalidChange, "invalid"),
        ([], agreement("g1", 1, weekly([MON], 9, time_zone="Mars/Olympus_Mons")), InvalidChange, "invalid"),
        ([], agreement("g1", 1, fixed(T0 + DAY, T0)), InvalidChange, "invalid"),
        ([agreement("g1", 1)], agreement("g1", 1, fixed(T0 + 5 * DAY, T0 + 6 * DAY)), Conflict, "conflict"),
        ([agreement("g1", 1), revoke("g1")], agreement("g1", 1), Conflict, "conflict"),
        ([], revoke("g9"), UnknownReference, "unknown"),
        ([agreement("g1", 1), revoke("g1")], revoke("g1", at=BEFORE + 1), UnknownReference, "unknown"),
    ],
    ids=[
        "an agreement for an unknown project is refused",
        "an agreement for a group is refused",
        "an agreement on an unknown cluster is refused",
        "an agreement for more GPUs than the cluster has is refused",
        "an agreement for more GPUs than a smaller cluster has is refused",
        "a weekly window in an unknown time zone is refused",
        "a fixed window that ends before it starts is refused",
        "an agreement id cannot be granted twice",
        "a revoked agreement's id cannot be reused",
        "revoking an unknown agreement is refused",
        "an agreement is revoked only once",
    ],
)
def test_the_agreement_rules(
    history: list[AdminEvent], event: AdminEvent, error: type[AdminRejected], code: str
) -> None:
    rejected(world(*history), event, error, code)


# -- the rules: overbooking ---------------------------------------------------------------------

# On c1 (8 GPUs): g1 guarantees 4 GPUs on the first two days of Q1, g2 3 GPUs on days two and three.
BOOKED = [agreement("g1", 4, fixed(T0, T0 + 2 * DAY)), agreement("g2", 3, fixed(T0 + DAY, T0 + 3 * DAY))]


@pytest.mark.parametrize(
    ("candidate", "conflicting"),
    [
        (agreement("new", 2, fixed(T0 + DAY, T0 + DAY + HOUR)), ("g1", "g2")),
        (agreement("new", 1, fixed(T0 + DAY, T0 + DAY + HOUR)), None),
        (agreement("new", 5, fixed(T0 + 2 * DAY, T0 + 3 * DAY)), None),
        (agreement("new", 6, fixed(T0 + 2 * DAY, T0 + 3 * DAY)), ("g2",)),
        (agreement("new", 5, fixed(T0 - DAY, T0)), None),
        (agreement("new", 5, fixed(T0 - DAY, T0 + 1)), ("g1",)),
        (agreement("new", 8, fixed(T0 + 3 * DAY, T0 + 4 * DAY)), None),
        (agreement("new", 8, fixed(T0 - DAY, T0 + 4 * DAY)), ("g1",)),
    ],
    ids=[
        "a third guarantee on day two exceeds the cluster and names both others",
        "filling the last free GPU on day two is fine: an exactly full cluster is not overbooked",
        "exactly filling day three is fine",
        "one GPU too many on day three names only the agreement active then",
        "a window that ends when g1 starts only touches it",
        "a window that overlaps g1 by one second overbooks",
        "the whole cluster after the others have ended is fine",
        "a window over everything is judged at its first instant over capacity",
    ],
)
def test_an_agreement_may_not_overbook_its_cluster_with_fixed_windows(
    candidate: AdminEvent, conflicting: tuple[str, ...] | None
) -> None:
    state = world(*BOOKED)
    if conflicting is None:
        state.check(candidate, now=NOW)
        return
    refused = rejected(state, candidate, Overbooked, "overbooked")
    assert isinstance(refused, Overbooked)
    assert refused.conflicting == conflicting
    assert all(key in str(refused) for key in conflicting)


def test_agreements_on_another_cluster_do_not_count() -> None:
    state = world(*BOOKED, cluster("c3", "H100", 8))
    state.check(agreement("new", 8, fixed(T0, T0 + 3 * DAY), cluster="c3"), now=NOW)


# "nightly": Monday to Friday from 22:00 Berlin time for 8 hours, 6 of c1's 8 GPUs, all of 2027.
NIGHTLY = agreement(
    "nightly",
    6,
    weekly([MON, TUE, WED, THU, FRI], 22, valid_from=utc(2027, 1, 1), valid_until=utc(2028, 1, 1)),
)


@pytest.mark.parametrize(
    ("candidate", "overbooked"),
    [
        (agreement("new", 3, fixed(utc(2027, 1, 5, 21), utc(2027, 1, 5, 22))), True),
        (agreement("new", 3, fixed(utc(2027, 1, 5, 20), utc(2027, 1, 5, 21))), False),
        (agreement("new", 3, fixed(utc(2027, 7, 6, 20), utc(2027, 7, 6, 21))), True),
        (agreement("new", 3, fixed(utc(2027, 7, 6, 19), utc(2027, 7, 6, 20))), False),
        (agreement("new", 3, fixed(utc(2027, 1, 6, 4, 59), utc(2027, 1, 6, 6))), True),
        (agreement("new", 3, fixed(utc(2027, 1, 6, 5), utc(2027, 1, 6, 6))), False),
        (agreement("new", 3, fixed(utc(2027, 1, 10, 0), utc(2027, 1, 10, 23))), False),
        (agreement("new", 2, fixed(utc(2027, 1, 5, 21), utc(2027, 1, 5, 22))), False),
        (agreement("new", 3, weekly([MON], 9, hours=2, time_zone="America/New_York")), False),
        (agreement("new", 3, weekly([MON], 16, hours=2, time_zone="America/New_York")), True),
    ],
    ids=[
        "Tuesday 21:00 UTC in January is 22:00 in Berlin: the nightly window is open",
        "Tuesday 20:00 to 21:00 UTC in January ends as the window opens",
        "Tuesday 20:00 UTC in July is 22:00 in Berlin summer time: open",
        "Tuesday 19:00 to 20:00 UTC in July ends as it opens",
        "Wednesday 04:59 UTC in January is 05:59 in Berlin: still open",
        "Wednesday 05:00 UTC in January is 06:00 in Berlin: closed",
        "Sunday has no nightly window",
        "two more GPUs fill the cluster exactly",
        "Monday 09:00 in New York is 14:00 UTC: no overlap",
        "Monday 16:00 in New York is 21:00 UTC, 22:00 in Berlin: overlap",
    ],
)
def test_an_agreement_may_not_overbook_a_weekly_window_in_its_time_zone(
    candidate: AdminEvent, overbooked: bool
) -> None:
    state = world(NIGHTLY)
    if not overbooked:
        state.check(candidate, now=NOW)
        return
    refused = rejected(state, candidate, Overbooked, "overbooked")
    assert isinstance(refused, Overbooked)
    assert refused.conflicting == ("nightly",)


def test_a_weekly_candidate_longer_than_400_days_is_checked_to_its_end() -> None:
    late = agreement("late", 6, fixed(utc(2028, 6, 1), utc(2028, 6, 8)))  # beyond day 400 of the candidate
    candidate = agreement(
        "mondays",
        3,
        weekly([MON], 9, hours=4, time_zone="UTC", valid_from=utc(2027, 1, 1), valid_until=utc(2029, 1, 1)),
    )

    refused = rejected(world(late), candidate, Overbooked, "overbooked")

    assert isinstance(refused, Overbooked)
    assert refused.conflicting == ("late",)


@pytest.mark.parametrize(
    ("history", "candidate", "conflicting"),
    [
        ([agreement("g1", 8)], agreement("g3", 8), ("g1",)),
        ([agreement("g1", 8), revoke("g1")], agreement("g3", 8), None),
        ([agreement("g1", 4), agreement("g2", 4), revoke("g2")], agreement("g3", 4), None),
        ([agreement("g1", 4), agreement("g2", 4), revoke("g2")], agreement("g3", 5), ("g1",)),
    ],
    ids=[
        "a full cluster takes no more",
        "a revoked agreement frees all its GPUs",
        "revoking one of two frees its share",
        "the agreement that was not revoked still counts",
    ],
)
def test_a_revoked_agreement_frees_capacity(
    history: list[AdminEvent], candidate: AdminEvent, conflicting: tuple[str, ...] | None
) -> None:
    state = world(*history)
    if conflicting is None:
        state.check(candidate, now=NOW)
        return
    refused = rejected(state, candidate, Overbooked, "overbooked")
    assert isinstance(refused, Overbooked)
    assert refused.conflicting == conflicting


@pytest.mark.parametrize(
    ("history", "event", "conflicting"),
    [
        (BOOKED, cluster("c1", "H100", 7, at=BEFORE + 1), None),
        (BOOKED, cluster("c1", "H100", 6, at=BEFORE + 1), ("g1", "g2")),
        (BOOKED, cluster("c1", "H100", 3, at=BEFORE + 1), ("g1",)),
        (BOOKED, cluster("c1", "H100", 64, at=BEFORE + 1), None),
        ([*BOOKED, revoke("g2")], cluster("c1", "H100", 4, at=BEFORE + 1), None),
        ([*BOOKED, revoke("g2")], cluster("c1", "H100", 3, at=BEFORE + 1), ("g1",)),
        (BOOKED, cluster("c2", "B300", 1, at=BEFORE + 1), None),
        ([NIGHTLY], cluster("c1", "H100", 5, at=BEFORE + 1), ("nightly",)),
        ([NIGHTLY], cluster("c1", "H100", 6, at=BEFORE + 1), None),
    ],
    ids=[
        "shrinking to the peak of the guarantees is fine",
        "shrinking below the peak is refused, naming the agreements at the peak",
        "shrinking below one agreement alone names it",
        "growing is always fine",
        "revoked agreements do not hold the cluster up",
        "the remaining agreement still does",
        "another cluster's agreements do not matter",
        "a weekly guarantee holds the cluster up",
        "shrinking to a weekly guarantee exactly is fine",
    ],
)
def test_a_cluster_cannot_shrink_below_its_guarantees(
    history: list[AdminEvent], event: AdminEvent, conflicting: tuple[str, ...] | None
) -> None:
    state = world(*history)
    if conflicting is None:
        state.check(event, now=NOW)
        return
    refused = rejected(state, event, Overbooked, "overbooked")
    assert isinstance(refused, Overbooked)
    assert refused.conflicting == conflicting


# -- the rules: policies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "event", "charge_horizon", "error"),
    [
        ([], policy("p1", NOW - 1), None, RetroactivePolicy),
        ([], policy("p1", NOW - 30 * DAY), None, RetroactivePolicy),
        ([], policy("p1", NOW), None, None),
        ([], policy("p1", NOW + DAY), None, None),
        ([], policy("p1", NOW - DAY), NOW - DAY, None),
        ([], policy("p1", NOW - DAY), NOW - 2 * DAY, None),
        ([], policy("p1", NOW - DAY), NOW - DAY + 1, RetroactivePolicy),
        ([], policy("p1", NOW - DAY), NOW, RetroactivePolicy),
        ([], policy("p1", NOW + DAY), NOW, None),
        ([], policy("p1", NOW + 60), NOW + 3600, RetroactivePolicy),
        ([policy("p1", NOW + DAY)], policy("p1", NOW + DAY), None, Conflict),
        ([policy("p1", NOW + DAY)], policy("p1", NOW + 2 * DAY), None, Conflict),
        ([policy("p1", NOW + DAY)], policy("p2", NOW + DAY, weights={"H100": 120}), None, InvalidChange),
        ([policy("p1", NOW + DAY)], policy("p2", NOW + 2 * DAY), None, None),
    ],
    ids=[
        "a second in the past is refused when the ledger's progress is unknown",
        "a month in the past is refused when the ledger's progress is unknown",
        "taking effect now is fine",
        "taking effect later is fine",
        "in the past but exactly where the ledger has charged up to is fine",
        "in the past but after what the ledger has charged is fine",
        "a second before what the ledger has charged is refused",
        "a day before what the ledger has charged is refused",
        "in the future with a known ledger is fine",
        "in the future but before usage the ledger has already charged is refused",
        "a policy id cannot be declared twice, even unchanged",
        "a policy id cannot be reused for another time",
        "two policies cannot take effect at the same instant",
        "a second policy at another instant is fine",
    ],
)
def test_the_policy_rules(
    history: list[AdminEvent],
    event: AdminEvent,
    charge_horizon: int | None,
    error: type[AdminRejected] | None,
) -> None:
    state = world(*history)
    if error is None:
        state.check(event, now=NOW, charge_horizon=charge_horizon)
    else:
        rejected(state, event, error, error.code, charge_horizon=charge_horizon)


# -- the rules: acceptances ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "event", "now"),
    [
        ([], node("team", "nlp", kind="group", shares="parent"), NOW),
        ([], node("proj", "inst", leads=["alice", "ada"], at=BEFORE + 1), NOW),
        ([], node("solo", kind="group", at=BEFORE + 1), NOW),
        ([], grant("a1", cluster="c1", gpu_type="H100"), NOW),
        ([], grant("a1", cluster="c2"), NOW),
        ([], grant("a1", gpu_type="A100"), NOW),
        ([], grant("a1", units=0), NOW),
        ([grant("a1", units=1000)], adjust("a1", -1000), NOW),
        ([grant("a1")], expire("a1", 1000), Q1[1]),
        ([grant("a1"), grant("a2")], transfer("a1", "a2", 1000), NOW),
        ([agreement("g1", 8)], revoke("g1"), NOW),
        ([agreement("g1", 4, fixed(T0, T0 + DAY))], agreement("g2", 4, fixed(T0, T0 + DAY)), NOW),
    ],
    ids=[
        "a group may stand in its parent's place",
        "a project may move and change its leads",
        "a project without allocations may become a group",
        "a grant for the cluster's own GPU type is fine",
        "a grant for a cluster alone is fine",
        "a grant for a GPU type alone is fine",
        "a grant of nothing is fine",
        "an adjustment down to exactly zero is fine",
        "an expiry exactly at the period end is fine",
        "a transfer of everything is fine",
        "an active agreement may be revoked",
        "two agreements that exactly fill a cluster are fine",
    ],
)
def test_what_the_rules_accept(history: list[AdminEvent], event: AdminEvent, now: int) -> None:
    state = world(*history)
    state.check(event, now=now)
    assert state.apply(event) is True


def _disputed(job: str = "job-1", project: str = "vision") -> UsageDisputed:
    return UsageDisputed(
        event_id=f"dispute:{job}:raised", occurred_at=T0, actor="capacity-watch", job_id=job, project=project,
        cluster="h100", episode_start=T0 - 3600, episode_end=T0 - 600, peak_gpus=24, capacity_gpus=16,
    )  # fmt: skip


def _resolved(action: Literal["charge", "drop"], job: str = "job-1", n: int = 1) -> DisputeResolved:
    return DisputeResolved(
        event_id=f"resolve:{job}:{n}", occurred_at=T0 + n, actor="root", job_id=job, action=action
    )


def test_a_dispute_is_raised_once_resolved_once_and_in_its_projects_history() -> None:
    state = AdminState.of([node("org", kind="organisation"), node("vision", parent="org")])
    with pytest.raises(UnknownReference):
        state.check(_resolved("charge"), now=T0)
    state.check(_disputed(), now=T0)
    state.apply(_disputed())
    assert state.disputes["job-1"].stage == DISPUTED and state.disputes["job-1"].withheld
    with pytest.raises(Conflict):
        state.check(_disputed().model_copy(update={"event_id": "other"}), now=T0)
    state.apply(_resolved("drop"))
    assert state.disputes["job-1"].stage == DROPPED and state.disputes["job-1"].withheld
    with pytest.raises(Conflict, match=r"resolved \(drop\) by root"):
        state.check(_resolved("charge", n=2), now=T0)
    state.apply(_resolved("charge", n=2))  # a second decision on the log changes nothing
    assert state.disputes["job-1"].stage == DROPPED
    assert [e.type for e in state.history_of("vision")][-3:] == [
        "UsageDisputed",
        "DisputeResolved",
        "DisputeResolved",
    ]
    assert not [e for e in state.history_of("org") if e.type.startswith("Dispute")]
    charged = AdminState.of([_disputed(), _resolved("charge")]).disputes["job-1"]
    assert charged.stage == CHARGED and not charged.withheld
