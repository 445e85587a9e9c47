"""Admission: one job, one snapshot, one decision; the rules in order of precedence."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.admission import LANES_THAT_HOLD, decide, gpu_hours, hold_for
from allmende.domain.admission_model import (
    AdmissionSnapshot,
    BudgetLine,
    ClusterLoad,
    Decision,
    InteractiveLimits,
    JobRequest,
    Lane,
    Verdict,
)
from tests.unit.admission_builders import (
    HOUR,
    NOW,
    RATE,
    interactive,
    job,
    line,
    opportunistic,
    request,
    snapshot,
)
from tests.unit.admission_builders import gpu_hours as hours_of

PROPERTY = settings(max_examples=400, deadline=None, database=None)
ADMIT, QUEUE, REJECT = Verdict.ADMIT, Verdict.QUEUE, Verdict.REJECT
INTERACTIVE, TIME_SLICE, OPPORTUNISTIC = Lane.INTERACTIVE, Lane.TIME_SLICE, Lane.OPPORTUNISTIC
BUDGET = Lane.BUDGET


def short_of(hours: int) -> BudgetLine:
    """A budget line one charge unit short of `hours` GPU-hours."""
    return BudgetLine(allocation_id="a1", period="2027-Q1", available_units=hours_of(hours) - 1)


def held(decision: Decision) -> int:
    return sum(units for _, units in decision.hold)


def assert_consistent(decision: Decision) -> None:
    """What every decision keeps, whatever the rule that made it."""
    assert decision.available_after_units == decision.available_before_units - held(decision)
    assert held(decision) <= decision.available_before_units
    assert all(units > 0 for _, units in decision.hold)
    if decision.verdict is not ADMIT or decision.lane not in LANES_THAT_HOLD:
        assert decision.hold == ()
    if decision.verdict is not ADMIT:
        assert decision.preempt == ()
    if decision.verdict is ADMIT and decision.lane in (INTERACTIVE, BUDGET):
        assert held(decision) == decision.expected_units
    if decision.verdict is ADMIT and decision.lane is TIME_SLICE:
        assert held(decision) == min(decision.expected_units, decision.available_before_units)


# -- the rules and their precedence -------------------------------------------------------------

FULL = job("b1", gpus=16)  # a standard budget job of another project holding the whole cluster


def rule(
    name: str,
    job_request: JobRequest,
    snap: AdmissionSnapshot,
    verdict: Verdict,
    lane: Lane | None,
    code: str,
) -> pytest.ParameterSet:
    """One case of the rules table: the sentence, the inputs, the outcome."""
    return pytest.param(job_request, snap, verdict, lane, code, id=name)


RULES = [
    # 0-1: requests that can never run
    rule("a job asking for no GPUs is rejected as invalid",
         request(gpus=0), snapshot(),
         REJECT, None, "invalid-request"),
    rule("a job asking for no time is rejected as invalid before anything else",
         request(gpus=17, seconds=0), snapshot(),
         REJECT, None, "invalid-request"),
    rule("a job bigger than the cluster is rejected as too large even when interactive",
         interactive(gpus=17), snapshot(),
         REJECT, None, "too-large"),
    rule("a job bigger than the cluster is rejected as too large even inside a guarantee",
         request(gpus=17), snapshot(guaranteed=32),
         REJECT, None, "too-large"),
    rule("a job exactly the size of the cluster is not too large",
         request(gpus=16), snapshot(),
         ADMIT, BUDGET, "admitted-budget"),
    # 2: interactive
    rule("an interactive job one second longer than the limit is rejected",
         interactive(seconds=8 * HOUR + 1), snapshot(),
         REJECT, None, "interactive-too-long"),
    rule("an interactive job exactly as long as the limit is admitted",
         interactive(hours=8), snapshot(),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("an interactive job taking its user past the per-user GPU limit is rejected",
         interactive(gpus=4), snapshot(job("i0", gpus=6, lane=INTERACTIVE, user="ana", interactive=True)),
         REJECT, None, "interactive-limit"),
    rule("an interactive job reaching the per-user GPU limit exactly is admitted",
         interactive(gpus=4), snapshot(job("i0", gpus=4, lane=INTERACTIVE, user="ana", interactive=True)),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("another user's interactive GPUs do not count toward the limit",
         interactive(gpus=4), snapshot(job("i0", gpus=6, lane=INTERACTIVE, user="bob", interactive=True)),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("an interactive-lane job of the user counts toward the limit even without the flag",
         interactive(gpus=4), snapshot(job("i0", gpus=6, lane=INTERACTIVE, user="ana")),
         REJECT, None, "interactive-limit"),
    rule("a flagged interactive job of the user counts toward the limit whatever its lane",
         interactive(gpus=4), snapshot(job("i0", gpus=6, interactive=True, user="ana")),
         REJECT, None, "interactive-limit"),
    rule("the user's batch jobs do not count toward the interactive limit",
         interactive(gpus=4), snapshot(job("b0", "proj", gpus=6, user="ana")),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("an interactive job too long and too large is rejected as too long first",
         interactive(gpus=9, hours=9), snapshot(),
         REJECT, None, "interactive-too-long"),
    rule("an interactive job too large is rejected for its GPU limit before its budget",
         interactive(gpus=9), snapshot(budget=()),
         REJECT, None, "interactive-limit"),
    rule("an interactive job its budget does not cover is rejected",
         interactive(gpus=2, hours=2), snapshot(budget=[short_of(4)]),
         REJECT, None, "budget-exhausted"),
    rule("a preemptible interactive job over budget is rejected, not run opportunistically",
         interactive(priority="preemptible"), snapshot(budget=()),
         REJECT, None, "budget-exhausted"),
    rule("an interactive job with exactly enough budget is admitted",
         interactive(gpus=2, hours=2), snapshot(budget=[line(hours=4)]),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("an interactive job on a full cluster preempts opportunistic work",
         interactive(), snapshot(opportunistic("o1"), job("b1", gpus=8)),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    rule("an interactive job never preempts budget jobs, even preemptible ones",
         interactive(), snapshot(job("p1", gpus=16, priority="preemptible")),
         QUEUE, INTERACTIVE, "cluster-full"),
    rule("an interactive job inside a guarantee still runs in the interactive lane",
         interactive(), snapshot(guaranteed=8),
         ADMIT, INTERACTIVE, "admitted-interactive"),
    # 3: time-slice
    rule("a job inside the project's guarantee runs in the time-slice lane",
         request(), snapshot(guaranteed=8),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("a job reaching the guarantee exactly runs in the time-slice lane",
         request(gpus=4), snapshot(job("t0", "proj", gpus=4, lane=TIME_SLICE), guaranteed=8),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("a job one GPU beyond the guarantee falls through to the budget lane",
         request(gpus=5), snapshot(job("t0", "proj", gpus=4, lane=TIME_SLICE), guaranteed=8),
         ADMIT, BUDGET, "admitted-budget"),
    rule("another project's time-slice jobs do not use up the guarantee",
         request(gpus=4), snapshot(job("t0", "other", gpus=8, lane=TIME_SLICE), guaranteed=8),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("the project's budget-lane jobs do not use up its guarantee",
         request(), snapshot(job("b0", "proj", gpus=8), guaranteed=8),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("a job inside a guarantee is admitted without any allocation",
         request(), snapshot(guaranteed=8, budget=()),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("a job inside a guarantee preempts standard budget jobs on a full cluster",
         request(), snapshot(FULL, guaranteed=8),
         ADMIT, TIME_SLICE, "admitted-time-slice"),
    rule("a job inside a guarantee never preempts another project's time-slice jobs",
         request(), snapshot(job("t1", gpus=16, lane=TIME_SLICE), guaranteed=8),
         QUEUE, TIME_SLICE, "cluster-full"),
    rule("a job inside a guarantee never preempts non-preemptible jobs",
         request(), snapshot(job("n1", gpus=16, priority="non-preemptible"), guaranteed=8),
         QUEUE, TIME_SLICE, "cluster-full"),
    rule("a standard job beyond its guarantee without budget is rejected as over budget",
         request(gpus=9), snapshot(guaranteed=8, budget=()),
         REJECT, None, "over-budget"),
    rule("a preemptible job beyond its guarantee without budget runs opportunistically",
         request(gpus=9, priority="preemptible"), snapshot(guaranteed=8, budget=()),
         ADMIT, OPPORTUNISTIC, "admitted-opportunistic"),
    # 4: budget
    rule("a job with exactly enough budget is admitted in the budget lane",
         request(), snapshot(budget=[line(hours=64)]),
         ADMIT, BUDGET, "admitted-budget"),
    rule("a job one charge unit short of its budget is rejected as over budget",
         request(), snapshot(budget=[short_of(64)]),
         REJECT, None, "over-budget"),
    rule("a job that exactly fills the cluster is admitted without preemption",
         request(), snapshot(job("b1", gpus=8)),
         ADMIT, BUDGET, "admitted-budget"),
    rule("a budget job one GPU short of room waits in the queue",
         request(), snapshot(job("b1", gpus=9)),
         QUEUE, BUDGET, "cluster-full"),
    rule("a budget job on a full cluster preempts an opportunistic job",
         request(), snapshot(opportunistic("o1"), job("b1", gpus=8)),
         ADMIT, BUDGET, "admitted-budget"),
    rule("a budget job never preempts preemptible budget jobs",
         request(), snapshot(job("p1", gpus=16, priority="preemptible")),
         QUEUE, BUDGET, "cluster-full"),
    rule("a budget job may take the place of a time-slice job on an unhealthy host",
         request(), snapshot(job("t1", lane=TIME_SLICE, hosts=["n9"]), job("b1"), unhealthy=["n9"]),
         ADMIT, BUDGET, "admitted-budget"),
    rule("an overcommitted cluster queues a job that would otherwise fit",
         request(), snapshot(job("b1", gpus=20)),
         QUEUE, BUDGET, "cluster-full"),
    rule("a job whose GPUs cost nothing is admitted without any allocation",
         request(), snapshot(budget=(), rate=0),
         ADMIT, BUDGET, "admitted-budget"),
    # 5: over budget
    rule("a preemptible job over budget runs opportunistically on idle GPUs",
         request(priority="preemptible"), snapshot(budget=[line(hours=10)]),
         ADMIT, OPPORTUNISTIC, "admitted-opportunistic"),
    rule("a preemptible job over budget may take exactly all idle GPUs",
         request(gpus=16, priority="preemptible"), snapshot(budget=()),
         ADMIT, OPPORTUNISTIC, "admitted-opportunistic"),
    rule("a preemptible job over budget waits when idle GPUs are too few",
         request(priority="preemptible"), snapshot(job("b1", gpus=9), budget=()),
         QUEUE, OPPORTUNISTIC, "no-idle-gpus"),
    rule("a job over budget never preempts other opportunistic jobs",
         request(priority="preemptible"), snapshot(opportunistic("o1", gpus=16), budget=()),
         QUEUE, OPPORTUNISTIC, "no-idle-gpus"),
    rule("a standard job over budget is rejected",
         request(), snapshot(budget=[line(hours=10)]),
         REJECT, None, "over-budget"),
    rule("a non-preemptible job over budget is rejected",
         request(priority="non-preemptible"), snapshot(budget=[line(hours=10)]),
         REJECT, None, "over-budget"),
    rule("a job of a project without any allocation is rejected as over budget",
         request(), snapshot(budget=()),
         REJECT, None, "over-budget"),
]  # fmt: skip


@pytest.mark.parametrize(("job_request", "snap", "verdict", "lane", "code"), RULES)
def test_the_first_rule_that_decides_wins_and_its_reason_comes_first(
    job_request: JobRequest, snap: AdmissionSnapshot, verdict: Verdict, lane: Lane | None, code: str
) -> None:
    before = copy.deepcopy(snap)

    decision = decide(job_request, snap)

    assert (decision.verdict, decision.lane, decision.reasons[0].code) == (verdict, lane, code)
    assert_consistent(decision)
    assert snap == before  # deciding is not acting


# -- holds --------------------------------------------------------------------------------------


def test_a_hold_is_spread_greedily_over_the_budget_lines_in_paying_order() -> None:
    budget = [line("a1", 10), line("a2", 0), line("a3", 40), line("a4", 100), line("a5", 100)]

    decision = decide(request(), snapshot(budget=budget))

    assert decision.hold == (("a1", hours_of(10)), ("a3", hours_of(40)), ("a4", hours_of(14)))
    assert decision.available_before_units == hours_of(250)
    assert decision.available_after_units == hours_of(186)
    assert decision.reasons[0].message == (
        "admitted in the budget lane: 64 GPU-hours held of 250 left (10 from a1, 40 from a3, 14 from a4)."
    )


def test_a_hold_exactly_equal_to_the_budget_leaves_nothing() -> None:
    decision = decide(request(), snapshot(budget=[line("a1", 60), line("a2", 4)]))

    assert decision.hold == (("a1", hours_of(60)), ("a2", hours_of(4)))
    assert decision.available_after_units == 0


def test_a_time_slice_job_holds_what_budget_there_is_and_says_the_rest_is_over_budget() -> None:
    decision = decide(request(), snapshot(budget=[line("a1", 10), line("a2", "20.5")], guaranteed=8))

    assert decision.lane is TIME_SLICE
    assert decision.hold == (("a1", hours_of(10)), ("a2", hours_of("20.5")))
    assert decision.available_after_units == 0
    assert decision.reasons[0].message == (
        "admitted in the time-slice lane: with this job project proj holds 8 of its 8 guaranteed GPUs; "
        "30.5 GPU-hours held of 30.5 left (10 from a1, 20.5 from a2), and use beyond that is charged "
        "over budget."
    )


@pytest.mark.parametrize(
    ("budget", "units", "expected"),
    [
        ([line("a1", 10)], hours_of(4), [("a1", hours_of(4))]),
        ([line("a1", 1), line("a2", 10)], hours_of(4), [("a1", hours_of(1)), ("a2", hours_of(3))]),
        ([line("a1", 1), line("a2", 1)], hours_of(4), [("a1", hours_of(1)), ("a2", hours_of(1))]),
        ([line("a1", 0), line("a2", 10)], hours_of(4), [("a2", hours_of(4))]),
        ([line("a1", 10)], 0, []),
        ([], hours_of(4), []),
    ],
    ids=[
        "one line that covers the job holds it all",
        "the first line is emptied before the second is touched",
        "lines that together fall short are all emptied",
        "an empty line is skipped, not held at zero",
        "nothing to hold holds nothing",
        "no lines hold nothing",
    ],
)
def test_holding_takes_from_each_line_what_is_left_in_paying_order(
    budget: list[BudgetLine], units: int, expected: list[tuple[str, int]]
) -> None:
    assert hold_for(budget, units) == tuple(expected)


def test_a_decision_carries_the_rate_the_expected_charge_and_the_fair_share_it_was_made_with() -> None:
    known = decide(request(gpus=2, hours=3), snapshot(rate=2 * RATE, fairshare={"proj": 0.21}))
    unknown = decide(request(gpus=2, hours=3), snapshot(fairshare={"other": 0.9}))

    assert (known.rate, known.expected_units, known.fairshare_factor) == (2 * RATE, hours_of(12), 0.21)
    assert held(known) == hours_of(12)
    assert unknown.fairshare_factor == 0.5


# -- reasons ------------------------------------------------------------------------------------


def said(name: str, job_request: JobRequest, snap: AdmissionSnapshot, message: str) -> pytest.ParameterSet:
    """One case of the messages table: the sentence, the inputs, the deciding reason's message."""
    return pytest.param(job_request, snap, message, id=name)


OVER_BUDGET_ADVICE = (
    "Over budget only preemptible jobs may run, opportunistically on idle GPUs: submit it as preemptible, "
    "or ask for more GPU-hours."
)

MESSAGES = [
    said("too large names the job's GPUs and the cluster's",
         request(gpus=17), snapshot(),
         "job j1 asks for 17 GPUs; cluster c1 has only 16, so it could never start."),
    said("an invalid request says what a job needs at least",
         request(seconds=0), snapshot(),
         "job j1 asks for 8 GPUs for 0 seconds; a job needs at least one GPU for one second or more."),
    said("too long rounds the asked time up so it never reads as within the limit",
         interactive(seconds=8 * HOUR + 1), snapshot(),
         "interactive jobs may run at most 8 hours; this one asks for 8.1. Submit it as a batch job "
         "instead."),
    said("the interactive limit counts what the user holds and would hold",
         interactive(gpus=4), snapshot(job("i0", gpus=6, lane=INTERACTIVE, user="ana")),
         "user ana already holds 6 GPUs in interactive jobs; 4 more would make 10, above the limit of 8 "
         "per user."),
    said("what is left rounds down so a shortfall never reads as enough",
         interactive(gpus=8, hours=8, project="olmo-ft"),
         snapshot(budget=[line("a1", "63.99"), line("a2", 0, period="2027")]),
         "project olmo-ft has 63.9 GPU-hours left in 2027-Q1; this job needs up to 64."),
    said("over budget says what is needed rounded up and that only preemptible jobs may run",
         request(gpus=1, seconds=HOUR + 1, project="olmo-ft"), snapshot(budget=[line("a1", 1)]),
         f"project olmo-ft has 1 GPU-hour left in 2027-Q1; this job needs up to 1.1. {OVER_BUDGET_ADVICE}"),
    said("over budget gives the exact figures in GPU-hours",
         request(), snapshot(budget=[line("a1", "12.5")]),
         f"project proj has 12.5 GPU-hours left in 2027-Q1; this job needs up to 64. {OVER_BUDGET_ADVICE}"),
    said("a project without any allocation is told so",
         request(), snapshot(budget=()),
         "no allocation covers cluster c1 for project proj; this job needs up to 64 GPU-hours. "
         f"{OVER_BUDGET_ADVICE}"),
    said("a budget admission names the lane and the hold",
         request(), snapshot(budget=[line("a1", 1000)]),
         "admitted in the budget lane: 64 GPU-hours held of 1,000 left."),
    said("an interactive admission names the lane and the hold",
         interactive(), snapshot(),
         "admitted in the interactive lane: 4 GPU-hours held of 1,000 left."),
    said("a time-slice admission says how much of the guarantee is in use",
         request(), snapshot(guaranteed=8),
         "admitted in the time-slice lane: with this job project proj holds 8 of its 8 guaranteed GPUs; "
         "64 GPU-hours held of 1,000 left."),
    said("an opportunistic admission warns that the job may be preempted",
         request(priority="preemptible"), snapshot(budget=()),
         "admitted in the opportunistic lane on idle GPUs: nothing is held, and the job may be preempted "
         "when budgeted work needs the GPUs."),
    said("a full cluster says what is free and what preemption could free",
         request(), snapshot(FULL),
         "cluster c1 has 0 of 16 GPUs free and preempting opportunistic jobs would free 0 more; this job "
         "needs 8, so it waits in the queue."),
    said("an overcommitted cluster shows no free GPUs rather than fewer than none",
         request(), snapshot(job("b1", gpus=20)),
         "cluster c1 has 0 of 16 GPUs free and preempting opportunistic jobs would free 0 more; this job "
         "needs 8, so it waits in the queue."),
    said("a full cluster inside a guarantee says how far preemption may go",
         request(), snapshot(job("b1", gpus=4), job("n1", gpus=12, priority="non-preemptible"), guaranteed=8),
         "cluster c1 has 0 of 16 GPUs free and preempting opportunistic, preemptible and standard budget "
         "jobs would free 4 more; this job needs 8, so it waits in the queue."),
    said("no idle GPUs says how many are idle and how many the job needs",
         request(priority="preemptible"), snapshot(job("b1", gpus=9), budget=()),
         "over budget, this preemptible job may run only on idle GPUs; cluster c1 has 7 idle and it needs 8, "
         "so it waits in the queue."),
]  # fmt: skip


@pytest.mark.parametrize(("job_request", "snap", "message"), MESSAGES)
def test_the_deciding_reason_is_a_sentence_with_exact_figures(
    job_request: JobRequest, snap: AdmissionSnapshot, message: str
) -> None:
    assert decide(job_request, snap).reasons[0].message == message


def test_an_admission_that_preempts_gives_a_reason_per_group_of_victims_then_the_notes() -> None:
    snap = snapshot(
        job("t1", "other", gpus=2, lane=TIME_SLICE, hosts=["n9"]),
        job("t2", "other", gpus=1, lane=INTERACTIVE, hosts=["n9"]),
        job("t0", "proj", gpus=8, lane=TIME_SLICE),
        opportunistic("o1", "other", gpus=2),
        opportunistic("o2", "other", gpus=2, since=NOW),
        opportunistic("o3", "other", gpus=1),
        unhealthy=["n9"],
        guaranteed=8,
    )

    decision = decide(request(gpus=7), snap)

    assert decision.verdict is ADMIT and decision.lane is BUDGET
    assert [v.job_id for v in decision.preempt] == ["t1", "t2", "o2", "o1"]
    assert [(r.code, r.message) for r in decision.reasons[1:]] == [
        ("preempts-unhealthy-host",
         "it preempts 2 jobs on unhealthy hosts (3 GPUs), which must stop anyway: t1, t2."),
        ("preempts-opportunistic",
         "it preempts 2 opportunistic jobs (4 GPUs): o2, o1."),
        ("beyond-guarantee",
         "project proj already holds 8 of its 8 guaranteed GPUs on cluster c1 and this job asks for 7 "
         "more, so it is paid from the budget."),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("job_request", "guaranteed", "lane"),
    [(request(), 0, BUDGET), (interactive(gpus=8), 0, INTERACTIVE), (request(), 8, TIME_SLICE)],
    ids=[
        "a budget job that fits in the free GPUs preempts nothing, not even jobs on unhealthy hosts",
        "an interactive job that fits in the free GPUs preempts nothing",
        "a job inside a guarantee that fits in the free GPUs preempts nothing",
    ],
)
def test_a_job_that_fits_in_the_free_gpus_preempts_nothing(
    job_request: JobRequest, guaranteed: int, lane: Lane
) -> None:
    running = [job("b1", hosts=["n9"]), opportunistic("o1")]
    snap = snapshot(*running, cluster_gpus=24, unhealthy=["n9"], guaranteed=guaranteed)

    decision = decide(job_request, snap)

    assert (decision.verdict, decision.lane, decision.preempt) == (ADMIT, lane, ())
    assert [r.code for r in decision.reasons if r.code.startswith("preempts-")] == []


def test_a_time_slice_admission_names_the_standard_jobs_it_preempts() -> None:
    decision = decide(
        request(gpus=8), snapshot(job("s1", gpus=8), job("s2", gpus=8, since=NOW), guaranteed=8)
    )

    assert decision.lane is TIME_SLICE
    assert [(v.job_id, v.code) for v in decision.preempt] == [("s2", "standard")]
    assert decision.reasons[1].message == "it preempts 1 standard budget job (8 GPUs): s2."


def test_a_reason_lists_at_most_ten_job_ids() -> None:
    running = [opportunistic(f"o{index:02}", gpus=1) for index in range(16)]

    decision = decide(request(gpus=16), snapshot(*running))

    assert decision.reasons[1].message == (
        "it preempts 16 opportunistic jobs (16 GPUs): o00, o01, o02, o03, o04, o05, o06, o07, o08, o09 "
        "and 6 more."
    )


def test_an_over_budget_decision_explains_the_shortfall_after_the_deciding_reason() -> None:
    decision = decide(request(priority="preemptible"), snapshot(budget=[line("a1", "12.5")]))

    assert [r.code for r in decision.reasons] == ["admitted-opportunistic", "budget-exhausted"]
    assert (
        decision.reasons[1].message
        == "project proj has 12.5 GPU-hours left in 2027-Q1; this job needs up to 64."
    )
    assert decision.sentence.startswith("admitted in the opportunistic lane")


@pytest.mark.parametrize(
    ("units", "rounding", "text"),
    [
        (0, "nearest", "0"),
        (hours_of(1), "nearest", "1"),
        (hours_of(1000), "nearest", "1,000"),
        (hours_of("12.5"), "nearest", "12.5"),
        (hours_of("12.25"), "nearest", "12.3"),
        (hours_of("12.25") - 1, "nearest", "12.2"),
        (hours_of("12.31"), "down", "12.3"),
        (hours_of("12.99"), "down", "12.9"),
        (hours_of("12.01"), "up", "12.1"),
        (1, "up", "0.1"),
        (1, "down", "0"),
        (hours_of(1_234_567), "nearest", "1,234,567"),
    ],
    ids=[
        "no units are zero GPU-hours",
        "3.6e9 units are one GPU-hour",
        "thousands are grouped",
        "a tenth is shown",
        "half a tenth rounds up to the nearest",
        "just under half a tenth rounds down to the nearest",
        "rounding down drops what is below a tenth",
        "rounding down never rounds up",
        "rounding up takes the next tenth",
        "a single unit rounded up shows as a tenth",
        "a single unit rounded down shows as nothing",
        "large figures are exact",
    ],
)
def test_gpu_hours_are_shown_to_at_most_one_decimal(units: int, rounding: str, text: str) -> None:
    assert gpu_hours(units, rounding) == text  # type: ignore[arg-type]


# -- properties ---------------------------------------------------------------------------------

CLASSES = st.sampled_from(["preemptible", "standard", "non-preemptible"])
PROJECTS = st.sampled_from(["proj", "other", "third"])


@st.composite
def snapshots(draw: st.DrawFn) -> AdmissionSnapshot:
    running = [
        job(
            f"r{index}",
            draw(PROJECTS),
            gpus=draw(st.integers(0, 10)),
            lane=draw(st.sampled_from([None, *Lane])),
            priority=draw(CLASSES),
            since=NOW - draw(st.integers(0, 5)) * HOUR,
            hosts=draw(st.lists(st.sampled_from(["n1", "n2", "n9"]), max_size=2, unique=True)),
            user=draw(st.sampled_from(["ana", "bob"])),
            interactive=draw(st.booleans()),
        )
        for index in range(draw(st.integers(0, 8)))
    ]
    budget = [
        BudgetLine(f"a{index}", "2027-Q1", draw(st.integers(0, hours_of(100))))
        for index in range(draw(st.integers(0, 3)))
    ]
    return AdmissionSnapshot(
        now=NOW,
        cluster_gpus=draw(st.integers(0, 32)),
        load=ClusterLoad(running),
        budget=tuple(budget),
        rate=draw(st.sampled_from([0, RATE // 2, RATE, 3 * RATE])),
        guaranteed_gpus=draw(st.integers(0, 12)),
        fairshare={p: draw(st.floats(0, 1)) for p in draw(st.lists(PROJECTS, unique=True))},
        unhealthy_hosts=frozenset(draw(st.lists(st.sampled_from(["n1", "n9"]), unique=True))),
        limits=InteractiveLimits(
            max_gpus_per_user=draw(st.integers(0, 8)), max_seconds=draw(st.integers(0, 9)) * HOUR
        ),
    )


@st.composite
def requests(draw: st.DrawFn) -> JobRequest:
    return request(
        "x1",
        draw(PROJECTS),
        gpus=draw(st.integers(-1, 20)),
        seconds=draw(st.integers(-1, 10 * HOUR)),
        priority=draw(CLASSES),
        interactive=draw(st.booleans()),
        user=draw(st.sampled_from(["ana", "bob"])),
    )


@PROPERTY
@given(job_request=requests(), snap=snapshots())
def test_an_admission_always_has_room_and_never_holds_more_than_is_left(
    job_request: JobRequest, snap: AdmissionSnapshot
) -> None:
    before = copy.deepcopy(snap)

    decision = decide(job_request, snap)

    assert snap == before
    assert decision.reasons and all(r.code and r.message for r in decision.reasons)
    assert_consistent(decision)
    hold_lines = {line.allocation_id: line.available_units for line in snap.budget}
    assert all(units <= hold_lines[allocation] for allocation, units in decision.hold)
    if decision.verdict is ADMIT:
        free = snap.cluster_gpus - sum(j.gpus for j in snap.load.jobs)
        freed = sum(v.gpus for v in decision.preempt)
        assert free + freed >= job_request.gpus
        assert decision.lane is not None
        assert {v.job_id for v in decision.preempt} <= {j.job_id for j in snap.load.jobs}
        if decision.lane is OPPORTUNISTIC:
            assert decision.preempt == ()
