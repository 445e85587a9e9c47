"""What the simulator works on and what it records (no behaviour beyond small derivations).

Times are integer UTC Unix seconds of the simulation's clock; GPU time is integer GPU-seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from allmende.domain.admission_model import JobRequest, Lane
from allmende.schemas.events import FinishStatus, PriorityClass

TOP_CLASS = PriorityClass.NON_PREEMPTIBLE


class SimulationError(RuntimeError):
    """A broken invariant of the simulation (a bug in the engine or a policy): never data."""


@dataclass(frozen=True, slots=True)
class ClusterSize:
    name: str
    gpus: int
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a simulated workload: a trace job with the behaviours applied.

    `duration_s` is the work the job needs (seconds of running on healthy hosts);
    `requested_seconds` what its user asks for (the scheduler's limit, the platform's hold).
    `placeholder` and `utilization` are hidden from policies: they describe what the user does,
    not what the scheduler is told.
    """

    job_id: str
    project: str
    user: str
    cluster: str
    gpu_type: str
    gpus: int
    submit_at: int
    duration_s: int
    priority_class: PriorityClass = PriorityClass.STANDARD
    interactive: bool = False
    placeholder: bool = False
    utilization: float = 1.0
    status: FinishStatus = FinishStatus.SUCCEEDED  # how the job ends when its work is done
    requested_seconds: int | None = None  # None: the duration (the user knew it)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"job {self.job_id} needs at least one GPU, got {self.gpus}")
        if self.duration_s < 0:
            raise ValueError(f"job {self.job_id} has a negative duration {self.duration_s}")
        if not 0.0 <= self.utilization <= 1.0:
            raise ValueError(f"job {self.job_id} has utilisation {self.utilization} outside 0..1")

    def request(self) -> JobRequest:
        """What a scheduler would send to admission: no placeholder flag, no true duration."""
        # The event contract needs 1 s .. 366 days; a trace may hold 0 s or multi-year jobs.
        requested = self.duration_s if self.requested_seconds is None else self.requested_seconds
        return JobRequest(
            job_id=self.job_id,
            project=self.project,
            user=self.user,
            cluster=self.cluster,
            gpu_type=self.gpu_type,
            gpus=self.gpus,
            priority_class=self.priority_class.value,
            interactive=self.interactive,
            requested_seconds=min(366 * 86_400, max(1, requested)),
        )


@dataclass(frozen=True, slots=True)
class HostFailure:
    """`host` of `cluster` goes bad at `at`; it comes back at `recover_at` (None: never)."""

    cluster: str
    host: str
    at: int
    recover_at: int | None = None

    def __post_init__(self) -> None:
        if self.recover_at is not None and self.recover_at <= self.at:
            raise ValueError(f"host {self.host} recovers at {self.recover_at}, not after {self.at}")


# -- a policy's answers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Start the job now, after preempting `victims` (sim job ids, in the order given)."""

    victims: tuple[str, ...] = ()
    reason: str = ""
    lane: Lane | None = None  # shown to later decisions in the running jobs (platform lanes)


@dataclass(frozen=True, slots=True)
class Queue:
    """Leave the job queued. `wait_for_free_gpus` is a promise that lets the engine skip asking
    again: the answer stays Queue while the cluster has fewer free GPUs on healthy hosts than that
    (0: no promise, ask at every pass). A long queue costs a decision per job and pass otherwise."""

    reason: str
    wait_for_free_gpus: int = 0
    # Whether GPUs the policy could reclaim (`Policy.reclaimable_gpus`: squatters) count as free
    # for the promise: a job that may preempt them is asked again when they appear.
    reclaimable_counts: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """The job will never run: it ends as cancelled (a JobFinished without a run)."""

    reason: str


Outcome = Start | Queue | Reject


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop (preempt and requeue) the job's current run at `at` (>= now), for `reason`."""

    job_id: str
    at: int
    reason: str


# -- the engine's records -----------------------------------------------------------------------


class RunEnd(StrEnum):
    FINISHED = "finished"  # its work was done
    PREEMPTED = "preempted"  # stopped by a decision or a host failure; the job went back to the queue
    CUT = "cut"  # still running when the simulation ended


class JobOutcome(StrEnum):
    """Where each job is at the end: every job is in exactly one."""

    FINISHED = "finished"
    CANCELLED = "cancelled"  # rejected by the policy, never ran
    QUEUED = "queued"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_no: int  # 1, 2, ... per job
    start: int
    end: int
    gpus: int
    hosts: tuple[str, ...]
    ended: RunEnd
    progress_s: int  # work credited to the job by this run (seconds)
    stalled_at: int | None = None  # a host of the run went bad: no progress from here on
    reason: str = ""  # why it was preempted

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * (self.end - self.start)

    @property
    def stuck_gpu_seconds(self) -> int:
        return 0 if self.stalled_at is None else self.gpus * (self.end - self.stalled_at)

    @property
    def lost_gpu_seconds(self) -> int:
        """GPU time of a preempted run that the job does not keep (it runs that work again)."""
        return self.gpus * (self.end - self.start - self.progress_s) if self.ended is RunEnd.PREEMPTED else 0


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: SimJob
    outcome: JobOutcome
    runs: tuple[RunRecord, ...] = ()
    ended_at: int | None = None  # finished or cancelled at
    reason: str = ""  # why it was cancelled, or why it was last queued

    @property
    def first_start(self) -> int | None:
        return self.runs[0].start if self.runs else None


@dataclass(frozen=True)
class SimulationResult:
    """Everything a report needs: the jobs in submission order with their runs."""

    run_id: str
    policy: str
    start_at: int
    end_at: int
    clusters: tuple[ClusterSize, ...]
    jobs: tuple[JobRecord, ...]
    decisions: int  # calls of Policy.decide
    events_processed: int
    misfits: int = 0  # starts the engine could not place (non-strict mode): queued instead
    not_arrived: int = 0  # jobs submitted after the end: not part of the run
    host_failures: tuple[HostFailure, ...] = field(default_factory=tuple)

    @property
    def capacity_gpu_seconds(self) -> int:
        return sum(c.gpus for c in self.clusters) * (self.end_at - self.start_at)
