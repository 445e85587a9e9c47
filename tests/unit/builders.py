"""Event and entry builders shared by the unit tests (times are offsets from T0)."""

from __future__ import annotations

from allmende.schemas.events import (
    FinishStatus,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    PriorityClass,
)
from allmende.schemas.ledger import LedgerEntry

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z, any instant inside the contract's bounds
JOB = "job-1"
PRODUCER = "unit-test"


def submitted(
    gpus: int = 2, *, at: int = -10, event_id: str = "sub", job: str = JOB, project: str = "proj-a",
    user: str = "alice", cluster: str = "c1", gpu_type: str = "A100",
    priority_class: PriorityClass = PriorityClass.STANDARD, interactive: bool = False,
) -> JobSubmitted:  # fmt: skip
    return JobSubmitted(
        event_id=event_id, occurred_at=T0 + at, producer=PRODUCER, job_id=job, project=project,
        user=user, cluster=cluster, gpu_type=gpu_type, gpus=gpus, priority_class=priority_class,
        interactive=interactive, requested_seconds=3600,
    )  # fmt: skip


def started(at: int, gpus: int, event_id: str, *, job: str = JOB) -> JobStarted:
    return JobStarted(event_id=event_id, occurred_at=T0 + at, producer=PRODUCER, job_id=job, gpus=gpus)


def sample(at: int, gpus: int, event_id: str, *, job: str = JOB, utilization: float = 0.5) -> JobUsageSample:
    return JobUsageSample(
        event_id=event_id, occurred_at=T0 + at, producer=PRODUCER, job_id=job, gpus_in_use=gpus,
        gpu_utilization=utilization,
    )  # fmt: skip


def preempted(at: int, event_id: str, *, started_at: int | None = None, job: str = JOB) -> JobPreempted:
    return JobPreempted(
        event_id=event_id, occurred_at=T0 + at, producer=PRODUCER, job_id=job, reason="higher priority",
        started_at=None if started_at is None else T0 + started_at,
    )  # fmt: skip


def finished(
    at: int, event_id: str, *, started_at: int | None = None, job: str = JOB,
    status: FinishStatus = FinishStatus.SUCCEEDED,
) -> JobFinished:  # fmt: skip
    return JobFinished(
        event_id=event_id, occurred_at=T0 + at, producer=PRODUCER, job_id=job, status=status,
        started_at=None if started_at is None else T0 + started_at,
    )  # fmt: skip


def entry(
    *, version: int, start: int, end: int, gpus: int, entry_id: str = "e1", job: str = JOB,
) -> LedgerEntry:  # fmt: skip
    return LedgerEntry(
        entry_id=entry_id, job_id=job, version=version, interval_start=start, interval_end=end,
        gpus=gpus, project="proj-a", user="alice", cluster="c1", gpu_type="A100",
        priority_class="standard", interactive=False, source_event_id=f"{entry_id}-src",
    )  # fmt: skip
