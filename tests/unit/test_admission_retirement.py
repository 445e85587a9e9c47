"""Admission lets go of ended jobs after the retention period: memory holds what is live."""

from __future__ import annotations

from allmende.domain.admission_state import AdmissionState
from allmende.schemas.admission_events import HoldReleased
from tests.unit.test_admission_state import DEADLINE, T, _ids, decided, finished, hold, preempted, started

R = 3600  # the retention in these tests


def _state() -> AdmissionState:
    return AdmissionState(retention_s=R)


def _released(job: str, at: int, reason: str = "finished") -> HoldReleased:
    return HoldReleased(event_id=f"release:{job}:1", occurred_at=at, actor="sched", job_id=job, reason=reason)


def _held(state: AdmissionState, job: str) -> bool:
    return job in state.jobs or job in state.decisions or job in state.holds or job in state._seen


def test_an_ended_job_goes_one_retention_after_its_last_event_and_not_before() -> None:
    state = _state()
    state.apply(decided("a", at=T))
    state.apply(hold("a", ("alloc", 100)))
    state.observe(started("a", T + 10))
    state.observe(finished("a", T + 500))
    # Its hold is still held: it stays, whatever the time.
    assert state.retire(T + 10 * R, DEADLINE) == []
    state.apply(_released("a", T + 501))
    assert state.retire(T + 501 + R - 1, DEADLINE) == []
    assert _held(state, "a")
    assert state.retire(T + 501 + R, DEADLINE) == ["a"]
    assert not _held(state, "a") and "a" not in state.preempted


def test_a_running_job_is_never_let_go_of() -> None:
    state = _state()
    state.apply(decided("run", at=T))
    state.observe(started("run", T + 10))
    assert state.retire(T + 100 * R, DEADLINE) == []
    assert {j.job_id for j in state.load_on("c1", T + 100 * R, DEADLINE).jobs} == {"run"}


def test_a_reservation_that_never_started_goes_after_its_start_deadline_and_the_retention() -> None:
    state = _state()
    state.apply(decided("idle", at=T))
    assert state.retire(T + DEADLINE + R - 1, DEADLINE) == []
    assert state.retire(T + DEADLINE + R, DEADLINE) == ["idle"]


def test_a_queued_or_rejected_decision_goes_when_not_asked_again() -> None:
    state = _state()
    queued = {"verdict": "queue", "lane": None}
    state.apply(decided("q", at=T).model_copy(update=queued))
    state.apply(decided("r", at=T + 5).model_copy(update={"verdict": "reject", "lane": None}))
    again = {**queued, "attempt": 2, "event_id": "decision:q:2"}
    state.apply(decided("q", at=T + 100).model_copy(update=again))
    assert state.retire(T + 5 + R, DEADLINE) == ["r"]
    assert state.retire(T + 100 + R, DEADLINE) == ["q"]
    assert state.decisions == {}


def test_a_late_copy_of_a_retired_jobs_start_cannot_bring_it_back_as_running() -> None:
    state = _state()
    state.apply(decided("old", at=T))
    state.observe(started("old", T + 10), partition=1)
    state.observe(finished("old", T + 100), partition=1)
    assert state.retire(T + 100 + R, DEADLINE) == ["old"]
    assert state.observe(started("old", T + 10), partition=1) is False
    assert "old" not in state.jobs
    assert _ids(state, T + 100 + R) == set()
    # A new job's events are newer than the last event of any job let go of: folded as ever, on
    # any partition; and on another partition nothing was let go of.
    state.apply(decided("other", at=T + 100 + R))
    assert state.observe(started("other", T + 100 + R), partition=1) is True
    assert state.observe(started("new", T + 20), partition=2) is True
    assert _ids(state, T + 100 + R) == {"other"}


def test_a_preempted_job_waiting_to_start_again_stays_for_the_retention() -> None:
    state = _state()
    state.apply(decided("p", at=T))
    state.observe(started("p", T + 10))
    state.observe(preempted("p", T + 50))
    assert state.retire(T + 49 + R, DEADLINE) == []
    assert "p" in state.preempted
    state.observe(started("p", T + 60))  # it ran again: running jobs stay
    assert state.retire(T + 60 + 5 * R, DEADLINE) == []


def test_without_a_retention_nothing_goes() -> None:
    state = AdmissionState()
    state.apply(decided("a", at=T))
    state.observe(finished("a", T + 1))
    assert state.retire(T + 10**9, DEADLINE) == []
    assert state.observe(started("a", T), partition=0) is True


def test_a_copy_of_a_decision_after_retirement_folds_as_new_and_goes_again() -> None:
    """The admission log holds each event once; a replay that lets go of jobs as it goes ends
    where the live state did."""
    state = _state()
    state.apply(decided("a", at=T))
    state.observe(finished("a", T + 1))
    assert state.retire(T + DEADLINE + R, DEADLINE) == ["a"]
    assert state.retire(T + 10 * R, DEADLINE) == []
    assert state._retire_at == []


def test_the_heaps_do_not_grow_with_jobs_let_go_of() -> None:
    state = _state()
    for n in range(5000):
        job, at = f"j{n}", T + n
        state.apply(decided(job, at=at).model_copy(update={"event_id": f"decision:{job}:1"}))
        state.apply(hold(job, ("alloc", 1)).model_copy(update={"event_id": f"hold:{job}:1"}))
        state.observe(started(job, at + 1))
        state.observe(finished(job, at + 2))
        state.apply(_released(job, at + 2).model_copy(update={"event_id": f"release:{job}:1"}))
        state.retire(at + 2, DEADLINE)
    assert len(state.jobs) < 2 * R and len(state.decisions) < 2 * R
    for heap in (state._start_deadlines, state._expiries, state._retire_at):
        assert len(heap) <= 2 * (len(state.jobs) + len(state.decisions) + 1024)
