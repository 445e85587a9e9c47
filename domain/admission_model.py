"""The admission policy's inputs and outputs: a snapshot in, a decision out (no I/O).

The service builds an `AdmissionSnapshot` from its in-memory projections (cluster occupancy,
budgets with holds, agreements, fair share, host health) and calls `domain.admission.decide`;
`domain.preemption.plan_victims` picks victims on the same snapshot. Deciding never changes the
snapshot: acting on a decision (holds, events) is the service's business.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    ADMIT = "admit"
    QUEUE = "queue"
    REJECT = "reject"


class Lane(StrEnum):
    """Why a job may run. Order of preference when several apply: the first that admits wins."""

    INTERACTIVE = "interactive"  # small, now, preempting opportunistic work: nobody needs to squat
    TIME_SLICE = "time-slice"  # inside an agreement's window, up to its guaranteed GPUs
    BUDGET = "budget"  # paid from an allocation, with a hold for the expected charge
    OPPORTUNISTIC = "opportunistic"  # over budget: preemptible only, on idle GPUs


@dataclass(frozen=True, slots=True)
class JobRequest:
    job_id: str
    project: str
    user: str
    cluster: str
    gpu_type: str
    gpus: int
    priority_class: str  # preemptible | standard | non-preemptible
    interactive: bool
    requested_seconds: int


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs of the cluster: admitted (maybe not started yet) or seen running."""

    job_id: str
    project: str
    user: str
    gpus: int
    priority_class: str
    lane: Lane | None  # None: running without an admission decision (e.g. before the service)
    since: int  # admitted or started at (UTC Unix seconds): work lost grows with it
    hosts: tuple[str, ...] = ()
    interactive: bool = False
    started: bool = False  # seen running (else admitted and due to start)
    requested_seconds: int = 0  # the run time asked for (0: unknown)
    # Squatting: its GPUs idle since then, by its own readings, for longer than the grace period
    # (domain.squatting's rule, folded by AdmissionState); None while it works or nobody knows.
    idle_since: int | None = None

    def overrun_s(self, now: int, grace_s: int) -> int | None:
        """Seconds it has run past its request plus the grace, if it has: a wrong request or a
        run that no longer ends, for its lead to look at; None when not (or its request is unknown)."""
        if not self.started or self.requested_seconds <= 0:
            return None
        past = now - (self.since + self.requested_seconds + grace_s)
        return past if past > 0 else None

    @property
    def squatting(self) -> bool:
        """Idle for longer than the grace period and neither inside a guarantee nor at a keyboard:
        any admission that lacks GPUs may take its (domain.preemption's `squatting` group)."""
        return (
            self.idle_since is not None
            and self.lane not in (Lane.TIME_SLICE, Lane.INTERACTIVE)
            and not self.interactive
        )


class ClusterLoad:
    """The jobs holding GPUs of one cluster, and the sums every decision reads, kept up to date as
    jobs come and go: a decision costs the same with 10 or 10,000 jobs on the cluster, and only
    one that needs victims looks at the jobs themselves."""

    __slots__ = ("_interactive", "_jobs", "_time_slice", "squatting_gpus", "used_gpus")

    def __init__(self, jobs: Iterable[RunningJob] = ()) -> None:
        self._jobs: dict[str, RunningJob] = {}
        self.used_gpus = 0
        self.squatting_gpus = 0  # of jobs any admission may preempt for squatting
        self._time_slice: dict[str, int] = {}  # project -> GPUs in the time-slice lane
        self._interactive: dict[str, int] = {}  # user -> GPUs in interactive jobs
        for job in jobs:
            self.put(job)

    def _count(self, job: RunningJob, sign: int) -> None:
        self.used_gpus += sign * job.gpus
        if job.lane is Lane.TIME_SLICE:
            self._time_slice[job.project] = self._time_slice.get(job.project, 0) + sign * job.gpus
        if job.interactive or job.lane is Lane.INTERACTIVE:
            self._interactive[job.user] = self._interactive.get(job.user, 0) + sign * job.gpus
        if job.squatting:
            self.squatting_gpus += sign * job.gpus

    def put(self, job: RunningJob) -> None:
        self.pop(job.job_id)
        self._jobs[job.job_id] = job
        self._count(job, 1)

    def pop(self, job_id: str) -> RunningJob | None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            self._count(job, -1)
        return job

    @property
    def jobs(self) -> Collection[RunningJob]:
        """A live view: valid while nobody changes the load (the caller holds its lock)."""
        return self._jobs.values()

    def time_slice_gpus(self, project: str) -> int:
        return self._time_slice.get(project, 0)

    def interactive_gpus(self, user: str) -> int:
        return self._interactive.get(user, 0)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterLoad) and self._jobs == other._jobs

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ClusterLoad({list(self._jobs.values())!r})"


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One allocation that may pay for the job, in paying order (most specific first)."""

    allocation_id: str
    period: str
    available_units: int  # allocated - charged - held, never below 0


@dataclass(frozen=True, slots=True)
class InteractiveLimits:
    max_gpus_per_user: int = 8
    max_seconds: int = 8 * 3600


@dataclass(frozen=True)
class AdmissionSnapshot:
    now: int
    cluster_gpus: int
    load: ClusterLoad  # every job holding GPUs of the request's cluster, with their sums
    budget: tuple[BudgetLine, ...]  # the project's allocations covering (now, cluster, GPU type)
    rate: int  # charge units per GPU-second for this job under the policy in force now
    guaranteed_gpus: int  # the project's time-slice guarantee on the cluster now (0: none)
    protected_projects: frozenset[str] = frozenset()  # projects inside an active agreement window now
    guarantees: Mapping[str, int] = field(default_factory=dict)  # project -> guaranteed GPUs now
    fairshare: Mapping[str, float] = field(default_factory=dict)  # project -> factor (missing: 0.5)
    unhealthy_hosts: frozenset[str] = frozenset()
    limits: InteractiveLimits = InteractiveLimits()


@dataclass(frozen=True, slots=True)
class Reason:
    code: str  # machine-readable, stable: e.g. "budget-exhausted", "cluster-full"
    message: str  # a sentence a researcher understands


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: str
    project: str
    gpus: int
    code: str  # unhealthy-host | squatting | opportunistic | preemptible | standard (domain.preemption)
    reason: str


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    lane: Lane | None
    reasons: tuple[Reason, ...]
    rate: int  # charge units per GPU-second
    expected_units: int  # gpus x requested seconds x rate
    hold: tuple[tuple[str, int], ...]  # (allocation id, units) placed for the job
    available_before_units: int
    available_after_units: int
    fairshare_factor: float
    preempt: tuple[Victim, ...]

    @property
    def sentence(self) -> str:
        return " ".join(r.message for r in self.reasons)
