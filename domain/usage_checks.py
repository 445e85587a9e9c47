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
quarter's plan is the common case, and the plan's declarations only grow (a cluster never shrinks
below what it holds, nodes are never removed), so a check that passes once passes on every replay.

Checks (each event on its own; what only the sum of events shows, GPUs in use above a cluster's
capacity across jobs, is not checked here):
- `future-instant`: an event's instant beyond the wall clock
  plus the allowed skew; a replay of the past is unaffected;
- `unknown-project`, `unknown-cluster`: a submission to a project or cluster the plan does not
  declare;
- `gpu-type`: a submission of a GPU type its cluster does not have;
- `over-capacity`: GPUs (asked, started or in use) the job's cluster does not have; before the
  job's submission is known, more than the largest declared cluster has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allmende.domain.admin_state import AdminState
from allmende.domain.organisation import Cluster
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
    largest: int  # GPUs of the largest cluster (0: none declared)

    @classmethod
    def of(cls, state: AdminState) -> PlanView:
        clusters = dict(state.clusters)
        return cls(
            projects=frozenset(state.projects()),
            clusters=clusters,
            largest=max((c.gpus for c in clusters.values()), default=0),
        )


def check_event(
    event: JobEvent, plan: PlanView, submitted: Mapping[str, Any] | None, now: int, skew_s: int
) -> None:
    """Raise ImpossibleUsage unless `event` may be metered. `submitted`: the job's accepted
    submission as the meter keeps it (project, cluster, ...), None before it is known."""
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
    if not gpus:
        return
    cluster = plan.clusters.get(str(submitted["cluster"])) if submitted else None
    if cluster is not None:
        if gpus > cluster.gpus:
            raise ImpossibleUsage(
                OVER_CAPACITY,
                f"{event.type} of job {event.job_id} reports {gpus} GPUs on cluster {cluster.cluster},"
                f" which has {cluster.gpus}",
            )
    elif gpus > plan.largest:
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
