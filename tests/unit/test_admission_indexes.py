"""The incremental indexes of the admission state agree with a recount from scratch.

`ClusterLoad` keeps its sums as jobs come and go, and `AdmissionState.releasable` reads heaps and
sets instead of every active hold: each is checked against the plain, slow version it replaced.
"""

from __future__ import annotations

from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.admission_model import ClusterLoad, Lane, RunningJob
from allmende.domain.admission_state import AdmissionState
from allmende.schemas.admission_events import AdmissionDecided, HoldPlaced, HoldReleased
from allmende.schemas.events import FinishStatus, JobFinished, JobPreempted, JobStarted

T = 1_800_000_000
DEADLINE = 600
IDS = [f"j{i}" for i in range(4)]  # a small pool: ids come back, replace and pop each other
USERS, PROJECTS, CLUSTERS = ["ada", "bob"], ["p", "q"], ["c1", "c2"]
lanes = st.sampled_from([None, *Lane])


def check_sums(load: ClusterLoad, jobs: list[RunningJob]) -> None:
    """The load's sums are those of `jobs`, counted the slow way."""
    assert load.used_gpus == sum(j.gpus for j in jobs)
    for p in PROJECTS:
        assert load.time_slice_gpus(p) == sum(
            j.gpus for j in jobs if j.project == p and j.lane is Lane.TIME_SLICE
        )
    for u in USERS:
        interactive = [j for j in jobs if j.user == u and (j.interactive or j.lane is Lane.INTERACTIVE)]
        assert load.interactive_gpus(u) == sum(j.gpus for j in interactive)


running_jobs = st.builds(
    RunningJob, job_id=st.sampled_from(IDS), project=st.sampled_from(PROJECTS), user=st.sampled_from(USERS),
    gpus=st.integers(1, 16), priority_class=st.just("standard"), lane=lanes, since=st.just(T),
    interactive=st.booleans(),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(running_jobs, st.sampled_from(IDS)), max_size=40))
def test_a_cluster_load_sums_what_a_plain_dict_holds(ops: list[RunningJob | str]) -> None:
    load, plain = ClusterLoad(), dict[str, RunningJob]()
    for op in ops:  # a job is put (replacing one with its id), an id is popped
        if isinstance(op, str):
            assert load.pop(op) == plain.pop(op, None)
        else:
            load.put(op)
            plain[op.job_id] = op
        assert len(load) == len(plain) and all((i in load) == (i in plain) for i in IDS)
        assert sorted(load.jobs, key=lambda j: j.job_id) == sorted(plain.values(), key=lambda j: j.job_id)
        check_sums(load, list(plain.values()))
    assert load == ClusterLoad(plain.values())  # built at once or step by step: the same load


def releasable_by_scan(state: AdmissionState, now: int, deadline: int) -> list[tuple[str, str]]:
    """`releasable` as it was before the indexes: every active hold looked at, by job id."""
    due = []
    for job_id, hold in sorted(state.holds.items()):
        if hold.released:
            continue
        job = state.jobs.get(job_id)
        if job is not None and job.finished:
            due.append((job_id, "finished"))
        elif job is not None and job.last[1] == 1:  # preempted: `_PREEMPTED` in the module
            due.append((job_id, "preempted"))
        elif now >= hold.expires_at or (job is not None and not job.holds_gpus(now, deadline)):
            due.append((job_id, "expired"))
    return due


# One step of the service: an admission (decision and hold at the clock's now; the same job again
# is a duplicate, as the service answers it), a job event from the scheduler (at its own time, maybe
# behind or ahead of the clock), a hold released by hand, or a look after the clock moved on: at
# occupancy, or at the releasable holds, releasing them (as the service does) or not.
JOBS = [f"j{i}" for i in range(10)]  # fresh jobs keep coming in a long run
spans = st.sampled_from([0, 1, DEADLINE - 1, DEADLINE, DEADLINE + 1, 2 * DEADLINE])  # seconds, at the edges
admission = st.fixed_dictionaries(
    {"lane": lanes, "interactive": st.booleans(), "user": st.sampled_from(USERS),
     "project": st.sampled_from(PROJECTS), "cluster": st.sampled_from(CLUSTERS), "gpus": st.integers(1, 8)}
)  # fmt: skip
expiries = spans.map(lambda s: 2 * s)  # after the admission: within the start deadline or well past it
admit = st.tuples(st.just("admit"), st.sampled_from(JOBS), expiries, admission)
job_event = st.tuples(
    st.sampled_from(["start", "preempt", "finish"]), st.sampled_from(JOBS), spans.map(lambda s: s - DEADLINE),
    st.integers(1, 8),
)  # fmt: skip
unhold = st.tuples(st.just("unhold"), st.sampled_from(JOBS))
look = st.tuples(st.sampled_from(["load", "release", "release+apply"]), spans)
# Long runs: a discrepancy needs a job admitted, looked at, started and looked at again.
steps = st.lists(st.one_of(admit, job_event, job_event, look, look, unhold), min_size=20, max_size=60)

DECIDED = AdmissionDecided(
    event_id="-", occurred_at=T, actor="sched", job_id="-", project="p", user="ada", cluster="c1",
    gpu_type="H100", gpus=1, priority_class="standard", interactive=False, requested_seconds=3600,
    verdict="admit", lane=None, reasons=(), rate=1, expected_units=0, available_before_units=0,
    available_after_units=0, fairshare_factor=0.5,
)  # fmt: skip


def release(event_id: str, job: str, now: int, reason: str) -> HoldReleased:
    return HoldReleased.model_validate(
        {"event_id": event_id, "occurred_at": now, "actor": "sched", "job_id": job, "reason": reason}
    )


@settings(max_examples=800, deadline=None)
@given(steps)
def test_releasable_and_load_agree_with_a_scan(steps: list[tuple[object, ...]]) -> None:
    state, now, ids = AdmissionState(), T, count()
    reported: set[str] = set()  # holds `releasable` returned that nobody released since
    for step in steps:
        match step:
            case ("admit", str(job), int(expires), dict(fields)):
                update = {**fields, "event_id": f"decision:{job}", "job_id": job, "occurred_at": now}
                state.apply(DECIDED.model_copy(update=update))
                state.apply(HoldPlaced(event_id=f"hold:{job}", occurred_at=now, actor="sched", job_id=job,
                                       project=fields["project"], allocations=(("a", 10),),
                                       expires_at=now + expires))  # fmt: skip
            case ("start", str(job), int(offset), int(gpus)):
                state.observe(JobStarted(event_id=f"e{next(ids)}", occurred_at=now + offset, producer="t",
                                         job_id=job, gpus=gpus))  # fmt: skip
            case ("preempt", str(job), int(offset), _):
                state.observe(JobPreempted(event_id=f"e{next(ids)}", occurred_at=now + offset, producer="t",
                                           job_id=job, reason="x"))  # fmt: skip
            case ("finish", str(job), int(offset), _):
                state.observe(JobFinished(event_id=f"e{next(ids)}", occurred_at=now + offset, producer="t",
                                          job_id=job, status=FinishStatus.SUCCEEDED))  # fmt: skip
            case ("unhold", str(job)):
                state.apply(release(f"r{next(ids)}", job, now, "expired"))
                reported.discard(job)
            case ("load", int(dt)):
                now += dt  # the service's clock never goes back
                for cluster in CLUSTERS:
                    load = state.load_on(cluster, now, DEADLINE)
                    check_sums(load, list(load.jobs))
                    holding = [
                        j for j in state.jobs.values() if j.cluster == cluster and j.holds_gpus(now, DEADLINE)
                    ]
                    assert {j.job_id: j for j in load.jobs} == {j.job_id: j.as_running() for j in holding}
            case (str(what), int(dt)):
                now += dt
                due, scan = state.releasable(now, DEADLINE), releasable_by_scan(state, now, DEADLINE)
                assert state.releasable(now, DEADLINE) == due  # a read: asking again changes nothing
                # Exactly what the scan finds, unless holds found due before were left unreleased:
                # those stay due ("expired", as the docstring says) even if their job started since.
                assert due == scan if not reported else set(scan) <= set(due)
                assert set(due) - set(scan) <= {(job, "expired") for job in reported}
                # What it reads next time is about active holds only: released ones are not kept
                # (a long run's released holds made every read walk all of them).
                active = {job for job, hold in state.holds.items() if not hold.released}
                assert state._ended | state._due.keys() <= active
                reported |= {job for job, _ in due}
                if what == "release+apply":  # the service: then `due == scan`, nothing is left over
                    for job, reason in due:
                        state.apply(release(f"r{next(ids)}", job, now, reason))
                    reported.clear()
