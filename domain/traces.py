"""Real cluster traces -> job lifecycle events (pure: CSV rows in, events out; the files are read by
`allmende.core.trace_files`).

Formats (see ../shared/data/traces/README.md):
- elasticflow: `job_id,submission_time,duration,num_gpu`, one CSV per cluster (plain or inside
  `raw-traces.tar.gz`). No users: each cluster file is one project and one user
  (`ef-<cluster>`). Start = submission (the trace has no queueing delay).
- philly, helios: `u_id,user,gpu_num,...,interval,run_time,...,new_status`; submission times
  are the running sum of `interval`. Users are mapped to one of PROJECTS_PER_TRACE projects by a
  stable hash: project = `<format>-team-<blake2b(user) mod 16, two digits>`. Rows without GPUs
  (Helios CPU jobs) are skipped and counted.

Relative trace times are placed on a fixed UTC epoch per format (the trace's collection start),
so a replay is the same every time. Events get deterministic ids `<job>:<kind>:<n>`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from allmende.schemas.events import (
    FinishStatus,
    JobEvent,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    PriorityClass,
)

PROJECTS_PER_TRACE = 16
PRODUCER = "allmende-replay"


class TraceFormat(StrEnum):
    ELASTICFLOW = "elasticflow"
    PHILLY = "philly"
    HELIOS = "helios"


# Collection start of each trace, as UTC Unix seconds.
EPOCHS = {
    TraceFormat.ELASTICFLOW: 1_614_816_000,  # 2021-03-04T00:00:00Z
    TraceFormat.PHILLY: 1_501_545_600,  # 2017-08-01T00:00:00Z
    TraceFormat.HELIOS: 1_585_699_200,  # 2020-04-01T00:00:00Z
}
GPU_TYPES = {
    TraceFormat.ELASTICFLOW: "V100",
    TraceFormat.PHILLY: "P100",
    TraceFormat.HELIOS: "V100",
}
_STATUS = {"Pass": FinishStatus.SUCCEEDED, "Failed": FinishStatus.FAILED, "Killed": FinishStatus.CANCELLED}


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    project: str
    user: str
    cluster: str
    gpu_type: str
    gpus: int
    submit_at: int
    start_at: int
    duration_s: int
    status: FinishStatus
    utilization: float = 1.0  # every usage sample's GPU utilisation (the traces carry none)

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * self.duration_s


@dataclass
class TraceStats:
    rows: int = 0
    skipped_no_gpu: int = 0


def project_for_user(fmt: TraceFormat, user: str) -> str:
    bucket = int.from_bytes(hashlib.blake2b(user.encode(), digest_size=8).digest(), "big")
    return f"{fmt.value}-team-{bucket % PROJECTS_PER_TRACE:02d}"


def trace_jobs(
    sources: Iterable[tuple[str, Iterable[Mapping[str, str]]]],
    fmt: TraceFormat,
    limit: int | None = None,
    stats: TraceStats | None = None,
) -> Iterator[TraceJob]:
    """Jobs of a trace in file order, from each CSV's name (the cluster, for ElasticFlow) and rows."""
    stats = stats if stats is not None else TraceStats()
    epoch, gpu_type = EPOCHS[fmt], GPU_TYPES[fmt]
    emitted = 0
    for name, rows in sources:
        submitted = 0
        for row in rows:
            if limit is not None and emitted >= limit:
                return
            stats.rows += 1
            if fmt is TraceFormat.ELASTICFLOW:
                at = epoch + int(row["submission_time"])
                job = TraceJob(
                    job_id=f"ef-{name}-{row['job_id']}",
                    project=f"ef-{name}",
                    user=f"ef-{name}",
                    cluster=f"ef-{name}",
                    gpu_type=gpu_type,
                    gpus=int(row["num_gpu"]),
                    submit_at=at,
                    start_at=at,
                    duration_s=int(row["duration"]),
                    status=FinishStatus.SUCCEEDED,
                )
            else:
                submitted += int(row["interval"])
                gpus = int(row["gpu_num"])
                if gpus <= 0:
                    stats.skipped_no_gpu += 1
                    continue
                user = f"{fmt.value}-u{row['user']}"
                at = epoch + submitted
                job = TraceJob(
                    job_id=f"{fmt.value}-{row['u_id']}",
                    project=project_for_user(fmt, user),
                    user=user,
                    cluster=fmt.value,
                    gpu_type=gpu_type,
                    gpus=gpus,
                    submit_at=at,
                    start_at=at,
                    duration_s=int(row["run_time"]),
                    status=_STATUS.get(row["new_status"], FinishStatus.FAILED),
                )
            if job.gpus <= 0 or job.duration_s < 0:
                stats.skipped_no_gpu += 1
                continue
            emitted += 1
            yield job


def job_events(job: TraceJob, sample_every_s: int) -> Iterator[JobEvent]:
    """Submitted, Started, a usage sample every `sample_every_s` of run time, Finished."""
    if sample_every_s <= 0:
        raise ValueError("sample interval must be positive")
    common = {"producer": PRODUCER, "job_id": job.job_id}
    yield JobSubmitted(
        event_id=f"{job.job_id}:submitted",
        occurred_at=job.submit_at,
        project=job.project,
        user=job.user,
        cluster=job.cluster,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        priority_class=PriorityClass.STANDARD,
        requested_seconds=max(1, job.duration_s),
        **common,
    )
    yield JobStarted(event_id=f"{job.job_id}:started", occurred_at=job.start_at, gpus=job.gpus, **common)
    end = job.start_at + job.duration_s
    n = 1
    while job.start_at + n * sample_every_s < end:
        yield JobUsageSample(
            event_id=f"{job.job_id}:sample:{n}",
            occurred_at=job.start_at + n * sample_every_s,
            gpus_in_use=job.gpus,
            gpu_utilization=job.utilization,
            **common,
        )
        n += 1
    yield JobFinished(
        event_id=f"{job.job_id}:finished",
        occurred_at=end,
        status=job.status,
        started_at=job.start_at,
        **common,
    )


PLACEHOLDER_UTILIZATION = (0.0, 0.04)  # an idle placeholder's utilisation: under the 5 % threshold


def seeded_unit(*parts: object) -> float:
    """A number in [0, 1) from `parts` alone (a seed, the kind of choice, a job or user id): the
    same job is chosen whatever the order, the limit or the other jobs of a run."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _unit(seed: int, job_id: str, what: str) -> float:
    return seeded_unit(seed, what, job_id)


def with_idle_placeholders(jobs: Iterable[TraceJob], share: float, seed: int = 0) -> Iterator[TraceJob]:
    """Make `share` of the jobs idle placeholders (squatters): their samples report a utilisation
    in PLACEHOLDER_UTILIZATION, rounded to whole percent; the other jobs run at 100 %. A trace
    records no utilisation, so this is how a replay shows what idle GPUs cost."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"idle share must be between 0 and 1, got {share}")
    low, high = PLACEHOLDER_UTILIZATION
    for job in jobs:
        if share > 0 and _unit(seed, job.job_id, "idle") < share:
            utilization = round(low + (high - low) * _unit(seed, job.job_id, "utilization"), 2)
            job = replace(job, utilization=utilization)
        yield job
