"""Preemption: which running jobs to stop, and in which order, so that a job can start (no I/O).

Deciding is separate from acting: `plan_victims` names victims on a snapshot of the running jobs
and changes nothing; stopping them is the service's business.

Victim groups, in order of precedence (the first group goes first):

1. ``unhealthy-host``: every job with a host that is unhealthy, whatever its lane or class. They
   must stop anyway, so all of them are listed, even beyond the GPUs needed.
2. ``squatting``: jobs whose GPUs have been idle (utilisation under the squatting threshold) for
   longer than the grace period, by their own usage readings (`RunningJob.idle_since`), whatever
   their class and at any reach: a job that does no work keeps no GPUs from one that would. This
   is the platform's answer to placeholder jobs parked to keep GPUs for debugging.
3. ``opportunistic``: jobs of the opportunistic lane (over budget, on idle GPUs).
4. ``preemptible``: budget-lane jobs of class "preemptible" (reach PREEMPTIBLE and beyond).
5. ``standard``: budget-lane jobs of class "standard" (reach STANDARD).

Never victims, unless on an unhealthy host: time-slice jobs (they run inside a guarantee),
interactive jobs (somebody is at the keyboard, and a session is idle while they think); unless
squatting: class "non-preemptible" (that is the class's promise, whatever the lane, to a job
that works). A job without a lane (running before the service decided on it)
counts as a budget-lane job of its class; a class this module does not know is never a victim.

Within a group: the lowest fair-share factor of the job's project first (a project that has used
more than its share gives way first; missing factor: 0.5), then the least work lost (the latest
`since`), then the job id, so the order never depends on the order of the input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from enum import IntEnum

from allmende.domain.admission_model import AdmissionSnapshot, Lane, RunningJob, Victim

DEFAULT_FAIRSHARE = 0.5  # a project without a factor yet is treated as exactly at its share

UNHEALTHY_HOST = "unhealthy-host"
SQUATTING = "squatting"
OPPORTUNISTIC = "opportunistic"
PREEMPTIBLE = "preemptible"
STANDARD = "standard"
VICTIM_CODES = (UNHEALTHY_HOST, SQUATTING, OPPORTUNISTIC, PREEMPTIBLE, STANDARD)  # in order of precedence


# The order waiting jobs are taken in (the Slurm agent's held jobs, the simulator's queue).
CLASS_ORDER = {"non-preemptible": 0, "standard": 1, "preemptible": 2}


def class_rank(priority_class: str) -> int:
    """A waiting job's priority class in queue order (an unknown one last)."""
    return CLASS_ORDER.get(priority_class, len(CLASS_ORDER))


def fairshare_rank(factor: float | None) -> int:
    """A project's fair-share factor in queue order, highest first (missing: exactly at its
    share), in millionths."""
    return -round((DEFAULT_FAIRSHARE if factor is None else factor) * 1_000_000)


def queue_rank(priority_class: str, factor: float | None) -> tuple[int, int]:
    """Where a waiting job stands: its priority class first, then its project's fair share."""
    return (class_rank(priority_class), fairshare_rank(factor))


def stop_action(code: str, preempt_action: str) -> str:
    """How a victim is stopped: as configured ("requeue" or "cancel"), except a squatting job,
    which is cancelled: requeued, it would only park on the next free GPUs again."""
    return "cancel" if code == SQUATTING else preempt_action


class Reach(IntEnum):
    """How far preemption may go: each level includes the ones below it."""

    OPPORTUNISTIC = 1  # only opportunistic-lane jobs
    PREEMPTIBLE = 2  # also preemptible-class budget-lane jobs
    STANDARD = 3  # also standard-class budget-lane jobs


def plural(count: int, noun: str) -> str:
    """`1 GPU`, `8 GPUs`."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def utc_minute(at: int) -> str:
    """`2027-01-03 10:00 UTC`; a time out of the calendar's range is shown as it is, never raised."""
    try:
        return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"Unix time {at}"


def victim_group(job: RunningJob, unhealthy_hosts: frozenset[str], reach: Reach) -> str | None:
    """The victim code of `job` under `reach`, or None when the job may not be preempted."""
    if unhealthy_hosts.intersection(job.hosts):
        return UNHEALTHY_HOST
    if job.squatting:
        return SQUATTING
    if job.lane in (Lane.TIME_SLICE, Lane.INTERACTIVE) or job.interactive:
        return None
    if job.priority_class == "non-preemptible":
        return None
    if job.lane is Lane.OPPORTUNISTIC:
        return OPPORTUNISTIC
    # The budget lane, or no lane at all: the job's class decides how far away it is.
    if job.priority_class == "preemptible" and reach >= Reach.PREEMPTIBLE:
        return PREEMPTIBLE
    if job.priority_class == "standard" and reach >= Reach.STANDARD:
        return STANDARD
    return None


# -- why each victim goes: one small function per group -----------------------------------------


def _on_unhealthy_host(job: RunningJob, factor: float, unhealthy_hosts: frozenset[str]) -> str:
    hosts = sorted(unhealthy_hosts.intersection(job.hosts))
    where = f"unhealthy host {hosts[0]}" if len(hosts) == 1 else f"unhealthy hosts {', '.join(hosts)}"
    return (
        f"job {job.job_id} of {job.project} holds {plural(job.gpus, 'GPU')} on {where} "
        f"since {utc_minute(job.since)} and must stop anyway"
    )


def _squatting(job: RunningJob, factor: float, unhealthy_hosts: frozenset[str]) -> str:
    return (
        f"job {job.job_id} of {job.project} has left its {plural(job.gpus, 'GPU')} idle since "
        f"{utc_minute(job.idle_since or job.since)} (squatting)"
    )


def _opportunistic(job: RunningJob, factor: float, unhealthy_hosts: frozenset[str]) -> str:
    return (
        f"job {job.job_id} of {job.project} runs opportunistically (fair share {factor:.2f}) "
        f"on {plural(job.gpus, 'GPU')} since {utc_minute(job.since)}"
    )


def _preemptible(job: RunningJob, factor: float, unhealthy_hosts: frozenset[str]) -> str:
    return (
        f"job {job.job_id} of {job.project} is a preemptible job (fair share {factor:.2f}) "
        f"on {plural(job.gpus, 'GPU')} since {utc_minute(job.since)}"
    )


def _standard(job: RunningJob, factor: float, unhealthy_hosts: frozenset[str]) -> str:
    return (
        f"job {job.job_id} of {job.project} is a standard job outside any guarantee "
        f"(fair share {factor:.2f}) on {plural(job.gpus, 'GPU')} since {utc_minute(job.since)}"
    )


_WHY: Mapping[str, Callable[[RunningJob, float, frozenset[str]], str]] = {
    UNHEALTHY_HOST: _on_unhealthy_host,
    SQUATTING: _squatting,
    OPPORTUNISTIC: _opportunistic,
    PREEMPTIBLE: _preemptible,
    STANDARD: _standard,
}


# -- the plan -----------------------------------------------------------------------------------


def plan_victims(
    running: Iterable[RunningJob],
    gpus_needed: int,
    *,
    now: int,
    fairshare: Mapping[str, float],
    unhealthy_hosts: frozenset[str],
    reach: Reach,
) -> tuple[tuple[Victim, ...], int]:
    """The jobs to preempt, in order, and the GPUs they free.

    Every job on an unhealthy host is listed; the other groups add jobs one at a time, in order,
    until the GPUs freed (unhealthy ones included) reach `gpus_needed`. When they never do, the
    plan lists every eligible job and the caller sees that the GPUs freed fall short. `now` is the
    instant of the snapshot: the order never depends on it, it is part of the signature so that a
    rule on running time can be added without changing the callers.
    """
    del now  # see the docstring: kept for the callers' sake, unused by the rules in force
    candidates: list[tuple[int, float, int, str, RunningJob, str]] = []
    for job in running:
        code = victim_group(job, unhealthy_hosts, reach)
        if code is None:
            continue
        factor = fairshare.get(job.project, DEFAULT_FAIRSHARE)
        candidates.append((VICTIM_CODES.index(code), factor, -job.since, job.job_id, job, code))
    candidates.sort(key=lambda c: c[:4])

    victims: list[Victim] = []
    freed_gpus = 0
    for _, factor, _, _, job, code in candidates:
        if code != UNHEALTHY_HOST and freed_gpus >= gpus_needed:
            break  # the unhealthy group sorts first: everything after it is optional
        reason = _WHY[code](job, factor, unhealthy_hosts)
        victims.append(
            Victim(job_id=job.job_id, project=job.project, gpus=job.gpus, code=code, reason=reason)
        )
        freed_gpus += job.gpus
    return tuple(victims), freed_gpus


def preemption_plan(
    snapshot: AdmissionSnapshot, gpus_needed: int, reach: Reach = Reach.OPPORTUNISTIC
) -> tuple[tuple[Victim, ...], int]:
    """`plan_victims` on an admission snapshot (for the HTTP endpoint that shows a plan)."""
    return plan_victims(
        snapshot.load.jobs,
        gpus_needed,
        now=snapshot.now,
        fairshare=snapshot.fairshare,
        unhealthy_hosts=snapshot.unhealthy_hosts,
        reach=reach,
    )
