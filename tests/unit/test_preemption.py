"""Preemption: which running jobs give way, in which order, and why."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.admission_model import Lane, RunningJob, Victim
from allmende.domain.preemption import Reach, plan_victims, preemption_plan, victim_group
from tests.unit.admission_builders import HOUR, NOW, job, opportunistic, snapshot, utc

PROPERTY = settings(max_examples=300, deadline=None, database=None)


def plan(
    *running: RunningJob, needed: int = 8, reach: Reach = Reach.OPPORTUNISTIC,
    fairshare: Mapping[str, float] | None = None, unhealthy: frozenset[str] = frozenset(),
) -> tuple[tuple[Victim, ...], int]:  # fmt: skip
    return plan_victims(
        running, needed, now=NOW, fairshare=fairshare or {}, unhealthy_hosts=unhealthy, reach=reach
    )


def order(victims: tuple[Victim, ...]) -> list[str]:
    return [f"{v.job_id}:{v.code}" for v in victims]


BAD = frozenset({"n9"})  # the unhealthy host in the cases below
SHARES = {"low": 0.2, "mid": 0.5, "high": 0.9}

# -- the order ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "needed", "reach", "expected"),
    [
        (
            [
                opportunistic("o1", "low"),
                job("t1", lane=Lane.TIME_SLICE, hosts=["n9"]),
                job("n1", priority="non-preemptible", hosts=["n1", "n9"]),
                job("i1", lane=Lane.INTERACTIVE, hosts=["n9"]),
            ],
            32,
            Reach.OPPORTUNISTIC,
            ["i1:unhealthy-host", "n1:unhealthy-host", "t1:unhealthy-host", "o1:opportunistic"],
        ),
        (
            [job("t1", lane=Lane.TIME_SLICE, hosts=["n9"]), job("t2", lane=Lane.TIME_SLICE, hosts=["n9"])],
            1,
            Reach.OPPORTUNISTIC,
            ["t1:unhealthy-host", "t2:unhealthy-host"],
        ),
        (
            [opportunistic("o1"), job("b1", hosts=["n9"]), opportunistic("o2")],
            0,
            Reach.STANDARD,
            ["b1:unhealthy-host"],
        ),
        (
            [opportunistic("o1")],
            -4,
            Reach.STANDARD,
            [],
        ),
        (
            [opportunistic("o1", "high"), opportunistic("o2", "low"), opportunistic("o3", "mid")],
            24,
            Reach.OPPORTUNISTIC,
            ["o2:opportunistic", "o3:opportunistic", "o1:opportunistic"],
        ),
        (
            [
                opportunistic("o1", "mid", since=NOW - 5 * HOUR),
                opportunistic("o2", "mid", since=NOW - HOUR),
                opportunistic("o3", "mid", since=NOW - 3 * HOUR),
            ],
            24,
            Reach.OPPORTUNISTIC,
            ["o2:opportunistic", "o3:opportunistic", "o1:opportunistic"],
        ),
        (
            [opportunistic("o2", "mid"), opportunistic("o1", "mid"), opportunistic("o3", "mid")],
            24,
            Reach.OPPORTUNISTIC,
            ["o1:opportunistic", "o2:opportunistic", "o3:opportunistic"],
        ),
        (
            [opportunistic("o1", "mid", since=NOW - 2 * HOUR), opportunistic("o2", "unknown", since=NOW)],
            16,
            Reach.OPPORTUNISTIC,
            ["o2:opportunistic", "o1:opportunistic"],
        ),
        (
            [
                opportunistic("o1", "low", gpus=4),
                opportunistic("o2", "mid", gpus=4),
                opportunistic("o3", "high"),
            ],
            8,
            Reach.OPPORTUNISTIC,
            ["o1:opportunistic", "o2:opportunistic"],
        ),
        (
            [opportunistic("o1", "low", gpus=16), opportunistic("o2", "mid", gpus=1)],
            1,
            Reach.OPPORTUNISTIC,
            ["o1:opportunistic"],
        ),
        (
            [opportunistic("o1", "low", gpus=2, hosts=["n9"]), opportunistic("o2", "mid", gpus=4)],
            2,
            Reach.OPPORTUNISTIC,
            ["o1:unhealthy-host"],
        ),
        (
            [job("p1", priority="preemptible"), job("s1"), opportunistic("o1", "high")],
            32,
            Reach.OPPORTUNISTIC,
            ["o1:opportunistic"],
        ),
        (
            [job("s1", "low"), job("p1", "low", priority="preemptible"), opportunistic("o1", "high")],
            32,
            Reach.PREEMPTIBLE,
            ["o1:opportunistic", "p1:preemptible"],
        ),
        (
            [job("s1", "low"), job("p1", "high", priority="preemptible"), opportunistic("o1", "high")],
            32,
            Reach.STANDARD,
            ["o1:opportunistic", "p1:preemptible", "s1:standard"],
        ),
        (
            [
                job("t1", lane=Lane.TIME_SLICE, priority="preemptible"),
                job("i1", lane=Lane.INTERACTIVE, priority="preemptible"),
                job("i2", lane=Lane.BUDGET, priority="preemptible", interactive=True),
                job("n1", priority="non-preemptible"),
                job("n2", lane=Lane.OPPORTUNISTIC, priority="non-preemptible"),
                job("g1", priority="gold"),
            ],
            64,
            Reach.STANDARD,
            [],
        ),
        (
            [job("x1", lane=None, priority="preemptible"), job("x2", lane=None), opportunistic("o1")],
            32,
            Reach.STANDARD,
            ["o1:opportunistic", "x1:preemptible", "x2:standard"],
        ),
        (
            [job("x1", lane=None, priority="preemptible"), opportunistic("o1")],
            32,
            Reach.OPPORTUNISTIC,
            ["o1:opportunistic"],
        ),
    ],
    ids=[
        "jobs on an unhealthy host go first whatever their lane or class",
        "every job on an unhealthy host is listed even beyond the GPUs needed",
        "with no GPUs needed only the jobs on unhealthy hosts are listed",
        "with fewer than no GPUs needed nothing healthy is listed",
        "the opportunistic job of the project with the lowest fair share goes first",
        "between equal fair shares the job that started last loses the least work and goes first",
        "between equal fair shares and start times the job id decides",
        "a project without a fair-share factor counts as exactly at its share",
        "preemption stops as soon as the GPUs freed reach the GPUs needed",
        "a big job freeing more than needed is not swapped for a smaller one later in the order",
        "GPUs freed on an unhealthy host count toward the GPUs needed",
        "opportunistic reach never takes budget-lane jobs",
        "preemptible reach takes preemptible budget jobs only after every opportunistic one",
        "the group beats the fair share, and standard reach takes standard budget jobs last",
        "time-slice, interactive, non-preemptible and unknown classes are never victims on healthy hosts",
        "a job without a lane counts as a budget-lane job of its class",
        "a job without a lane is out of opportunistic reach",
    ],
)
def test_victims_come_in_order_of_group_then_fair_share_then_least_work_lost(
    running: list[RunningJob], needed: int, reach: Reach, expected: list[str]
) -> None:
    victims, freed = plan(*running, needed=needed, reach=reach, fairshare=SHARES, unhealthy=BAD)

    assert order(victims) == expected
    assert freed == sum(v.gpus for v in victims)


def test_when_the_eligible_jobs_are_not_enough_all_of_them_are_listed_and_the_gpus_fall_short() -> None:
    victims, freed = plan(opportunistic("o1", gpus=4), job("p1", priority="preemptible", gpus=4), needed=16)

    assert order(victims) == ["o1:opportunistic"]
    assert freed == 4


def test_a_victim_reason_is_a_sentence_with_the_project_fair_share_gpus_and_start() -> None:
    running = [opportunistic("j7", "vision", since=utc(2027, 1, 3, 10))]

    (victim,), _ = plan(*running, fairshare={"vision": 0.21})

    assert victim == Victim(
        job_id="j7",
        project="vision",
        gpus=8,
        code="opportunistic",
        reason="job j7 of vision runs opportunistically (fair share 0.21) on 8 GPUs "
        "since 2027-01-03 10:00 UTC",
    )


@pytest.mark.parametrize(
    ("running", "reason"),
    [
        (
            job("j1", "nlp", gpus=1, hosts=["n1", "n9", "n8"], since=utc(2027, 1, 2, 9, 30)),
            "job j1 of nlp holds 1 GPU on unhealthy hosts n8, n9 since 2027-01-02 09:30 UTC "
            "and must stop anyway",
        ),
        (
            job("j2", "nlp", gpus=4, priority="preemptible", since=utc(2027, 1, 4, 11)),
            "job j2 of nlp is a preemptible job (fair share 0.50) on 4 GPUs since 2027-01-04 11:00 UTC",
        ),
        (
            job("j3", "nlp", gpus=2, since=utc(2027, 1, 4, 11)),
            "job j3 of nlp is a standard job outside any guarantee (fair share 0.50) on 2 GPUs "
            "since 2027-01-04 11:00 UTC",
        ),
        (
            job("j4", "nlp", gpus=2, since=10**18),
            "job j4 of nlp is a standard job outside any guarantee (fair share 0.50) on 2 GPUs "
            f"since Unix time {10**18}",
        ),
    ],
    ids=[
        "a job on unhealthy hosts names them and says it must stop anyway",
        "a preemptible budget job says it is preemptible",
        "a standard budget job says it runs outside any guarantee",
        "a start time beyond the calendar is shown as Unix time rather than raised",
    ],
)
def test_each_group_explains_its_victims_in_its_own_words(running: RunningJob, reason: str) -> None:
    (victim,), _ = plan(running, needed=64, reach=Reach.STANDARD, unhealthy=frozenset({"n8", "n9"}))

    assert victim.reason == reason


def test_the_plan_does_not_change_its_inputs() -> None:
    running = [opportunistic("o1", "low"), job("b1", hosts=["n9"]), job("p1", priority="preemptible")]
    fairshare = dict(SHARES)
    before = copy.deepcopy((running, fairshare))

    plan(*running, needed=16, reach=Reach.STANDARD, fairshare=fairshare, unhealthy=BAD)

    assert (running, fairshare) == before


def test_the_plan_for_a_snapshot_is_the_plan_for_its_running_jobs() -> None:
    snap = snapshot(
        opportunistic("o1", "low"), job("b1", hosts=["n9"]), job("p1", priority="preemptible"),
        fairshare=SHARES, unhealthy=["n9"],
    )  # fmt: skip

    assert preemption_plan(snap, 16, Reach.PREEMPTIBLE) == plan(
        *snap.load.jobs, needed=16, reach=Reach.PREEMPTIBLE, fairshare=SHARES, unhealthy=BAD
    )
    assert preemption_plan(snap, 16) == plan(*snap.load.jobs, needed=16, fairshare=SHARES, unhealthy=BAD)


# -- properties ---------------------------------------------------------------------------------

LANES = st.sampled_from([None, *Lane])
CLASSES = st.sampled_from(["preemptible", "standard", "non-preemptible"])


@st.composite
def running_jobs(draw: st.DrawFn) -> list[RunningJob]:
    count = draw(st.integers(0, 10))
    return [
        job(
            f"j{index}",
            draw(st.sampled_from(["low", "mid", "high", "unknown"])),
            gpus=draw(st.integers(1, 8)),
            lane=draw(LANES),
            priority=draw(CLASSES),
            since=NOW - draw(st.integers(0, 3)) * HOUR,
            hosts=draw(st.lists(st.sampled_from(["n1", "n2", "n9"]), max_size=2, unique=True)),
            interactive=draw(st.booleans()),
        )
        for index in range(count)
    ]


@PROPERTY
@given(
    running=running_jobs(),
    needed=st.integers(-2, 40),
    reach=st.sampled_from(list(Reach)),
    data=st.data(),
)
def test_a_plan_lists_every_unhealthy_job_and_only_as_many_others_as_it_takes(
    running: list[RunningJob], needed: int, reach: Reach, data: st.DataObject
) -> None:
    victims, freed = plan(*running, needed=needed, reach=reach, fairshare=SHARES, unhealthy=BAD)
    shuffled = data.draw(st.permutations(running))

    eligible = [j for j in running if victim_group(j, BAD, reach) is not None]
    on_bad_hosts = {j.job_id for j in running if BAD.intersection(j.hosts)}
    listed = [v.job_id for v in victims]
    assert freed == sum(v.gpus for v in victims)
    assert len(set(listed)) == len(listed)
    assert on_bad_hosts <= set(listed) <= {j.job_id for j in eligible}
    optional = [v for v in victims if v.code != "unhealthy-host"]
    if optional:  # the last optional victim was needed: without it the GPUs fell short
        assert freed - optional[-1].gpus < needed
    if freed < needed:
        assert set(listed) == {j.job_id for j in eligible}
    assert plan(*shuffled, needed=needed, reach=reach, fairshare=SHARES, unhealthy=BAD) == (victims, freed)
