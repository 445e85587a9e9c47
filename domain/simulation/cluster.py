"""A cluster of hosts with 8 GPUs each: first-fit placement, host health, who runs where.

The cluster also keeps the sums a policy reads on every decision (free GPUs on healthy hosts,
GPUs per project and class), updated as jobs come and go, so a decision does not scan the jobs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from allmende.domain.admission_model import RunningJob
from allmende.domain.simulation.model import SimulationError

GPUS_PER_HOST = 8


def host_name(cluster: str, index: int) -> str:
    """`<cluster>-n001` for the first host: names sort in placement order up to 999 hosts."""
    return f"{cluster}-n{index + 1:03d}"


@dataclass(slots=True)
class Host:
    name: str
    gpus: int
    free: int
    healthy: bool = True


class Cluster:
    __slots__ = (
        "_by_class",
        "_class_total",
        "_hosts",
        "_index",
        "_placed",
        "_running",
        "free_healthy",
        "gpus",
        "name",
    )

    def __init__(self, name: str, gpus: int, gpus_per_host: int = GPUS_PER_HOST) -> None:
        if gpus < 1 or gpus_per_host < 1:
            raise ValueError(
                f"cluster {name} needs GPUs and hosts, got {gpus} GPUs, {gpus_per_host} per host"
            )
        self.name = name
        self.gpus = gpus
        # The last host holds the remainder when the GPUs are not a multiple of the host size.
        sizes = [gpus_per_host] * (gpus // gpus_per_host) + (
            [gpus % gpus_per_host] if gpus % gpus_per_host else []
        )
        self._hosts = [Host(host_name(name, i), size, size) for i, size in enumerate(sizes)]
        self._index = {h.name: i for i, h in enumerate(self._hosts)}
        self.free_healthy = gpus
        self._running: dict[str, RunningJob] = {}
        self._placed: dict[str, tuple[tuple[int, int], ...]] = {}  # job -> (host index, GPUs)
        self._by_class: dict[tuple[str, str], int] = {}  # (project, class) -> GPUs held
        self._class_total: dict[str, int] = {}  # class -> GPUs held

    # -- reads ----------------------------------------------------------------------------------
    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h.name for h in self._hosts)

    @property
    def running(self) -> Collection[RunningJob]:
        """A live, read-only view of the jobs holding GPUs here."""
        return self._running.values()

    def running_job(self, job_id: str) -> RunningJob | None:
        return self._running.get(job_id)

    def has_host(self, host: str) -> bool:
        return host in self._index

    def is_healthy(self, host: str) -> bool:
        return self._hosts[self._index[host]].healthy

    def unhealthy_hosts(self) -> frozenset[str]:
        return frozenset(h.name for h in self._hosts if not h.healthy)

    def jobs_on(self, host: str) -> tuple[RunningJob, ...]:
        index = self._index[host]
        return tuple(
            self._running[job_id]
            for job_id in sorted(self._placed)
            if any(i == index for i, _ in self._placed[job_id])
        )

    def project_gpus(self, project: str, priority_class: str) -> int:
        return self._by_class.get((project, priority_class), 0)

    def class_gpus(self, priority_class: str) -> int:
        return self._class_total.get(priority_class, 0)

    def healthy_gpus_of(self, job_id: str) -> int:
        """GPUs the job would give back to placement if it stopped (those on healthy hosts)."""
        return sum(n for i, n in self._placed.get(job_id, ()) if self._hosts[i].healthy)

    def host_free(self) -> Mapping[str, int]:
        return {h.name: h.free for h in self._hosts}

    # -- changes --------------------------------------------------------------------------------
    def place(self, job: RunningJob) -> tuple[str, ...] | None:
        """First fit over healthy hosts in order (a job may span hosts); None when it does not fit."""
        if job.job_id in self._running:
            raise SimulationError(f"job {job.job_id} is already placed on {self.name}")
        if job.gpus > self.free_healthy:
            return None
        needed, taken = job.gpus, []
        for i, host in enumerate(self._hosts):
            if needed == 0:
                break
            if not host.healthy or host.free == 0:
                continue
            n = min(host.free, needed)
            host.free -= n
            needed -= n
            taken.append((i, n))
        if needed:
            raise SimulationError(f"{self.name}: free GPU count {self.free_healthy} disagrees with its hosts")
        self.free_healthy -= job.gpus
        self._placed[job.job_id] = tuple(taken)
        hosts = tuple(self._hosts[i].name for i, _ in taken)
        placed = RunningJob(
            job_id=job.job_id,
            project=job.project,
            user=job.user,
            gpus=job.gpus,
            priority_class=job.priority_class,
            lane=job.lane,
            since=job.since,
            hosts=hosts,
            interactive=job.interactive,
        )
        self._running[job.job_id] = placed
        key = (job.project, job.priority_class)
        self._by_class[key] = self._by_class.get(key, 0) + job.gpus
        self._class_total[job.priority_class] = self._class_total.get(job.priority_class, 0) + job.gpus
        return hosts

    def release(self, job_id: str) -> RunningJob:
        job = self._running.pop(job_id, None)
        if job is None:
            raise SimulationError(f"job {job_id} does not run on {self.name}")
        for i, n in self._placed.pop(job_id):
            host = self._hosts[i]
            host.free += n
            if host.healthy:
                self.free_healthy += n
        key = (job.project, job.priority_class)
        self._by_class[key] -= job.gpus
        self._class_total[job.priority_class] -= job.gpus
        return job

    def set_health(self, host: str, healthy: bool) -> bool:
        """Mark a host; False when it already was in that state (nothing changed)."""
        h = self._hosts[self._index[host]]
        if h.healthy == healthy:
            return False
        h.healthy = healthy
        # A bad host's free GPUs leave placement; its held GPUs come back only when released.
        self.free_healthy += h.free if healthy else -h.free
        return True

    def fingerprint(self) -> tuple[object, ...]:
        """Everything that defines the cluster's state, to check that nothing changed it."""
        return (
            tuple((h.name, h.gpus, h.free, h.healthy) for h in self._hosts),
            self.free_healthy,
            tuple(sorted((k, v) for k, v in self._placed.items())),
            tuple(sorted(self._running.items())),
            tuple(sorted(self._by_class.items())),
            tuple(sorted(self._class_total.items())),
        )
