"""Behaviours from the field, applied to a trace: seeded, and stable per job and per user.

Every choice is a function of (seed, what, job id or user) alone, so the same job gets the same
class whatever the slice, the order or the other jobs, and the same seed gives the same workload.

- placeholders: a share of users park idle jobs (utilisation about 1 %) that hold GPUs for days,
  one after the other from their first submission, to keep GPUs for debugging;
- priority inflation: a share of users submit every job at the top class while it costs them
  little: under a policy that charges nothing for priority (the baseline) always; under one that
  prices classes (the platform: the plan's multipliers), only while the top class costs at most
  their tolerance times the class they would pick otherwise (drawn per user, seeded, between 1
  and `max_price_tolerance`). A model of how users answer prices ("when a priority costs budget,
  nobody picks the maximum for free"), not a measurement. Everybody else's class is drawn per job
  from `class_mix`;
- interactive sessions: a share of the small, short jobs are somebody at a keyboard;
- host failures: hosts that go bad at a given instant, and maybe recover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allmende.domain.simulation.model import TOP_CLASS, HostFailure, SimJob
from allmende.domain.traces import TraceJob, seeded_unit
from allmende.schemas.events import PriorityClass

DAY_S = 86_400


def unit(seed: int, what: str, key: str) -> float:
    """A number in [0, 1) from the seed, the kind of choice and the job or user alone."""
    return seeded_unit("sim", seed, what, key)


@dataclass(frozen=True)
class Behaviours:
    seed: int = 0
    placeholder_user_share: float = 0.1
    placeholders_per_user: int = 1  # parked one after the other
    placeholder_gpus: int = 2
    placeholder_duration_s: int = 3 * DAY_S
    placeholder_utilization: float = 0.01
    placeholder_class: PriorityClass = TOP_CLASS  # a user who squats makes sure nobody takes them
    inflating_user_share: float = 0.3
    # An inflating user still asks for the top class while it costs at most this many times the
    # class they would otherwise pick (each user's tolerance drawn between 1 and this).
    max_price_tolerance: float = 3.0
    # Weights (any positive integers) of the classes users who do not inflate pick per job.
    class_mix: tuple[tuple[PriorityClass, int], ...] = (
        (PriorityClass.PREEMPTIBLE, 30),
        (PriorityClass.STANDARD, 60),
        (PriorityClass.NON_PREEMPTIBLE, 10),
    )
    interactive_share: float = 0.1  # of the small, short jobs
    interactive_max_gpus: int = 2
    interactive_max_s: int = 4 * 3600
    host_failures: tuple[HostFailure, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "placeholder_user_share",
            "inflating_user_share",
            "interactive_share",
            "placeholder_utilization",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if (
            not self.class_mix
            or any(w < 0 for _, w in self.class_mix)
            or sum(w for _, w in self.class_mix) == 0
        ):
            raise ValueError("class_mix needs at least one positive weight and none negative")
        if self.placeholders_per_user < 0 or self.placeholder_gpus < 1 or self.placeholder_duration_s < 1:
            raise ValueError("placeholders need at least one GPU and one second")
        if self.max_price_tolerance < 1:
            raise ValueError(f"max_price_tolerance must be at least 1, got {self.max_price_tolerance}")


NO_BEHAVIOURS = Behaviours(
    placeholder_user_share=0.0,
    inflating_user_share=0.0,
    class_mix=((PriorityClass.STANDARD, 1),),
    interactive_share=0.0,
)


def inflates(b: Behaviours, user: str) -> bool:
    return b.inflating_user_share > 0 and unit(b.seed, "inflate", user) < b.inflating_user_share


def parks_placeholders(b: Behaviours, user: str) -> bool:
    return b.placeholder_user_share > 0 and unit(b.seed, "placeholder", user) < b.placeholder_user_share


def drawn_class(b: Behaviours, job_id: str) -> PriorityClass:
    total = sum(w for _, w in b.class_mix)
    point = unit(b.seed, "class", job_id) * total
    for cls, weight in b.class_mix:
        if point < weight:
            return cls
        point -= weight
    return b.class_mix[-1][0]  # float rounding at the very top of the range


def price_tolerance(b: Behaviours, user: str) -> float:
    """How many times the price of their own class a user pays for the top class, at most."""
    return 1.0 + (b.max_price_tolerance - 1.0) * unit(b.seed, "tolerance", user)


# Class prices under a policy (any positive numbers, compared as ratios); None: priority is free.
ClassPrices = Mapping[str, int]


def chosen_class(b: Behaviours, job: TraceJob, prices: ClassPrices | None = None) -> PriorityClass:
    """The class a job is submitted at: its drawn class, or the top one for a user who inflates
    and finds it cheap enough."""
    drawn = drawn_class(b, job.job_id)
    if not inflates(b, job.user):
        return drawn
    if prices is None or prices[TOP_CLASS.value] <= price_tolerance(b, job.user) * prices[drawn.value]:
        return TOP_CLASS
    return drawn


def is_interactive(b: Behaviours, job: TraceJob) -> bool:
    small = job.gpus <= b.interactive_max_gpus and job.duration_s <= b.interactive_max_s
    return small and b.interactive_share > 0 and unit(b.seed, "interactive", job.job_id) < b.interactive_share


def sim_job(
    job: TraceJob, b: Behaviours, cluster: str | None = None, prices: ClassPrices | None = None
) -> SimJob:
    return SimJob(
        job_id=job.job_id,
        project=job.project,
        user=job.user,
        cluster=cluster or job.cluster,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        submit_at=job.submit_at,
        duration_s=job.duration_s,
        priority_class=chosen_class(b, job, prices),
        interactive=is_interactive(b, job),
        utilization=job.utilization,
        status=job.status,
    )


def placeholders(first_jobs: Iterable[SimJob], b: Behaviours) -> list[SimJob]:
    """The placeholder jobs of the users who park them, from each user's first job on."""
    parked: list[SimJob] = []
    for first in first_jobs:
        if not parks_placeholders(b, first.user):
            continue
        for n in range(b.placeholders_per_user):
            parked.append(
                SimJob(
                    job_id=f"{first.user}-placeholder-{n + 1}",
                    project=first.project,
                    user=first.user,
                    cluster=first.cluster,
                    gpu_type=first.gpu_type,
                    gpus=b.placeholder_gpus,
                    submit_at=first.submit_at + n * b.placeholder_duration_s,
                    duration_s=b.placeholder_duration_s,
                    priority_class=b.placeholder_class,
                    placeholder=True,
                    utilization=b.placeholder_utilization,
                )
            )
    return parked


def workload(
    trace: Iterable[TraceJob],
    b: Behaviours = Behaviours(),
    cluster_for: Mapping[str, str] | None = None,
    prices: ClassPrices | None = None,
) -> list[SimJob]:
    """The simulated jobs of a trace with the behaviours applied, by submission time then id.

    `cluster_for` maps a trace's cluster names to the plan's (a trace job keeps its own otherwise);
    `prices` are the classes' prices under the policy the jobs are submitted to (None: free).
    """
    mapping = cluster_for or {}
    jobs = [sim_job(j, b, mapping.get(j.cluster), prices) for j in trace]
    jobs.sort(key=lambda j: (j.submit_at, j.job_id))
    first: dict[str, SimJob] = {}
    for job in jobs:
        first.setdefault(job.user, job)
    jobs.extend(placeholders(first.values(), b))
    jobs.sort(key=lambda j: (j.submit_at, j.job_id))
    return jobs
