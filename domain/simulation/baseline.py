"""The old system the platform replaces: static priority classes and protected GPUs per project.

Rules, in order (each tied to a failure mode the simulator should show):

1. A job for a cluster the plan lacks, or larger than its cluster, is rejected.
2. Any class starts on idle GPUs, and only preemptible jobs are ever preempted for another job:
   so a standard or non-preemptible job that took idle GPUs keeps them (placeholders squat).
3. When the GPUs are busy, a standard or non-preemptible job may preempt preemptible work, but
   only within its project's protected GPUs on the cluster (GPUs its running standard and
   non-preemptible jobs hold count against them); victims are the youngest preemptible runs
   (least work lost), then job id.
4. The queue is retried by class (non-preemptible, standard, preemptible), then submission
   time, so asking for the top class always pays (priority inflation).
5. A host goes bad: preemptible and standard jobs on it are requeued at once; non-preemptible
   ones stay stuck on it, holding their GPUs, until the on-call engineer requeues them after
   `on_call_delay_s`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from allmende.domain.admission_model import JobRequest
from allmende.domain.preemption import CLASS_ORDER
from allmende.domain.simulation.interfaces import SimView
from allmende.domain.simulation.model import Outcome, Queue, Reject, Start, Stop
from allmende.schemas.events import PriorityClass

HOUR_S = 3600
# Plain strings: RunningJob and JobRequest carry classes as str, and enum lookups in the hot
# loop of a long queue cost more than the rule itself.
_PREEMPTIBLE = PriorityClass.PREEMPTIBLE.value
_NON_PREEMPTIBLE = PriorityClass.NON_PREEMPTIBLE.value
_GUARANTEED = (PriorityClass.STANDARD.value, _NON_PREEMPTIBLE)


@dataclass(frozen=True)
class BaselineConfig:
    # (cluster, project) -> protected GPUs; a project missing here has none.
    protected_gpus: Mapping[tuple[str, str], int] = field(default_factory=dict)
    on_call_delay_s: int = 4 * HOUR_S

    def __post_init__(self) -> None:
        if self.on_call_delay_s < 0 or any(n < 0 for n in self.protected_gpus.values()):
            raise ValueError("protected GPUs and the on-call delay cannot be negative")


def protected_by_shares(
    cluster_gpus: Mapping[str, int], shares: Mapping[str, int], percent: int = 100
) -> dict[tuple[str, str], int]:
    """Protect `percent` of every cluster's GPUs, split among projects by their shares (rounded
    down: the protected GPUs never exceed the cluster)."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be 0..100, got {percent}")
    total = sum(shares.values())
    if total <= 0:
        return {}
    return {
        (cluster, project): gpus * percent * share // (100 * total)
        for cluster, gpus in sorted(cluster_gpus.items())
        for project, share in sorted(shares.items())
    }


@dataclass(frozen=True)
class BaselinePolicy:
    config: BaselineConfig = field(default_factory=BaselineConfig)
    name: str = "baseline"

    queue_version = 0  # the key is the class alone: it never changes

    def queue_key(self, job: JobRequest, submitted_at: int, now: int) -> tuple[int, ...]:
        return (CLASS_ORDER[job.priority_class],)  # the old queue: the top class first

    def decide(self, job: JobRequest, view: SimView, now: int) -> Outcome:
        total = view.cluster_gpus(job.cluster)
        if total == 0:
            return Reject(f"unknown-cluster: {job.cluster} is not in the plan")
        if job.gpus > total:
            return Reject(f"too-large: {job.gpus} GPUs on a cluster of {total}")
        free = view.free_gpus(job.cluster)
        if job.gpus <= free:
            return Start(reason="idle-gpus")
        protected = self.config.protected_gpus.get((job.cluster, job.project), 0)
        if job.priority_class not in _GUARANTEED or protected == 0:
            # Only idle GPUs can start it: nothing changes the answer until enough are free.
            return Queue("cluster-full", wait_for_free_gpus=job.gpus)
        in_use = sum(view.project_gpus(job.cluster, job.project, c) for c in _GUARANTEED)
        if in_use + job.gpus > protected:
            return Queue(f"cluster-full: {in_use} of {protected} protected GPUs in use")
        if free + view.class_gpus(job.cluster, _PREEMPTIBLE) < job.gpus:
            return Queue("protected-gpus-busy: held by jobs that cannot be preempted")
        victims, freed = self._victims(job, view, job.gpus - free)
        if freed < job.gpus - free:
            return Queue("protected-gpus-busy: held by jobs that cannot be preempted")
        return Start(victims=victims, reason="protected-gpus")

    @staticmethod
    def _victims(job: JobRequest, view: SimView, needed: int) -> tuple[tuple[str, ...], int]:
        candidates = sorted(
            (r for r in view.running(job.cluster) if r.priority_class == _PREEMPTIBLE),
            key=lambda r: (-r.since, r.job_id),
        )
        victims: list[str] = []
        freed = 0
        for running in candidates:
            if freed >= needed:
                break
            gpus = view.freed_gpus(job.cluster, running.job_id)
            if gpus == 0:
                continue  # all on bad hosts: stopping it frees nothing placement can use
            victims.append(running.job_id)
            freed += gpus
        return tuple(victims), freed

    def on_host_health(
        self, cluster: str, host: str, healthy: bool, view: SimView, now: int
    ) -> tuple[Stop, ...]:
        if healthy:
            return ()
        stops = []
        for running in view.jobs_on_host(cluster, host):
            if running.priority_class == _NON_PREEMPTIBLE:
                # Nobody may stop a non-preemptible job but a person: it waits for the on-call.
                stops.append(
                    Stop(
                        running.job_id,
                        now + self.config.on_call_delay_s,
                        f"on-call requeued after {host} failed",
                    )
                )
            else:
                stops.append(Stop(running.job_id, now, f"requeued: host {host} failed"))
        return tuple(stops)
