"""The admission state: occupancy and holds from the admission log and the job lifecycle."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.admission_state import AdmissionState
from allmende.schemas.admission_events import AdmissionDecided, HoldPlaced, HoldReleased
from allmende.schemas.events import FinishStatus, JobEvent, JobFinished, JobPreempted, JobStarted

T = 1_800_000_000
DEADLINE = 600


def decided(
    job: str, *, at: int = T, gpus: int = 4, cluster: str = "c1", project: str = "p"
) -> AdmissionDecided:
    return AdmissionDecided(
        event_id=f"decision:{job}:1", occurred_at=at, actor="sched", job_id=job, project=project, user="ada",
        cluster=cluster, gpu_type="H100", gpus=gpus, priority_class="standard", interactive=False,
        requested_seconds=3600, verdict="admit", lane="budget", reasons=(), rate=10**6, expected_units=0,
        available_before_units=0, available_after_units=0, fairshare_factor=0.5,
    )  # fmt: skip


def hold(job: str, *parts: tuple[str, int], project: str = "p") -> HoldPlaced:
    return HoldPlaced(event_id=f"hold:{job}:1", occurred_at=T, actor="sched", job_id=job, project=project,
                      allocations=parts, expires_at=T + 7200)  # fmt: skip


def released(job: str) -> HoldReleased:
    return HoldReleased(
        event_id=f"release:{job}:1", occurred_at=T, actor="sched", job_id=job, reason="finished"
    )


def started(job: str, at: int, hosts: tuple[str, ...] = ("h1",)) -> JobStarted:
    return JobStarted(
        event_id=f"{job}:start:{at}", occurred_at=at, producer="t", job_id=job, gpus=4, hosts=hosts
    )


def finished(job: str, at: int) -> JobFinished:
    return JobFinished(
        event_id=f"{job}:fin", occurred_at=at, producer="t", job_id=job, status=FinishStatus.SUCCEEDED
    )


def preempted(job: str, at: int) -> JobPreempted:
    return JobPreempted(event_id=f"{job}:pre:{at}", occurred_at=at, producer="t", job_id=job, reason="x")


def _ids(state: AdmissionState, now: int) -> set[str]:
    return {j.job_id for j in state.load_on("c1", now, DEADLINE).jobs}


@pytest.mark.parametrize(
    ("job_events", "now", "holds_gpus"),
    [
        ([], T + 10, True),
        ([], T + DEADLINE, False),
        ([started("a", T + 60)], T + 10 * DEADLINE, True),
        ([started("a", T + 60), finished("a", T + 120)], T + 130, False),
        ([started("a", T + 60), preempted("a", T + 120)], T + 130, False),
        ([started("a", T + 60), preempted("a", T + 120), started("a", T + 180)], T + 200, True),
        ([started("a", T + 180), preempted("a", T + 120), started("a", T + 60)], T + 200, True),
        ([finished("a", T + 120), started("a", T + 60)], T + 130, False),
    ],
    ids=[
        "an admitted job holds its GPUs before it starts",
        "an admitted job that never started frees them at its start deadline",
        "a started job holds its GPUs past the start deadline",
        "a finished job frees its GPUs",
        "a preempted job frees its GPUs",
        "a preempted job that starts again holds them again",
        "the same events in another order give the same answer",
        "a finish is final, whatever arrives after it",
    ],
)
def test_which_jobs_hold_gpus(job_events: list[JobEvent], now: int, holds_gpus: bool) -> None:
    state = AdmissionState.of([decided("a")], job_events)
    assert _ids(state, now) == ({"a"} if holds_gpus else set())


def test_usage_spends_a_hold_in_the_order_it_was_placed() -> None:
    state = AdmissionState.of([decided("a"), hold("a", ("q1", 100), ("q1-any", 50))], [started("a", T + 1)])
    assert state.held({}) == {"q1": 100, "q1-any": 50}
    assert state.held({"a": 30}) == {"q1": 70, "q1-any": 50}
    assert state.held({"a": 120}) == {"q1-any": 30}
    assert state.held({"a": 500}) == {}
    state.apply(released("a"))
    assert state.held({"a": 30}) == {}


def test_a_release_ahead_of_its_hold_in_the_log_counts_only_in_its_copy_after_the_hold() -> None:
    state = AdmissionState.of([decided("a"), released("a"), hold("a", ("x", 10))])
    assert state.held({}) == {"x": 10}  # the early copy released nothing
    assert state.apply(released("a")) and state.held({}) == {}
    assert not state.apply(released("a"))  # from then on, a duplicate


def test_holds_are_counted_per_project() -> None:
    state = AdmissionState.of([hold("a", ("x", 10)), hold("b", ("y", 5), project="other")])
    assert state.held({}, "p") == {"x": 10} and state.held({}, "other") == {"y": 5}


@settings(max_examples=150, deadline=None, database=None)
@given(seed=st.integers(0, 10_000))
def test_the_indexes_agree_with_a_plain_recount(seed: int) -> None:
    rng = random.Random(seed)
    state = AdmissionState()
    jobs = [f"j{i}" for i in range(12)]
    charges = {j: rng.randrange(0, 400) for j in jobs}
    now = T
    for step in range(60):
        job = rng.choice(jobs)
        at = T + step * 10
        choice = rng.randrange(5)
        if choice == 0:
            state.apply(decided(job, at=at))
            state.apply(hold(job, ("a", rng.randrange(1, 200)), ("b", rng.randrange(1, 200))))
        elif choice == 1:
            state.observe(started(job, at))
        elif choice == 2:
            state.observe(preempted(job, at))
        elif choice == 3:
            state.observe(finished(job, at))
        else:
            state.apply(released(job))
        now = max(now, at + rng.randrange(0, 2 * DEADLINE))  # the service's clock never goes back
        plain = {j.job_id for j in state.jobs.values() if j.cluster == "c1" and j.holds_gpus(now, DEADLINE)}
        assert _ids(state, now) == plain
        recount: dict[str, int] = {}
        for h in state.holds.values():
            if not h.released:
                for allocation, units in h.remaining(
                    charges[h.job_id]
                    if state.jobs.get(h.job_id) and (state.jobs[h.job_id].last != (0, 0))
                    else 0
                ).items():
                    recount[allocation] = recount.get(allocation, 0) + units  # fmt: skip
        assert state.held(charges) == recount


def _view(state: AdmissionState, now: int) -> tuple[object, ...]:
    """What decisions read: GPUs in use on the cluster, units held, decisions and what is due."""
    return (_ids(state, now), state.held({}), dict(state.decisions), state.releasable(now, DEADLINE))


@pytest.mark.parametrize("seen_before", [False, True], ids=["a job seen first", "a job already running"])
def test_a_voided_decision_leaves_the_state_as_if_it_had_never_come(seen_before: bool) -> None:
    events = [decided("b"), hold("b", ("x", 10))]
    before = AdmissionState.of(
        [decided("a"), hold("a", ("x", 5))], [started("b", T - 5)] if seen_before else []
    )
    expected = _view(before, T + 10)
    tentative = before.apply_tentative(events)
    assert "b" in before.decisions and before.held({}) == {"x": 15}
    before.void(tentative)
    assert _view(before, T + 10) == expected
    assert _view(before, T + DEADLINE + 10) == _view(
        AdmissionState.of([decided("a"), hold("a", ("x", 5))], [started("b", T - 5)] if seen_before else []),
        T + DEADLINE + 10,
    )  # no start deadline of the voided admit left behind
    # The same events, decided afresh, count as if for the first time.
    assert all(before.apply(e) for e in events) and before.held({}) == {"x": 15}


def test_a_voided_decision_the_log_took_after_all_is_folded_again_as_the_log_has_it() -> None:
    log = [decided("a"), hold("a", ("x", 5))]
    events = [decided("b"), hold("b", ("x", 10))]
    live = AdmissionState.of(log, [])
    tentative = live.apply_tentative(events)
    live.void(tentative)
    assert live.redo(tentative)  # the acknowledgement came late, the records are valid
    replayed = AdmissionState.of([*log, *events], [])
    assert _view(live, T + 10) == _view(replayed, T + 10) and live.held({}) == {"x": 15}
    for at in (T + DEADLINE + 10, T + 3600 + DEADLINE + 10):  # its start deadline and hold expiry too
        assert _view(live, at) == _view(replayed, at)


def test_a_voided_decision_is_not_folded_again_over_a_new_decision_for_its_job() -> None:
    live = AdmissionState.of([], [])
    tentative = live.apply_tentative([decided("b"), hold("b", ("x", 10))])
    live.void(tentative)
    live.apply(
        decided("b").model_copy(update={"verdict": "reject", "lane": None})
    )  # asked again, decided anew
    assert not live.redo(tentative)
    assert live.decisions["b"].verdict == "reject" and live.held({}) == {}


def test_a_running_job_past_its_request_and_the_grace_has_overran() -> None:
    state = AdmissionState()
    state.apply(decided("a"))  # asks for 3600 s
    [admitted] = state.load_on("c1", T + 10, DEADLINE).jobs
    assert admitted.requested_seconds == 3600 and admitted.overrun_s(T + 10 * 3600, 0) is None  # not started
    state.observe(started("a", T + 60))
    [running] = state.load_on("c1", T + 100, DEADLINE).jobs
    grace = 900
    assert running.overrun_s(T + 60 + 3600 + grace, grace) is None  # at the limit: not yet
    assert running.overrun_s(T + 60 + 3600 + grace + 7, grace) == 7
