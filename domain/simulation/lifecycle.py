"""The job events a simulated run produces (the real contracts of schemas/events.py).

Event ids are fixed by the run id, the job, the run number and the event's kind
(`sim:<run>:<job>:<run#>:started`), so a replayed simulation publishes the same ids and the
meter and ledger treat a redelivery as a duplicate, never as new usage.
"""

from __future__ import annotations

from allmende.domain.simulation.model import SimJob
from allmende.schemas.events import (
    FinishStatus,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)

PRODUCER = "allmende-sim"
MAX_REASON_CHARS = 500  # the contract's limit on a preemption reason


def _prefix(run_id: str, job_id: str) -> str:
    return f"sim:{run_id}:{job_id}"


def submitted(run_id: str, job: SimJob) -> JobSubmitted:
    request = job.request()
    return JobSubmitted(
        event_id=f"{_prefix(run_id, job.job_id)}:submitted",
        occurred_at=job.submit_at,
        producer=PRODUCER,
        job_id=job.job_id,
        project=job.project,
        user=job.user,
        cluster=job.cluster,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        priority_class=job.priority_class,
        interactive=job.interactive,
        requested_seconds=request.requested_seconds,
    )


def started(run_id: str, job: SimJob, run_no: int, at: int, hosts: tuple[str, ...]) -> JobStarted:
    return JobStarted(
        event_id=f"{_prefix(run_id, job.job_id)}:{run_no}:started",
        occurred_at=at,
        producer=PRODUCER,
        job_id=job.job_id,
        gpus=job.gpus,
        hosts=hosts,
    )


def sample(run_id: str, job: SimJob, run_no: int, at: int, utilization: float) -> JobUsageSample:
    return JobUsageSample(
        event_id=f"{_prefix(run_id, job.job_id)}:{run_no}:sample:{at}",
        occurred_at=at,
        producer=PRODUCER,
        job_id=job.job_id,
        gpus_in_use=job.gpus,
        gpu_utilization=utilization,
    )


def preempted(run_id: str, job: SimJob, run_no: int, at: int, started_at: int, reason: str) -> JobPreempted:
    return JobPreempted(
        event_id=f"{_prefix(run_id, job.job_id)}:{run_no}:preempted",
        occurred_at=at,
        producer=PRODUCER,
        job_id=job.job_id,
        started_at=started_at,
        reason=(reason or "preempted")[:MAX_REASON_CHARS],
    )


def finished(run_id: str, job: SimJob, run_no: int, at: int, started_at: int) -> JobFinished:
    return JobFinished(
        event_id=f"{_prefix(run_id, job.job_id)}:{run_no}:finished",
        occurred_at=at,
        producer=PRODUCER,
        job_id=job.job_id,
        started_at=started_at,
        status=job.status,
    )


def cancelled(run_id: str, job: SimJob, at: int) -> JobFinished:
    """A rejected job: it ends without a run, so the meter charges it nothing."""
    return JobFinished(
        event_id=f"{_prefix(run_id, job.job_id)}:cancelled",
        occurred_at=at,
        producer=PRODUCER,
        job_id=job.job_id,
        status=FinishStatus.CANCELLED,
    )
