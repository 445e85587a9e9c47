"""The seams between the engine and the world: a `Policy` decides, a `Sink` receives events.

The engine calls `Policy.decide` for a job that wants to start and acts on the answer itself:
deciding is separate from acting (as `domain.admission.decide` on its snapshot), and a policy
gets a `SimView`, which has no way to change the engine. A `Sink` receives every lifecycle event
in simulated-time order; the platform adapter publishes them, `ListSink` keeps them for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from allmende.domain.admission_model import JobRequest, RunningJob
from allmende.domain.simulation.cluster import Cluster
from allmende.domain.simulation.model import Outcome, Stop
from allmende.schemas.events import JobFinished, JobPreempted, JobStarted, JobSubmitted, JobUsageSample

SimEvent = JobSubmitted | JobStarted | JobUsageSample | JobPreempted | JobFinished


class SimView:
    """A read-only window on the engine's clusters and queues at the current instant.

    It reads the engine's live state (no copy per decision, so a decision costs the same with
    10 or 10,000 running jobs); every method returns immutable values or read-only views.
    """

    __slots__ = ("_clock", "_clusters", "_queued")

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        queued: Mapping[str, Collection[str]],
        clock: Callable[[], int],
    ) -> None:
        self._clusters = clusters
        self._queued = queued
        self._clock = clock

    @property
    def now(self) -> int:
        return self._clock()

    def clusters(self) -> tuple[str, ...]:
        return tuple(sorted(self._clusters))

    def cluster_gpus(self, cluster: str) -> int:
        """The cluster's GPUs; 0 for a cluster the plan does not have."""
        c = self._clusters.get(cluster)
        return c.gpus if c else 0

    def free_gpus(self, cluster: str) -> int:
        """GPUs free on healthy hosts: what a job can be placed on now."""
        c = self._clusters.get(cluster)
        return c.free_healthy if c else 0

    def running(self, cluster: str) -> Collection[RunningJob]:
        c = self._clusters.get(cluster)
        return c.running if c else ()

    def running_job(self, cluster: str, job_id: str) -> RunningJob | None:
        c = self._clusters.get(cluster)
        return c.running_job(job_id) if c else None

    def jobs_on_host(self, cluster: str, host: str) -> tuple[RunningJob, ...]:
        c = self._clusters.get(cluster)
        return c.jobs_on(host) if c and c.has_host(host) else ()

    def unhealthy_hosts(self, cluster: str) -> frozenset[str]:
        c = self._clusters.get(cluster)
        return c.unhealthy_hosts() if c else frozenset()

    def project_gpus(self, cluster: str, project: str, priority_class: str) -> int:
        """GPUs the project's running jobs of that class hold on the cluster."""
        c = self._clusters.get(cluster)
        return c.project_gpus(project, priority_class) if c else 0

    def class_gpus(self, cluster: str, priority_class: str) -> int:
        """GPUs all running jobs of that class hold on the cluster."""
        c = self._clusters.get(cluster)
        return c.class_gpus(priority_class) if c else 0

    def freed_gpus(self, cluster: str, job_id: str) -> int:
        """GPUs placement gets back if the job stops (its GPUs on bad hosts stay out of use)."""
        c = self._clusters.get(cluster)
        return c.healthy_gpus_of(job_id) if c else 0

    def queue_length(self, cluster: str) -> int:
        return len(self._queued.get(cluster, ()))


class Policy(Protocol):
    """Who runs: the old static priorities (`baseline.BaselinePolicy`) or the platform (adapter).

    Every method is a pure read of the view: the engine performs what it answers.
    """

    @property
    def name(self) -> str: ...

    def decide(self, job: JobRequest, view: SimView, now: int) -> Outcome:
        """Start (maybe after preempting victims), queue or reject one job that wants to run."""
        ...

    def queue_key(self, job: JobRequest, submitted_at: int, now: int) -> tuple[int, ...]:
        """The order in which queued jobs are retried (smallest first); the engine breaks ties by
        submission time, then job id. A policy may also have a `queue_version` attribute: the
        promise that every key stays the same until it changes (the engine then keeps its order
        between passes instead of sorting the queue again). And a `reclaimable_gpus(cluster)`: GPUs
        of running jobs it would preempt for anyone (squatters), which count as free for a promise
        made with `Queue.reclaimable_counts`."""
        ...

    def on_host_health(
        self, cluster: str, host: str, healthy: bool, view: SimView, now: int
    ) -> tuple[Stop, ...]:
        """A host went bad or recovered: which runs to stop, and when (jobs on a bad host make no
        progress from the failure on, whether stopped or not)."""
        ...


class Sink(Protocol):
    def emit(self, event: SimEvent) -> None: ...


class ListSink:
    """Keeps every event, in order (tests, small runs)."""

    def __init__(self) -> None:
        self.events: list[SimEvent] = []

    def emit(self, event: SimEvent) -> None:
        self.events.append(event)


class NullSink:
    """Drops every event (a baseline run without a ledger)."""

    def emit(self, event: SimEvent) -> None:
        del event
