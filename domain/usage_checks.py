"""Usage that cannot have happened: a lifecycle event checked against the plan before it is metered.

Producers are trusted components (the Slurm hooks, a collector, a replay), but nodes have wrong
clocks and producers have bugs; a ledger must not turn one of those into a spent budget. So the
meter checks every event against the plan as it reads it when it meters the event (caught up to
the end of the admin log before each batch), and an event that fails is refused with a code and a
sentence (a dead letter) and never metered. Nothing is lost by it: a refusal whose fix is an
admin's (a project, cluster or GPU type the plan does not declare yet) is re-driven once the plan
is fixed (`allmende dead-letters redrive`), and metering is order-free, so the job is then charged
exactly as if the event had come on time.

The plan as it is now, not as of the event's instant: a replay of last year's trace against this
quarter's plan is the common case. What a check compares with only grows (projects and clusters
are never removed, and GPU counts are the most a cluster was ever declared with), so a check that
passes once passes on every replay. Each check reads the event alone, never what the meter knows
of the job, so the outcome does not depend on the order events come in.

Checks (each event on its own; what needs more than one event, a run's GPUs against its own
cluster's size and the sum of runs on a cluster, is found in the ledger by the alerter and held
as disputed usage: domain/capacity.py):
- `future-instant`: an event's instant beyond the wall clock
  plus the allowed skew; a replay of the past is unaffected;
- `unknown-project`, `unknown-cluster`: a submission to a project or cluster the plan does not
  declare;
- `gpu-type`: a submission of a GPU type its cluster does not have;
- `over-capacity`: a submission asking for more GPUs than its cluster has; a start or a reading of
  more GPUs than the largest cluster has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from allmende.domain.admin_state import NOT_DISPUTED, AdminState
from allmende.domain.organisation import Cluster
from allmende.schemas.admin_events import ClusterDeclared
from allmende.schemas.events import JobEvent, JobStarted, JobSubmitted, JobUsageSample

FUTURE_INSTANT = "future-instant"
UNKNOWN_PROJECT = "unknown-project"
UNKNOWN_CLUSTER = "unknown-cluster"
GPU_TYPE = "gpu-type"
OVER_CAPACITY = "over-capacity"
# Refusals an admin mends by declaring what is missing; the rest are the producer's to mend.
PLAN_FIXABLE = frozenset({UNKNOWN_PROJECT, UNKNOWN_CLUSTER, GPU_TYPE, OVER_CAPACITY})


class ImpossibleUsage(ValueError):
    """The event reports usage the plan (or the clock) says cannot have happened."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PlanView:
    """What the checks need of the plan: its projects and clusters."""

    projects: frozenset[str]
    clusters: Mapping[str, Cluster]
    largest: int  # the most GPUs any cluster was ever declared with (0: none declared)
    disputes: Mapping[str, int] = field(default_factory=dict)  # job id -> Dispute.stage

    @classmethod
    def of(cls, state: AdminState) -> PlanView:
        # A cluster's most GPUs ever declared: a shrink does not refuse what it once held.
        peaks: dict[str, int] = {}
        for event in state.history:
            if isinstance(event, ClusterDeclared):
                peaks[event.cluster] = max(peaks.get(event.cluster, 0), event.gpus)
        clusters = {name: replace(c, gpus=peaks.get(name, c.gpus)) for name, c in state.clusters.items()}
        return cls(
            projects=frozenset(state.projects()),
            clusters=clusters,
            largest=max((c.gpus for c in clusters.values()), default=0),
            disputes={job_id: d.stage for job_id, d in state.disputes.items()},
        )

    def dispute_stage(self, job_id: str) -> int:
        return self.disputes.get(job_id, NOT_DISPUTED)


def check_event(event: JobEvent, plan: PlanView, now: int, skew_s: int) -> None:
    """Raise ImpossibleUsage unless `event` may be metered (the event alone: order-free)."""
    # A run end's `started_at` is never after its `occurred_at` (the contract): one instant to check.
    if event.occurred_at > now + skew_s:
        raise ImpossibleUsage(
            FUTURE_INSTANT,
            f"{event.type} of job {event.job_id} is at {event.occurred_at}, {event.occurred_at - now} s after"
            f" the meter's clock ({now}); at most {skew_s} s of clock skew are allowed",
        )
    if isinstance(event, JobSubmitted):
        _check_submission(event, plan)
        return
    gpus = (
        event.gpus
        if isinstance(event, JobStarted)
        else event.gpus_in_use
        if isinstance(event, JobUsageSample)
        else 0
    )
    if gpus > plan.largest:
        raise ImpossibleUsage(
            OVER_CAPACITY,
            f"{event.type} of job {event.job_id} reports {gpus} GPUs, more than any declared cluster has"
            f" ({plan.largest})",
        )


def _check_submission(event: JobSubmitted, plan: PlanView) -> None:
    if event.project not in plan.projects:
        raise ImpossibleUsage(
            UNKNOWN_PROJECT,
            f"job {event.job_id} is submitted to project {event.project!r}, which the plan does not declare",
        )
    cluster = plan.clusters.get(event.cluster)
    if cluster is None:
        raise ImpossibleUsage(
            UNKNOWN_CLUSTER,
            f"job {event.job_id} is submitted to cluster {event.cluster!r}, which the plan does not declare",
        )
    if event.gpu_type != cluster.gpu_type:
        raise ImpossibleUsage(
            GPU_TYPE,
            f"job {event.job_id} asks for GPU type {event.gpu_type!r}; cluster {cluster.cluster} has"
            f" {cluster.gpu_type!r}",
        )
    if event.gpus > cluster.gpus:
        raise ImpossibleUsage(
            OVER_CAPACITY,
            f"job {event.job_id} asks for {event.gpus} GPUs on cluster {cluster.cluster},"
            f" which has {cluster.gpus}",
        )
