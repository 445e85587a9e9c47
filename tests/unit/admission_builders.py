"""Admission builders shared by the admission and preemption unit tests (times are UTC Unix seconds).

Every builder has defaults for what a test does not care about: a standard 8-GPU batch job of
project `proj` by user `ana` for 8 hours (64 GPU-hours at factor 1.00) on cluster c1 of 16 GPUs,
paid from one allocation with 1,000 GPU-hours left in 2027-Q1.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping
from fractions import Fraction

from allmende.domain.admission_model import (
    AdmissionSnapshot,
    BudgetLine,
    ClusterLoad,
    InteractiveLimits,
    JobRequest,
    Lane,
    RunningJob,
)
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """A UTC wall-clock time as Unix seconds (independent of the modules under test)."""
    return calendar.timegm((year, month, day, hour, minute, 0))


HOUR = 3600
NOW = utc(2027, 1, 4, 12)  # a Monday noon in 2027-Q1
RATE = CHARGE_UNITS_PER_GPU_SECOND  # every factor 1.00: a GPU-hour is a GPU-hour
UNITS_PER_GPU_HOUR = 3_600_000_000


def gpu_hours(amount: int | str) -> int:
    """GPU-hours at factor 1.00 as charge units, exactly: `gpu_hours("12.5")`."""
    units = Fraction(amount) * UNITS_PER_GPU_HOUR
    if units.denominator != 1:
        raise ValueError(f"{amount} GPU-hours is not a whole number of charge units")
    return int(units)


def request(
    job_id: str = "j1", project: str = "proj", *, gpus: int = 8, hours: int = 8, seconds: int | None = None,
    priority: str = "standard", interactive: bool = False, user: str = "ana", cluster: str = "c1",
    gpu_type: str = "H100",
) -> JobRequest:  # fmt: skip
    return JobRequest(
        job_id=job_id, project=project, user=user, cluster=cluster, gpu_type=gpu_type, gpus=gpus,
        priority_class=priority, interactive=interactive,
        requested_seconds=hours * HOUR if seconds is None else seconds,
    )  # fmt: skip


def interactive(
    job_id: str = "i1", project: str = "proj", *, gpus: int = 2, hours: int = 2, seconds: int | None = None,
    user: str = "ana", priority: str = "standard",
) -> JobRequest:  # fmt: skip
    """A small job somebody waits for at the keyboard (2 GPUs for 2 hours unless told)."""
    return request(job_id, project, gpus=gpus, hours=hours, seconds=seconds, user=user, priority=priority,
                   interactive=True)  # fmt: skip


def job(
    job_id: str, project: str = "other", *, gpus: int = 8, lane: Lane | None = Lane.BUDGET,
    priority: str = "standard", since: int = NOW - HOUR, hosts: Iterable[str] = (), user: str = "bob",
    interactive: bool = False, idle_since: int | None = None,
) -> RunningJob:  # fmt: skip
    return RunningJob(
        job_id=job_id, project=project, user=user, gpus=gpus, priority_class=priority, lane=lane,
        since=since, hosts=tuple(hosts), interactive=interactive, idle_since=idle_since,
    )  # fmt: skip


def opportunistic(
    job_id: str, project: str = "other", *, gpus: int = 8, since: int = NOW - HOUR, hosts: Iterable[str] = ()
) -> RunningJob:
    """A preemptible job running over budget on idle GPUs."""
    return job(job_id, project, gpus=gpus, lane=Lane.OPPORTUNISTIC, priority="preemptible", since=since,
               hosts=hosts)  # fmt: skip


def line(allocation_id: str = "a1", hours: int | str = 1000, *, period: str = "2027-Q1") -> BudgetLine:
    return BudgetLine(allocation_id=allocation_id, period=period, available_units=gpu_hours(hours))


def snapshot(
    *running: RunningJob, budget: Iterable[BudgetLine] | None = None, cluster_gpus: int = 16,
    rate: int = RATE, guaranteed: int = 0, fairshare: Mapping[str, float] | None = None,
    unhealthy: Iterable[str] = (), limits: InteractiveLimits | None = None, now: int = NOW,
) -> AdmissionSnapshot:  # fmt: skip
    """The cluster as `decide` sees it; `budget=()` is a project without any allocation."""
    return AdmissionSnapshot(
        now=now, cluster_gpus=cluster_gpus, load=ClusterLoad(running),
        budget=(line(),) if budget is None else tuple(budget), rate=rate, guaranteed_gpus=guaranteed,
        protected_projects=frozenset({"proj"}) if guaranteed else frozenset(),
        guarantees={"proj": guaranteed} if guaranteed else {}, fairshare=dict(fairshare or {}),
        unhealthy_hosts=frozenset(unhealthy), limits=limits or InteractiveLimits(),
    )  # fmt: skip
