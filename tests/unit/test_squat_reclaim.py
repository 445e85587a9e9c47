"""Squatting jobs give their GPUs back: from usage readings to the admission decision.

A job whose GPUs stay idle (readings under the squatting threshold) for longer than the grace
period is a preemption victim whatever its class, before any working job; time-slice and
interactive jobs never are (domain.preemption, domain.squatting.idle_since, AdmissionState).
"""

from __future__ import annotations

import itertools

import pytest

from allmende.domain.admission import decide
from allmende.domain.admission_model import Lane
from allmende.domain.admission_state import AdmissionState
from allmende.domain.preemption import Reach, plan_victims
from allmende.domain.squatting import SquatRule, idle_since
from allmende.schemas.events import (
    JobEvent,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    PriorityClass,
)
from tests.unit.admission_builders import HOUR, NOW, job, opportunistic, request, snapshot

RULE = SquatRule(max_utilization_bp=500, grace_s=1800)  # under 5 % for longer than 30 minutes


# -- the stretch, from two maxima -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("busy", "low", "expected"),
    [
        (0, NOW + 3600, NOW),  # idle from the start: the first reading closes an hour
        (0, NOW + 1800, None),  # exactly the grace period: not longer
        (0, NOW + 1801, NOW),
        (NOW + 3600, NOW + 7200, NOW + 3600),  # busy, then idle for an hour
        (NOW + 7200, NOW + 3600, None),  # idle, then busy again: working now
        (NOW - 50, NOW - 10, None),  # readings of an earlier run never count
    ],
)
def test_a_job_squats_once_its_latest_idle_stretch_is_longer_than_the_grace(
    busy: int, low: int, expected: int | None
) -> None:
    assert idle_since(NOW, busy, low, RULE) == expected


# -- the victims ----------------------------------------------------------------------------------


def test_a_squatting_job_goes_first_whatever_its_class_and_at_any_reach() -> None:
    running = [
        opportunistic("o1", gpus=8),
        job("n1", priority="non-preemptible", gpus=8, idle_since=NOW - 3 * HOUR),
        job("n2", priority="non-preemptible", gpus=8),  # working: its class's promise holds
    ]

    victims, freed = plan_victims(
        running, 8, now=NOW, fairshare={}, unhealthy_hosts=frozenset(), reach=Reach.OPPORTUNISTIC
    )

    assert [(v.job_id, v.code) for v in victims] == [("n1", "squatting")]
    assert freed == 8
    assert "idle since 2027-01-04 09:00 UTC" in victims[0].reason


@pytest.mark.parametrize("lane", [Lane.TIME_SLICE, Lane.INTERACTIVE])
def test_a_job_inside_a_guarantee_or_at_the_keyboard_is_never_taken_for_squatting(lane: Lane) -> None:
    idle = job("g1", gpus=8, lane=lane, idle_since=NOW - 3 * HOUR)

    victims, _ = plan_victims(
        [idle], 8, now=NOW, fairshare={}, unhealthy_hosts=frozenset(), reach=Reach.STANDARD
    )

    assert victims == ()


def test_a_budget_job_on_a_full_cluster_takes_the_gpus_of_an_idle_non_preemptible_placeholder() -> None:
    snap = snapshot(
        job("parked", gpus=8, priority="non-preemptible", idle_since=NOW - 2 * HOUR),
        job("n2", gpus=8, priority="non-preemptible"),
    )

    decision = decide(request(gpus=8), snap)

    assert decision.verdict == "admit" and decision.lane is Lane.BUDGET
    assert [(v.job_id, v.code) for v in decision.preempt] == [("parked", "squatting")]
    assert decision.reasons[1].code == "preempts-squatting"
    assert decision.reasons[1].message == "it preempts 1 job that has left its GPUs idle (8 GPUs): parked."


def test_without_the_idle_placeholder_the_same_job_waits() -> None:
    decision = decide(
        request(gpus=8),
        snapshot(
            job("parked", gpus=8, priority="non-preemptible"), job("n2", gpus=8, priority="non-preemptible")
        ),
    )

    assert decision.verdict == "queue"


# -- the state, from readings in any order ----------------------------------------------------------


def started(at: int, run: int = 1) -> JobStarted:
    return JobStarted(
        event_id=f"p:{run}:start", occurred_at=at, producer="t", job_id="p", gpus=2, hosts=("h1",)
    )


def reading(at: int, utilization: float) -> JobUsageSample:
    return JobUsageSample(
        event_id=f"p:sample:{at}", occurred_at=at, producer="t", job_id="p", gpus_in_use=2,
        gpu_utilization=utilization,
    )  # fmt: skip


def preempted(at: int, since: int) -> JobPreempted:
    return JobPreempted(
        event_id=f"p:pre:{at}", occurred_at=at, producer="t", job_id="p", started_at=since, reason="x"
    )


def folded(events: list[JobEvent], rule: SquatRule | None = RULE) -> int | None:
    state = AdmissionState(squat=rule)
    for event in events:
        state.observe(event)
    return state.jobs["p"].idle_since


def test_readings_fold_to_the_same_squatting_in_any_order() -> None:
    events: list[JobEvent] = [
        started(NOW),
        reading(NOW + 600, 0.9),
        reading(NOW + 1200, 0.01),
        reading(NOW + 2400, 0.02),
        reading(NOW + 3600, 0.0),
    ]
    answers = {folded(list(order)) for order in itertools.permutations(events)}

    assert answers == {NOW + 600}


def test_a_busy_reading_ends_the_squatting_and_a_new_run_starts_clean() -> None:
    idle = [started(NOW), reading(NOW + 3600, 0.01)]
    assert folded(idle) == NOW
    assert folded([*idle, reading(NOW + 4200, 0.8)]) is None
    assert folded([*idle, preempted(NOW + 4000, NOW), started(NOW + 5000, run=2)]) is None


def test_the_cluster_load_admission_decides_on_carries_the_squatting_and_nothing_without_the_rule() -> None:
    submitted = JobSubmitted(
        event_id="p:submitted", occurred_at=NOW - 60, producer="t", job_id="p", project="proj", user="ana",
        cluster="c1", gpu_type="H100", gpus=2, priority_class=PriorityClass.NON_PREEMPTIBLE,
        requested_seconds=86_400,
    )  # fmt: skip
    events: list[JobEvent] = [submitted, started(NOW), reading(NOW + 3600, 0.01)]
    state = AdmissionState(squat=RULE)
    for event in events:
        state.observe(event)

    [running] = state.load_on("c1", NOW + 3600, start_deadline_s=600).jobs
    assert (running.job_id, running.idle_since) == ("p", NOW)
    assert folded(events, rule=None) is None
