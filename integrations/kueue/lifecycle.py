"""A Kueue-managed Job's life as the platform's job events: pure functions of the Job (as the
job controller and kubelet write its status) and its Workload, tested directly.

A run starts at the Job's `status.startTime` (JobSubmitted once, JobStarted per run) and ends at
its completion (`Complete`: succeeded, `Failed`: failed; JobFinished at `completionTime` or the
condition's transition), or when Kueue suspends it again (evicted, preempted: JobPreempted at the
Workload's `Evicted` transition). The job controller clears `startTime` when a Job is suspended,
so the controller keeps each run's start on the Job itself (the annotation RUN_STARTED): a run
ended while the controller was away is still closed at its start when it comes back. A run ends by
preemption at the Job's `Suspended` condition (the job controller's), else at the Workload's
`Evicted` transition. A Job
deleted while it ran is cancelled then.

Event ids are deterministic per job id and run (`kueue-<workload uid>:<run start>:started`, ...),
so events sent twice, by a restarted controller or a resync, are one event to the platform: the
ledger charges (end - start) x GPUs of each run, what the same run costs from Slurm. A run ended by
preemption counts on the Job (PREEMPTIONS): the next run is admitted, and charged, as a new job
(integrations/kueue/workloads.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from allmende.integrations.kueue.workloads import (
    PREEMPTIONS,
    Ask,
    Obj,
    condition,
    instant,
    is_true,
    kueue_job_id,
    preemptions,
)
from allmende.schemas.events import (
    FinishStatus,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    PriorityClass,
)

RUN_STARTED = "allmende.io/run-started-at"  # the Job's annotation: its current run's start (UTC s)

JobEvent = JobSubmitted | JobStarted | JobFinished | JobPreempted


@dataclass(frozen=True)
class RunState:
    """A Job's run as its status tells it."""

    started_at: int | None  # the current run's start (status.startTime), while not suspended
    recorded: int | None  # the run start kept on the Job (RUN_STARTED)
    finished: tuple[FinishStatus, int] | None  # how and when the Job ended

    @property
    def run_start(self) -> int | None:
        return self.started_at or self.recorded


def run_state(job: Obj) -> RunState:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    recorded = annotations.get(RUN_STARTED)
    finished: tuple[FinishStatus, int] | None = None
    for kind, outcome in (("Complete", FinishStatus.SUCCEEDED), ("Failed", FinishStatus.FAILED)):
        if is_true(job, kind):
            c = condition(job, kind) or {}
            end = instant(status.get("completionTime") if kind == "Complete" else None)
            end = end or instant(c.get("lastTransitionTime"))
            if end is not None:
                finished = (outcome, end)
    started = None if spec.get("suspend") else instant(status.get("startTime"))
    return RunState(started, int(recorded) if recorded and str(recorded).isdigit() else None, finished)


@dataclass(frozen=True)
class Plan:
    """The events a Job's state calls for, in order, and the Job's annotations to set after them
    (None: remove it)."""

    events: list[JobEvent]
    annotations: dict[str, str | None]


def _submitted(ask: Ask, at: int, producer: str) -> JobSubmitted:
    return JobSubmitted(
        event_id=f"{ask.job_id}:submitted", occurred_at=at, producer=producer, job_id=ask.job_id,
        project=ask.project, user=ask.user, cluster=ask.cluster, gpu_type=ask.gpu_type, gpus=ask.gpus,
        priority_class=PriorityClass(ask.priority_class), interactive=ask.interactive,
        requested_seconds=ask.requested_seconds,
    )  # fmt: skip


def _started(ask: Ask, at: int, producer: str) -> list[JobEvent]:
    started = JobStarted(
        event_id=f"{ask.job_id}:{at}:started",
        occurred_at=at,
        gpus=ask.gpus,
        producer=producer,
        job_id=ask.job_id,
    )
    return [_submitted(ask, at, producer), started]


def _preempted(ask: Ask, start: int, at: int, producer: str) -> JobPreempted:
    return JobPreempted(
        event_id=f"{ask.job_id}:{start}:preempted", occurred_at=max(at, start), started_at=start,
        reason="evicted by Kueue (preempted, or its admission check asked to retry)", producer=producer,
        job_id=ask.job_id,
    )  # fmt: skip


def _ended(ask: Ask, start: int, end: int, status: FinishStatus, producer: str) -> JobFinished:
    return JobFinished(
        event_id=f"{ask.job_id}:{start}:finished", occurred_at=max(end, start), started_at=start,
        status=status, producer=producer, job_id=ask.job_id,
    )  # fmt: skip


def plan(ask: Ask, workload_uid: str, job: Obj, evicted_at: int | None, now: int, producer: str) -> Plan:
    """The events of the Job's life so far (every one of them: the caller sends what it has not).
    `ask` is the workload's request under its current job id (PREEMPTIONS runs preempted so far)."""
    state = run_state(job)
    n = preemptions(job)
    evicted_at = suspended_at(job) or evicted_at  # the job controller's record is the closer one
    after = replace(ask, job_id=kueue_job_id(workload_uid, n + 1))  # the request after one more preemption
    if state.finished is not None:
        start = state.run_start
        if start is None:
            return Plan([], {})  # never ran (failed before a pod started): nothing to charge
        status, end = state.finished
        return Plan([*_started(ask, start, producer), _ended(ask, start, end, status, producer)], {})
    if state.started_at is not None:
        if state.recorded is not None and state.recorded != state.started_at:
            # a run ended while we were away and another began: the first closed where it stopped
            at = min(evicted_at or state.started_at, state.started_at)
            events = [*_started(ask, state.recorded, producer), _preempted(ask, state.recorded, at, producer)]
            marks: dict[str, str | None] = {RUN_STARTED: str(state.started_at), PREEMPTIONS: str(n + 1)}
            return Plan([*events, *_started(after, state.started_at, producer)], marks)
        return Plan(_started(ask, state.started_at, producer), {RUN_STARTED: str(state.started_at)})
    if state.recorded is not None:  # suspended again (evicted): the run is over; the next is a new request
        events = [
            *_started(ask, state.recorded, producer),
            _preempted(ask, state.recorded, evicted_at or now, producer),
        ]
        return Plan(events, {RUN_STARTED: None, PREEMPTIONS: str(n + 1)})
    return Plan([], {})


def plan_deleted(ask: Ask, job: Obj, now: int, producer: str, admitted: bool = False) -> list[JobEvent]:
    """A Job deleted (its last state): a run still going is cancelled now. One `admitted` that never
    ran is closed too, as cancelled at once (no GPU-second): else the platform would keep its GPUs
    reserved for it until its start deadline."""
    state = run_state(job)
    start = state.run_start
    if state.finished is not None:
        return []
    if start is None:
        if not admitted:
            return []
        return [_submitted(ask, now, producer), _ended(ask, now, now, FinishStatus.CANCELLED, producer)]
    return [*_started(ask, start, producer), _ended(ask, start, now, FinishStatus.CANCELLED, producer)]


def suspended_at(job: Obj) -> int | None:
    """When the Job was last suspended (the job controller's `Suspended` condition)."""
    c = condition(job, "Suspended")
    return instant(c.get("lastTransitionTime")) if c is not None and c.get("status") == "True" else None


def evicted_at(workload: Obj) -> int | None:
    """When Kueue last evicted the workload (its `Evicted` condition turned true)."""
    c = condition(workload, "Evicted")
    return instant(c.get("lastTransitionTime")) if c is not None and c.get("status") == "True" else None
