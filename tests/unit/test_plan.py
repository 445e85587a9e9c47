"""The quarterly plan file: parsing with line-numbered errors, and the diff against the admin state."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest

from allmende.domain.admin_state import AdminRejected, AdminState
from allmende.domain.allocations import UNITS_PER_GPU_HOUR
from allmende.domain.plan import Change, PlanConflict, diff
from allmende.domain.plan_file import PlanInvalid, parse_plan
from allmende.schemas.admin_events import (
    AgreementGranted,
    AgreementRevoked,
    AllocationAdjusted,
    AllocationExtended,
    AllocationGranted,
    FixedWindowSpec,
    PolicyChanged,
    WeeklyWindowSpec,
)
from tests.unit.admin_builders import (
    DAY,
    Q1,
    T0,
    agreement,
    expire,
    fixed,
    grant,
    revoke,
    transfer,
    utc,
    world,
)

U = UNITS_PER_GPU_HOUR  # charge units in one GPU-hour at weight 1.00
NOW = T0 - 7 * DAY  # the plan for the quarter is applied a week before it starts
ADMIN = "dana"
SOURCE = "plan:institute-2027-q1"

# Children are listed before their parents on purpose: the diff must order them.
PLAN = """\
plan: institute-2027-q1
period: 2027-Q1
clusters:
  - {name: h100-a, gpu_type: H100, gpus: 64}
  - {name: b300-a, gpu_type: B300, gpus: 16}
organisation:
  - {id: olmo-ft, parent: nlp, kind: project, shares: 10, leads: [alice]}
  - {id: nlp, parent: institute, kind: group, shares: parent, leads: [gina]}
  - {id: vision, parent: institute, kind: project, shares: 40, leads: [bob]}
  - {id: institute, kind: organisation, shares: 100, leads: [dana]}
policy:
  id: prices-2027-q1
  gpu_type_weights: {H100: 1.00, B300: 2.5}
  default_gpu_type_weight: 0.75
  priority_multipliers: {preemptible: 0.50, standard: 1, non-preemptible: 2.00}
  interactive_rate: 1.25
allocations:
  - {project: olmo-ft, gpu_hours: 1000}
  - {project: olmo-ft, gpu_hours: 250.5, cluster: b300-a, gpu_type: B300, rollover: true}
  - {id: vision-main, project: vision, gpu_hours: 0.1}
agreements:
  - id: olmo-nightly
    project: olmo-ft
    cluster: h100-a
    gpus: 32
    weekly: {days: [mon, Tuesday, 2, thu, fri], start: "22:00", hours: 8.5, time_zone: Europe/Berlin}
  - id: vision-deadline
    project: vision
    cluster: h100-a
    gpus: 16
    fixed: {start: 2027-02-01T00:00:00Z, end: 2027-02-08}
"""

VISION_MAIN = "  - {id: vision-main, project: vision, gpu_hours: 0.1}\n"
VISION_DEADLINE = """\
  - id: vision-deadline
    project: vision
    cluster: h100-a
    gpus: 16
    fixed: {start: 2027-02-01T00:00:00Z, end: 2027-02-08}
"""


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def apply_all(state: AdminState, changes: list[Change], *, now: int = NOW) -> AdminState:
    """Apply the changes as the service does: each one checked against the state the others left."""
    for change in changes:
        state.check(change.event, now=now)
        assert state.apply(change.event) is True
    return state


def applied(*texts: str, state: AdminState | None = None) -> AdminState:
    """The state after applying each plan in turn."""
    state = state if state is not None else AdminState()
    for text in texts:
        apply_all(state, diff(parse_plan(text), state, actor=ADMIN, now=NOW))
    return state


def summary(changes: list[Change]) -> list[tuple[str, str]]:
    return [(c.action, c.target) for c in changes]


# -- parsing a valid plan -----------------------------------------------------------------------


def test_a_full_plan_parses_with_every_section() -> None:
    plan = parse_plan(PLAN)

    assert plan.plan == "institute-2027-q1"
    assert plan.bounds() == Q1
    assert plan.period_label() == "2027-Q1"
    assert [(c.name, c.gpu_type, c.gpus) for c in plan.clusters] == [
        ("h100-a", "H100", 64),
        ("b300-a", "B300", 16),
    ]
    assert [(n.id, n.parent, n.kind, n.shares, n.leads) for n in plan.organisation] == [
        ("olmo-ft", "nlp", "project", 10, ["alice"]),
        ("nlp", "institute", "group", "parent", ["gina"]),
        ("vision", "institute", "project", 40, ["bob"]),
        ("institute", None, "organisation", 100, ["dana"]),
    ]
    assert [a.allocation_id(plan.period_label()) for a in plan.allocations] == [
        "olmo-ft/2027-Q1",
        "olmo-ft/2027-Q1/b300-a/B300",
        "vision-main",
    ]
    assert [a.amount_units for a in plan.allocations] == [1000 * U, 901_800_000_000, 360_000_000]
    assert [a.rollover for a in plan.allocations] == [False, True, False]
    assert plan.policy is not None
    assert plan.policy.hundredths() == {
        "gpu_type_weights": {"H100": 100, "B300": 250},
        "default_gpu_type_weight": 75,
        "priority_multipliers": {"preemptible": 50, "standard": 100, "non-preemptible": 200},
        "interactive_rate": 125,
    }
    nightly, deadline = plan.agreements
    assert nightly.weekly is not None and nightly.fixed is None
    assert nightly.weekly.weekdays() == (0, 1, 2, 3, 4)
    assert nightly.weekly.hours == Decimal("8.5")
    assert deadline.fixed is not None and deadline.weekly is None


def test_a_period_may_be_given_as_dates() -> None:
    plan = parse_plan("plan: p\nperiod: {start: 2027-01-15, end: 2027-02-15T00:00:00+00:00}\n")

    assert plan.bounds() == (utc(2027, 1, 15), utc(2027, 2, 15))
    assert plan.period_label() == "2027-01-15..2027-02-15"


def test_a_period_given_as_the_dates_of_a_quarter_is_labelled_as_the_quarter() -> None:
    plan = parse_plan("plan: p\nperiod: {start: 2027-04-01, end: 2027-07-01}\n")
    assert plan.period_label() == "2027-Q2"


@pytest.mark.parametrize(
    ("gpu_hours", "units"),
    [
        ("1000", 1000 * 3_600_000_000),
        ("250.5", 901_800_000_000),
        ("0.1", 360_000_000),
        ("1.23", 4_428_000_000),
        ("12500.5", 45_001_800_000_000),
        ("0", 0),
        ("'0.0000005'", 1800),
        ("1000000000", 10**9 * 3_600_000_000),
    ],
    ids=[
        "a thousand GPU-hours",
        "a half GPU-hour is exact",
        "a tenth of a GPU-hour is exact, not a binary fraction",
        "hundredths are exact",
        "a large amount with a half is exact",
        "nothing is nothing",
        "a quoted decimal down to whole charge units",
        "the largest amount a plan may hold",
    ],
)
def test_gpu_hours_become_charge_units_exactly(gpu_hours: str, units: int) -> None:
    plan = parse_plan(f"plan: p\nperiod: 2027-Q1\nallocations:\n  - {{project: a, gpu_hours: {gpu_hours}}}\n")
    assert plan.allocations[0].amount_units == units
    assert isinstance(plan.allocations[0].amount_units, int)


@pytest.mark.parametrize(
    ("rate", "hundredths"),
    [
        ("1", 100),
        ("1.00", 100),
        ("1.25", 125),
        ("2.5", 250),
        ("0.07", 7),
        ("0.1", 10),
        ("0", 0),
        ("100", 10_000),
    ],
    ids=[
        "one is a hundred hundredths",
        "trailing zeros change nothing",
        "a quarter more",
        "two and a half",
        "seven hundredths",
        "a tenth is exact, not a binary fraction",
        "free",
        "the highest factor",
    ],
)
def test_rates_become_hundredths_exactly(rate: str, hundredths: int) -> None:
    plan = parse_plan(
        "plan: p\nperiod: 2027-Q1\npolicy:\n  id: x\n"
        f"  gpu_type_weights: {{H100: {rate}}}\n"
        f"  priority_multipliers: {{preemptible: {rate}, standard: 1, non-preemptible: 2}}\n"
        f"  interactive_rate: {rate}\n"
    )
    assert plan.policy is not None
    rates = plan.policy.hundredths()
    assert rates["gpu_type_weights"] == {"H100": hundredths}
    assert rates["priority_multipliers"]["preemptible"] == hundredths
    assert rates["interactive_rate"] == hundredths


# -- parsing a bad plan -------------------------------------------------------------------------

AGREEMENT_HEAD = (
    "plan: p\nperiod: 2027-Q1\nagreements:\n  - id: g\n    project: a\n    cluster: c\n    gpus: 1\n"
)


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (
            "plan: p\nperiod: 2027-Q1\nclusters:\n  - name: c\n    gpu_type: H100\n    gpus: many\n",
            6,
            "clusters.0.gpus",
            "valid integer",
        ),
        (
            "plan: p\nperiod: 2027-Q1\nclusters:\n  - name: c\n    gpus: 4\n",
            4,
            "clusters.0.gpu_type",
            "Field required",
        ),
        ("period: 2027-Q1\n", 1, "plan", "Field required"),
        (
            "plan: p\nperiod: 2027-Q1\npolicy:\n  id: x\n"
            "  priority_multipliers: {preemptible: 0.5, standard: 1, non-preemptible: 2}\n"
            "  gpu_type_weights:\n    H100: 1.00\n    B300: 2.505\n",
            8,
            "policy.gpu_type_weights.B300",
            "finer than 1/100",
        ),
        (
            "plan: p\nperiod: 2027-Q1\npolicy:\n  id: x\n"
            "  priority_multipliers: {standard: 1, non-preemptible: 2}\n",
            5,
            "policy.priority_multipliers",
            "missing ['preemptible']",
        ),
        (
            AGREEMENT_HEAD + "    weekly:\n      days: [mon, fun]\n      start: '22:00'\n      hours: 8\n"
            "      time_zone: UTC\n",
            9,
            "agreements.0.weekly.days",
            "unknown day 'fun'",
        ),
        (
            AGREEMENT_HEAD + "    weekly:\n      days: [mon]\n      start: '24:00'\n      hours: 8\n"
            "      time_zone: UTC\n",
            10,
            "agreements.0.weekly.start",
            "pattern",
        ),
        (
            AGREEMENT_HEAD + "    fixed: {start: 2027-01-01T00:00:00Z, end: 2027-01-02T00:00:00Z}\n"
            "    weekly: {days: [mon], start: '22:00', hours: 8, time_zone: UTC}\n",
            4,
            "agreements.0",
            "exactly one window",
        ),
        (AGREEMENT_HEAD, 4, "agreements.0", "exactly one window"),
        (
            "plan: p\nperiod:\n  start: 2027-01-01T00:00:00\n  end: 2027-04-01T00:00:00Z\n",
            3,
            "period.start",
            "no time zone",
        ),
        (
            AGREEMENT_HEAD
            + "    fixed:\n      start: 2027-01-01T00:00:00\n      end: 2027-01-02T00:00:00Z\n",
            9,
            "agreements.0.fixed.start",
            "no time zone",
        ),
        (
            "plan: p\nperiod: 2027-Q1\npolicy:\n  id: x\n  effective_from: 2027-01-01T00:00:00\n"
            "  priority_multipliers: {preemptible: 0.5, standard: 1, non-preemptible: 2}\n",
            5,
            "policy.effective_from",
            "no time zone",
        ),
        ("plan: p\nperiod: {start: 2027-02-01, end: 2027-01-01}\n", 2, "period", "ends before it starts"),
        ("plan: p\nperiod: 2027-Q5\n", 2, "period", "not a quarter"),
        (
            "plan: p\nperiod: 2027-Q1\nallocations:\n  - {project: a, gpu_hours: 0.0000000001}\n",
            4,
            "allocations.0.gpu_hours",
            "finer than",
        ),
        (
            "plan: p\nperiod: 2027-Q1\nallocations:\n  - {project: a, gpu_hours: -1}\n",
            4,
            "allocations.0.gpu_hours",
            "greater than or equal to 0",
        ),
        (
            "plan: p\nperiod: 2027-Q1\nallocations:\n  - project: a\n    gpu_hours: 5\n    hours: 5\n",
            6,
            "allocations.0.hours",
            "Extra inputs are not permitted",
        ),
        ("plan: p\nperiod: [2027\nclusters: x\n", 3, "<file>", "expected ','"),
        ("- plan: p\n- period: 2027-Q1\n", 1, "<file>", "a plan is a mapping"),
        ("just some words\n", 1, "<file>", "a plan is a mapping"),
        ("", 1, "<file>", "a plan is a mapping"),
    ],
    ids=[
        "a word where a number belongs names the line of the value",
        "a missing field names the line of the mapping that lacks it",
        "a plan without a name names the first line",
        "a rate with three decimals is refused, not rounded",
        "a policy without a multiplier for every class is refused",
        "an unknown day name is refused",
        "a start time past 23:59 is refused",
        "an agreement with both windows is refused",
        "an agreement with neither window is refused",
        "a period start without a time zone is refused",
        "an agreement window start without a time zone is refused",
        "a policy start without a time zone is refused",
        "a period that ends before it starts is refused",
        "a fifth quarter is refused",
        "gpu_hours finer than a charge unit are refused, not rounded",
        "negative gpu_hours are refused",
        "an unknown field is refused, not ignored",
        "unparseable YAML names the line of the problem",
        "a list is not a plan",
        "a bare word is not a plan",
        "an empty file is not a plan",
    ],
)
def test_a_bad_plan_names_the_line_and_field_of_each_problem(
    text: str, line: int, field: str, message: str
) -> None:
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(text)

    problems = caught.value.problems
    found = [msg for at, name, msg in problems if (at, name) == (line, field)]
    assert found, problems
    assert any(message in msg for msg in found), problems
    assert f"line {line}: {field}: " in str(caught.value)


def test_every_problem_of_a_plan_is_reported_at_once() -> None:
    text = (
        "plan: p\nperiod: 2027-Q1\nclusters:\n  - {name: c, gpu_type: H100, gpus: 0}\n"
        "allocations:\n  - {project: a, gpu_hours: lots}\n"
    )
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(text)

    assert [(line, field) for line, field, _ in caught.value.problems] == [
        (4, "clusters.0.gpus"),
        (6, "allocations.0.gpu_hours"),
    ]


# -- diff on an empty state ---------------------------------------------------------------------


def test_a_plan_on_an_empty_state_declares_and_grants_everything_parents_first() -> None:
    changes = diff(parse_plan(PLAN), AdminState(), actor=ADMIN, now=NOW)

    assert summary(changes) == [
        ("declare", "cluster h100-a"),
        ("declare", "cluster b300-a"),
        ("declare", "organisation institute"),
        ("declare", "group nlp"),
        ("declare", "project vision"),
        ("declare", "project olmo-ft"),
        ("declare", "policy prices-2027-q1"),
        ("grant", "allocation olmo-ft/2027-Q1"),
        ("grant", "allocation olmo-ft/2027-Q1/b300-a/B300"),
        ("grant", "allocation vision-main"),
        ("grant", "agreement olmo-nightly"),
        ("grant", "agreement vision-deadline"),
    ]
    assert [c.event.event_id for c in changes] == [f"{SOURCE}:0:{n}" for n in range(len(changes))]
    assert {(c.event.source, c.event.actor, c.event.occurred_at) for c in changes} == {(SOURCE, ADMIN, NOW)}


def test_the_changes_of_a_plan_on_an_empty_state_pass_the_rules_in_their_order() -> None:
    state = apply_all(AdminState(), diff(parse_plan(PLAN), AdminState(), actor=ADMIN, now=NOW))

    assert state.projects() == ["olmo-ft", "vision"]
    assert state.leads_of("olmo-ft") == {"alice", "gina", "dana"}
    assert {a.allocation_id: a.allocated_units for a in state.allocations.values()} == {
        "olmo-ft/2027-Q1": 1000 * U,
        "olmo-ft/2027-Q1/b300-a/B300": 901_800_000_000,
        "vision-main": 360_000_000,
    }
    assert [a.agreement_id for a in state.active_agreements()] == ["olmo-nightly", "vision-deadline"]


def test_the_events_carry_the_plans_amounts_rates_and_windows_exactly() -> None:
    events = {c.target: c.event for c in diff(parse_plan(PLAN), AdminState(), actor=ADMIN, now=NOW)}
    envelope = {
        "occurred_at": NOW,
        "actor": ADMIN,
        "source": SOURCE,
        "reason": "plan institute-2027-q1 for 2027-Q1",
    }

    assert events["policy prices-2027-q1"] == PolicyChanged(
        event_id=f"{SOURCE}:0:6", **envelope, policy_id="prices-2027-q1", effective_from=T0,
        gpu_type_weights={"H100": 100, "B300": 250}, default_gpu_type_weight=75,
        priority_multipliers={"preemptible": 50, "standard": 100, "non-preemptible": 200},
        interactive_rate=125,
    )  # fmt: skip
    assert events["allocation olmo-ft/2027-Q1/b300-a/B300"] == AllocationGranted(
        event_id=f"{SOURCE}:0:8", **envelope, allocation_id="olmo-ft/2027-Q1/b300-a/B300", project="olmo-ft",
        period="2027-Q1", period_start=Q1[0], period_end=Q1[1], amount_units=901_800_000_000,
        cluster="b300-a", gpu_type="B300", rollover=True,
    )  # fmt: skip
    nightly = events["agreement olmo-nightly"]
    assert isinstance(nightly, AgreementGranted)
    assert (nightly.project, nightly.cluster, nightly.gpus) == ("olmo-ft", "h100-a", 32)
    assert nightly.window == WeeklyWindowSpec(
        weekdays=(0, 1, 2, 3, 4), hour=22, minute=0, duration_s=8 * 3600 + 1800, time_zone="Europe/Berlin",
        valid_from=Q1[0], valid_until=Q1[1],
    )  # fmt: skip
    deadline = events["agreement vision-deadline"]
    assert isinstance(deadline, AgreementGranted)
    assert deadline.window == FixedWindowSpec(start=utc(2027, 2, 1), end=utc(2027, 2, 8))


ORGANISATION = [
    "  - {id: institute, kind: organisation, leads: [dana]}\n",
    "  - {id: nlp, parent: institute, kind: group, shares: parent}\n",
    "  - {id: speech, parent: nlp, kind: group}\n",
    "  - {id: asr, parent: speech, kind: project}\n",
    "  - {id: vision, parent: institute, kind: project}\n",
]


@pytest.mark.parametrize(
    "order",
    list(itertools.permutations(range(len(ORGANISATION)))),
    ids=lambda order: "file order " + "".join(str(i) for i in order),
)
def test_parents_are_declared_before_children_whatever_the_file_order(order: tuple[int, ...]) -> None:
    text = "plan: org\nperiod: 2027-Q1\norganisation:\n" + "".join(ORGANISATION[i] for i in order)

    changes = diff(parse_plan(text), AdminState(), actor=ADMIN, now=NOW)
    state = apply_all(AdminState(), changes)

    declared = [c.target.split()[-1] for c in changes]
    for child, parent in [
        ("nlp", "institute"),
        ("speech", "nlp"),
        ("asr", "speech"),
        ("vision", "institute"),
    ]:
        assert declared.index(parent) < declared.index(child)
    assert state.leads_of("asr") == {"dana"}


def test_a_plan_may_add_a_child_under_a_node_it_does_not_list() -> None:
    state = applied(PLAN)
    text = "plan: more\nperiod: 2027-Q1\norganisation:\n  - {id: olmo-rl, parent: nlp, kind: project}\n"

    changes = diff(parse_plan(text), state, actor=ADMIN, now=NOW)
    apply_all(state, changes)

    assert summary(changes) == [("declare", "project olmo-rl")]
    assert state.leads_of("olmo-rl") == {"gina", "dana"}


# -- diff on a state the plan made --------------------------------------------------------------


def test_a_plan_applied_then_diffed_again_changes_nothing() -> None:
    state = applied(PLAN)
    assert diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW + DAY) == []


@pytest.mark.parametrize(
    ("old", "new", "target", "delta"),
    [
        ("gpu_hours: 1000}", "gpu_hours: 1200.25}", "allocation olmo-ft/2027-Q1", 720_900_000_000),
        ("gpu_hours: 1000}", "gpu_hours: 999.9}", "allocation olmo-ft/2027-Q1", -360_000_000),
        ("gpu_hours: 0.1}", "gpu_hours: 0}", "allocation vision-main", -360_000_000),
        ("gpu_hours: 250.5,", "gpu_hours: 250.25,", "allocation olmo-ft/2027-Q1/b300-a/B300", -900_000_000),
    ],
    ids=[
        "raising an amount adjusts by exactly the difference",
        "lowering an amount adjusts by exactly the difference",
        "setting an amount to zero adjusts it down to zero",
        "a scoped allocation is adjusted in place",
    ],
)
def test_changing_an_amount_gives_one_adjustment_of_the_exact_difference(
    old: str, new: str, target: str, delta: int
) -> None:
    state = applied(PLAN)
    text = edited(PLAN, old, new)

    changes = diff(parse_plan(text), state, actor=ADMIN, now=NOW)

    assert summary(changes) == [("adjust", target)]
    event = changes[0].event
    assert isinstance(event, AllocationAdjusted)
    assert event.delta_units == delta
    assert event.reason  # the rules require one
    apply_all(state, changes)
    assert diff(parse_plan(text), state, actor=ADMIN, now=NOW) == []


def test_removing_an_allocation_the_plan_created_revokes_it() -> None:
    state = applied(PLAN)
    text = edited(PLAN, VISION_MAIN, "")

    changes = diff(parse_plan(text), state, actor=ADMIN, now=NOW)

    assert summary(changes) == [("revoke", "allocation vision-main")]
    event = changes[0].event
    assert isinstance(event, AllocationAdjusted)
    assert (event.allocation_id, event.delta_units) == ("vision-main", -360_000_000)
    apply_all(state, changes)
    assert state.allocations["vision-main"].allocated_units == 0
    assert diff(parse_plan(text), state, actor=ADMIN, now=NOW) == []


def test_removing_an_agreement_the_plan_created_revokes_it() -> None:
    state = applied(PLAN)
    text = edited(PLAN, VISION_DEADLINE, "")

    changes = diff(parse_plan(text), state, actor=ADMIN, now=NOW)

    assert summary(changes) == [("revoke", "agreement vision-deadline")]
    assert isinstance(changes[0].event, AgreementRevoked)
    apply_all(state, changes)
    assert [a.agreement_id for a in state.active_agreements()] == ["olmo-nightly"]
    assert diff(parse_plan(text), state, actor=ADMIN, now=NOW) == []


OTHER_PLAN = """\
plan: other-plan
period: 2027-Q1
allocations:
  - {id: extra, project: vision, gpu_hours: 5}
agreements:
  - {id: extra-push, project: vision, cluster: h100-a, gpus: 8, fixed: {start: 2027-03-01, end: 2027-03-02}}
"""


def test_what_another_plan_or_the_api_created_is_left_alone() -> None:
    state = applied(PLAN, OTHER_PLAN)
    for event in (
        grant("by-api", "vision", 7 * U, at=NOW),
        agreement(
            "api-push", 4, fixed(utc(2027, 3, 5), utc(2027, 3, 6)), project="vision", cluster="h100-a", at=NOW
        ),
    ):
        state.check(event, now=NOW)
        state.apply(event)

    assert diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW) == []
    assert diff(parse_plan(OTHER_PLAN), state, actor=ADMIN, now=NOW) == []
    without = edited(edited(PLAN, VISION_MAIN, ""), VISION_DEADLINE, "")
    assert summary(diff(parse_plan(without), state, actor=ADMIN, now=NOW)) == [
        ("revoke", "allocation vision-main"),
        ("revoke", "agreement vision-deadline"),
    ]


def test_a_transfer_after_the_plan_does_not_make_the_plan_readjust() -> None:
    state = applied(PLAN)
    moved = transfer("olmo-ft/2027-Q1", "vision-main", 100 * U, at=NOW + 1)
    state.check(moved, now=NOW + 1)
    state.apply(moved)

    assert diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW + 2) == []

    raised = diff(
        parse_plan(edited(PLAN, "gpu_hours: 1000}", "gpu_hours: 1100}")), state, actor=ADMIN, now=NOW + 2
    )
    assert summary(raised) == [("adjust", "allocation olmo-ft/2027-Q1")]
    assert isinstance(raised[0].event, AllocationAdjusted)
    assert raised[0].event.delta_units == 100 * U
    apply_all(state, raised, now=NOW + 2)
    assert state.allocations["olmo-ft/2027-Q1"].allocated_units == 1000 * U
    assert state.allocations["vision-main"].allocated_units == 100 * U + 360_000_000


def test_the_diff_never_proposes_what_the_rules_refuse_after_a_transfer_out() -> None:
    """Removing an allocation that gave units away: either a conflict for a person, or accepted changes."""
    state = applied(PLAN)
    moved = transfer("vision-main", "olmo-ft/2027-Q1", 180_000_000, at=NOW + 1)
    state.check(moved, now=NOW + 1)
    state.apply(moved)

    try:
        changes = diff(parse_plan(edited(PLAN, VISION_MAIN, "")), state, actor=ADMIN, now=NOW + 2)
    except PlanConflict:
        return
    apply_all(state, changes, now=NOW + 2)


def test_an_expired_allocation_is_not_adjusted_or_revoked() -> None:
    state = applied(PLAN)
    state.apply(expire("vision-main", 360_000_000))

    assert (
        diff(parse_plan(edited(PLAN, "gpu_hours: 0.1}", "gpu_hours: 3}")), state, actor=ADMIN, now=Q1[1])
        == []
    )
    assert diff(parse_plan(edited(PLAN, VISION_MAIN, "")), state, actor=ADMIN, now=Q1[1]) == []


# -- conflicts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (VISION_MAIN, VISION_MAIN.replace("}", ", cluster: h100-a}"), "allocation vision-main exists"),
        (VISION_MAIN, VISION_MAIN.replace("}", ", gpu_type: H100}"), "allocation vision-main exists"),
        (
            VISION_MAIN,
            VISION_MAIN.replace("project: vision", "project: olmo-ft"),
            "allocation vision-main exists",
        ),
        ("rollover: true", "rollover: false", "allocation olmo-ft/2027-Q1/b300-a/B300 exists"),
        ("B300: 2.5}", "B300: 2.75}", "policy prices-2027-q1 exists with other rates"),
        ("interactive_rate: 1.25", "interactive_rate: 1.5", "policy prices-2027-q1 exists with other rates"),
        (
            "  id: prices-2027-q1\n",
            "  id: prices-2027-q1\n  effective_from: 2027-01-15T00:00:00Z\n",
            "policy prices-2027-q1 exists with other rates",
        ),
        ("gpus: 32", "gpus: 24", "agreement olmo-nightly exists with other terms"),
        ("hours: 8.5", "hours: 9", "agreement olmo-nightly exists with other terms"),
        ("end: 2027-02-08}", "end: 2027-02-09}", "agreement vision-deadline exists with other terms"),
    ],
    ids=[
        "reusing an allocation id for another cluster",
        "reusing an allocation id for a GPU type",
        "reusing an allocation id for another project",
        "turning rollover off on an existing allocation",
        "reusing a policy id with another weight",
        "reusing a policy id with another interactive rate",
        "reusing a policy id with another effective time",
        "reusing an agreement id for another number of GPUs",
        "reusing an agreement id for another weekly window",
        "reusing an agreement id for another fixed window",
    ],
)
def test_reusing_an_id_for_something_else_is_a_conflict_for_a_person(
    old: str, new: str, message: str
) -> None:
    state = applied(PLAN)
    with pytest.raises(PlanConflict, match=message):
        diff(parse_plan(edited(PLAN, old, new)), state, actor=ADMIN, now=NOW)


def test_relisting_an_agreement_revoked_since_is_a_conflict() -> None:
    state = applied(PLAN)
    state.apply(revoke("vision-deadline", at=NOW + 1))

    with pytest.raises(PlanConflict, match="agreement vision-deadline"):
        diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW + 2)


# -- event ids ----------------------------------------------------------------------------------


def test_event_ids_are_deterministic_for_the_same_plan_and_state() -> None:
    state = world(grant("by-api"))
    position = len(state.history)

    first = diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW)
    second = diff(parse_plan(PLAN), state.copy(), actor=ADMIN, now=NOW)

    assert first == second
    assert [c.event.event_id for c in first] == [f"{SOURCE}:{position}:{n}" for n in range(len(first))]


def test_event_ids_differ_once_the_log_has_moved_on() -> None:
    state = world()
    before = {c.event.event_id for c in diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW)}
    state.apply(grant("by-api", at=NOW))
    after = {c.event.event_id for c in diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW)}

    assert before.isdisjoint(after)


# -- ordering against the capacity rules --------------------------------------------------------

LAB = """\
plan: lab
period: 2027-Q1
clusters:
  - {name: small, gpu_type: H100, gpus: 8}
organisation:
  - {id: p, kind: project}
agreements:
  - {id: old, project: p, cluster: small, gpus: 8, fixed: {start: 2027-01-10, end: 2027-01-11}}
"""


@pytest.mark.parametrize(
    "replacement",
    [
        edited(LAB, "id: old", "id: new"),
        edited(LAB, "gpus: 8}", "gpus: 4}").split("agreements:")[0] + "agreements: []\n",
    ],
    ids=[
        "replacing an agreement with another of the same size in a full cluster",
        "shrinking a cluster while removing the agreement that held it up",
    ],
)
def test_a_plan_that_frees_capacity_and_uses_it_again_is_in_an_order_the_rules_accept(
    replacement: str,
) -> None:
    state = applied(LAB)

    changes = diff(parse_plan(replacement), state, actor=ADMIN, now=NOW)

    assert "revoke" in [c.action for c in changes]
    apply_all(state, changes)
    assert diff(parse_plan(replacement), state, actor=ADMIN, now=NOW) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            (
                "- {name: h100-a, gpu_type: H100, gpus: 64}",
                "- {name: h100-a, gpu_type: H100, gpus: 64}\n  - {name: h100-a, gpu_type: H100, gpus: 32}",
            ),
            "clusters",
        ),
        (("period: 2027-Q1", "period: 1990-Q1"), "period"),
        (("time_zone: Europe/Berlin", "time_zone: Europe"), "agreements.0.weekly.time_zone"),
    ],
    ids=[
        "a cluster listed twice is refused: applies would flip between the two",
        "a quarter before the events' epoch is refused",
        "a region is not a time zone",
    ],
)
def test_more_bad_plans_name_their_line_and_field(change: tuple[str, str], field: str) -> None:
    text = PLAN.replace(*change)
    assert text != PLAN
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(text)
    assert any(name == field and line for line, name, _ in caught.value.problems), caught.value.problems


def test_an_extended_allocation_is_still_the_plans_and_applying_the_plan_again_keeps_the_extension() -> None:
    state = applied(PLAN)
    allocation_id = "olmo-ft/2027-Q1"
    extension = AllocationExtended(
        event_id="api:request-grant:req-1", occurred_at=NOW, actor="root", reason="the cluster was down",
        allocation_id=allocation_id, period_end=state.allocations[allocation_id].end + 14 * DAY,
    )  # fmt: skip
    state.check(extension, now=NOW)
    state.apply(extension)
    assert diff(parse_plan(PLAN), state, actor=ADMIN, now=NOW) == []  # nothing to change, no conflict
    # the plan's amount still rules the allocation it extended
    more = edited(PLAN, "{project: olmo-ft, gpu_hours: 1000}", "{project: olmo-ft, gpu_hours: 1200}")
    assert summary(diff(parse_plan(more), state, actor=ADMIN, now=NOW)) == [
        ("adjust", f"allocation {allocation_id}")
    ]
    # an extension never shortens: it ends later than the allocation does
    shorter = extension.model_copy(
        update={"event_id": "api:x", "period_end": state.allocations[allocation_id].end}
    )
    with pytest.raises(AdminRejected, match="ends later"):
        state.check(shorter, now=NOW)
