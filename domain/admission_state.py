"""The admission service's state: the fold of its own events and of the job lifecycle.

Two streams feed it: the admission log (decisions, holds placed and released, host health: this
service's own events, one partition) and the job events (what the scheduler reports: started on
which hosts, preempted, finished). Job lifecycle is folded order-free (the latest event by
time and rank wins; a finish is final), so the state after a replay equals the live one.

A job occupies GPUs of its cluster from its admission (a reservation, until it starts or its
start deadline passes) or its start, until it is preempted or finishes. A hold is spent by the
job's charges as they reach the ledger (two-phase: placed at admission, converted by usage,
released when the job ends or never started).

Memory holds what is live plus one retention period (`retire`): a job that ended, or was decided
and never ran, is let go of once `retention_s` has passed since its last event. The admission log
and ClickHouse keep its history. A later copy of an event of a job let go of (older than the last
event of a job let go of from the same partition) is ignored (`observe` returns False): it cannot
make a retired job run again. A live producer's event is that old only when it comes a whole
retention late; the meter dead-letters those.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from allmende.domain.admission_model import ClusterLoad, Lane, RunningJob
from allmende.domain.metering import utilization_bp
from allmende.domain.squatting import SquatRule, idle_since
from allmende.schemas.admission_events import (
    AdmissionDecided,
    AdmissionEvent,
    HoldPlaced,
    HoldReleased,
    HostRecovered,
    HostUnhealthy,
)
from allmende.schemas.events import (
    JobEvent,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)

_STARTED, _PREEMPTED, _FINISHED = 3, 1, 2  # ranks at the same second, as the meter orders them


@dataclass(slots=True)
class Hold:
    job_id: str
    project: str
    allocations: tuple[tuple[str, int], ...]
    expires_at: int
    released: bool = False

    def remaining(self, charged: int) -> dict[str, int]:
        """What is still held per allocation once `charged` units of the job's usage are posted;
        usage spends the hold in the order it was placed."""
        left: dict[str, int] = {}
        spent = max(0, charged)
        for allocation_id, units in self.allocations:
            used = min(units, spent)
            spent -= used
            if units - used:
                left[allocation_id] = left.get(allocation_id, 0) + units - used
        return left


@dataclass(slots=True)
class JobSeen:
    job_id: str
    cluster: str = ""
    project: str = ""
    user: str = ""
    gpus: int = 0
    priority_class: str = "standard"
    interactive: bool = False
    requested_seconds: int = 0  # the run time asked for (0: unknown)
    lane: Lane | None = None
    admitted_at: int | None = None
    started: bool = False
    since: int = 0
    hosts: tuple[str, ...] = ()
    finished: bool = False
    last: tuple[int, int] = (0, 0)  # (time, rank) of the latest lifecycle event
    preemptions: tuple[tuple[int, str], ...] = ()  # (at, reason) of every preemption, sorted
    # Latest usage readings, busy and idle (squatting rule): maxima, so folding is order-free.
    busy_read_at: int = 0
    low_read_at: int = 0
    idle_since: int | None = None  # squatting since then (AdmissionState.squat), else None
    partition: int = -1  # of its job events (-1: none seen)
    _running: RunningJob | None = field(default=None, repr=False, compare=False)

    def may_hold_gpus(self) -> bool:
        """Started, or admitted and not yet started (its deadline aside), and not ended."""
        return not self.finished and (self.started or (self.admitted_at is not None and self.last == (0, 0)))

    def holds_gpus(self, now: int, start_deadline_s: int) -> bool:
        """May hold GPUs, and a reservation has not passed its start deadline."""
        return self.may_hold_gpus() and (self.started or now < (self.admitted_at or 0) + start_deadline_s)

    def as_running(self) -> RunningJob:
        if self._running is None:
            self._running = self._build()
        return self._running

    def _build(self) -> RunningJob:
        return RunningJob(
            job_id=self.job_id, project=self.project, user=self.user, gpus=self.gpus,
            priority_class=self.priority_class, lane=self.lane, since=self.since, hosts=self.hosts,
            interactive=self.interactive, idle_since=self.idle_since, started=self.started,
            requested_seconds=self.requested_seconds,
        )  # fmt: skip


# What an admit sets on the job (the rest comes from its lifecycle events, which a void keeps).
_ADMIT_FIELDS = (
    "cluster",
    "project",
    "user",
    "gpus",
    "priority_class",
    "interactive",
    "requested_seconds",
    "lane",
    "admitted_at",
    "since",
)
JobRecord = AdmissionDecided | HoldPlaced  # what a decision appends for its job


@dataclass(frozen=True, slots=True)
class Tentative:
    """A decision and its hold folded before the log holds them, and what they replaced, so that
    `AdmissionState.void` can take them back if the log does not take them in time."""

    events: tuple[JobRecord, ...]
    decision: AdmissionDecided | None
    hold: Hold | None
    job: JobSeen | None  # a copy of the job as it was (None: not seen before)


@dataclass(slots=True)
class AdmissionState:
    decisions: dict[str, AdmissionDecided] = field(default_factory=dict)
    holds: dict[str, Hold] = field(default_factory=dict)
    jobs: dict[str, JobSeen] = field(default_factory=dict)
    unhealthy: set[tuple[str, str]] = field(default_factory=set)
    # Event ids folded, per job (let go of with it) and of host reports (id -> instant, let go of
    # after the retention): a copy of an event in the log counts once.
    _seen: dict[str, set[str]] = field(default_factory=dict)
    _seen_hosts: dict[str, int] = field(default_factory=dict)
    # None: nothing is let go of (the simulator's runs). Else the retention in seconds, with a heap
    # of (instant the job may be let go of, job) and each job-event partition's clock.
    retention_s: int | None = None
    _retire_at: list[tuple[int, str]] = field(default_factory=list)
    # Per job-event partition, the latest last event of a job let go of: older events of jobs
    # not held are late copies.
    _retired_through: dict[int, int] = field(default_factory=dict)
    # Indexes, so a decision costs what the cluster holds now, not everything ever admitted.
    live: dict[str, ClusterLoad] = field(default_factory=dict)  # cluster -> jobs on it
    active_holds: dict[str, dict[str, Hold]] = field(default_factory=dict)  # project -> job -> hold
    # Heap of (admitted at, job): at its start deadline a job that has not started leaves its
    # cluster's load, and its hold is due.
    _start_deadlines: list[tuple[int, str]] = field(default_factory=list)
    # Units of the active holds per project and allocation, and which of those jobs run (only a
    # running job's usage can have spent part of its hold).
    _held_base: dict[str, dict[str, int]] = field(default_factory=dict)
    _spending: dict[str, set[str]] = field(default_factory=dict)
    # What `releasable` reads instead of every active hold: jobs with a hold that ended, a heap of
    # hold expiries, and holds found due but not yet released.
    _ended: set[str] = field(default_factory=set)
    _expiries: list[tuple[int, str]] = field(default_factory=list)
    _due: dict[str, str] = field(default_factory=dict)
    preempted: set[str] = field(default_factory=set)  # jobs with a preemption: the dashboards read them
    # Squatting jobs are preemption victims (domain.preemption); None: readings are not followed.
    squat: SquatRule | None = None

    def _idle(self, job: JobSeen) -> bool:
        """Set whether the job squats now, from its readings; True when that changed."""
        found = None
        if self.squat is not None and job.started:
            found = idle_since(job.since, job.busy_read_at, job.low_read_at, self.squat)
        changed = found != job.idle_since
        job.idle_since = found
        return changed

    def _reading(self, job: JobSeen, at: int, bp: int) -> None:
        """A reading of the job's GPUs (order-free: two maxima); a reading changes nothing else
        admission knows."""
        if self.squat is None:
            return
        if self.squat.idle(bp):
            job.low_read_at = max(job.low_read_at, at)
        else:
            job.busy_read_at = max(job.busy_read_at, at)
        if self._idle(job):
            self._reindex(job)

    def read_gpus(self, job_id: str, at: int, utilization_bp: int) -> bool:
        """A GPU sample of the job's GPUs on one node (dcgm-exporter, docs/dcgm.md), read as a
        JobUsageSample's reading: a busy node keeps the whole job from squatting, so only a job
        idle on every node it was read on is a victim. A sample never brings in a job admission
        does not know (False then)."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        self._reading(job, at, utilization_bp)
        return True

    def _reindex(self, job: JobSeen) -> None:
        job._running = None
        for cluster, jobs in self.live.items():
            if cluster != job.cluster:
                jobs.pop(job.job_id)
        if job.cluster and job.may_hold_gpus():
            self.live.setdefault(job.cluster, ClusterLoad()).put(job.as_running())
        elif job.cluster in self.live:
            self.live[job.cluster].pop(job.job_id)
        hold = self.holds.get(job.job_id)
        if hold is not None and not hold.released:
            if job.started or job.last != (0, 0):
                self._spending.setdefault(hold.project, set()).add(job.job_id)
            if job.may_hold_gpus():
                self._ended.discard(job.job_id)
            else:
                self._ended.add(job.job_id)

    def _count_hold(self, hold: Hold, sign: int) -> None:
        base = self._held_base.setdefault(hold.project, {})
        for allocation_id, units in hold.allocations:
            base[allocation_id] = base.get(allocation_id, 0) + sign * units
        if sign < 0:
            self._spending.get(hold.project, set()).discard(hold.job_id)

    # -- folds --------------------------------------------------------------------------------
    def apply(self, event: AdmissionEvent) -> bool:
        """Fold one admission event (each id once); False for a duplicate, or for a release of
        no hold, which stays unseen: a copy of it after the hold is the one that counts."""
        job_id = getattr(event, "job_id", None)
        if event.event_id in (self._seen.get(job_id, ()) if job_id is not None else self._seen_hosts):
            return False
        if isinstance(event, HoldReleased) and event.job_id not in self.holds:
            return False
        if job_id is not None:
            self._seen.setdefault(job_id, set()).add(event.event_id)
            self._retire_later(event.occurred_at, job_id)
        else:
            self._seen_hosts[event.event_id] = event.occurred_at
        match event:
            case AdmissionDecided():
                self.decisions[event.job_id] = event
                if event.verdict == "admit":
                    job = self.jobs.setdefault(event.job_id, JobSeen(event.job_id))
                    job.cluster, job.project, job.user = event.cluster, event.project, event.user
                    job.gpus, job.priority_class = event.gpus, event.priority_class
                    job.interactive, job.lane = event.interactive, Lane(event.lane) if event.lane else None
                    job.requested_seconds = event.requested_seconds
                    job.admitted_at = event.occurred_at
                    job.since = job.since or event.occurred_at
                    self._reindex(job)
                    heapq.heappush(self._start_deadlines, (event.occurred_at, event.job_id))
            case HoldPlaced():
                hold = Hold(event.job_id, event.project, tuple(event.allocations), event.expires_at)
                self.holds[event.job_id] = hold
                self.active_holds.setdefault(event.project, {})[event.job_id] = hold
                self._count_hold(hold, 1)
                heapq.heappush(self._expiries, (event.expires_at, event.job_id))
                if event.job_id in self.jobs:
                    self._reindex(self.jobs[event.job_id])
            case HoldReleased():
                released = self.holds.get(event.job_id)
                if released is not None and not released.released:
                    released.released = True
                    self.active_holds.get(released.project, {}).pop(event.job_id, None)
                    self._count_hold(released, -1)
                    self._ended.discard(event.job_id)
                    self._due.pop(event.job_id, None)
            case HostUnhealthy():
                self.unhealthy.add((event.cluster, event.host))
            case HostRecovered():
                self.unhealthy.discard((event.cluster, event.host))
        return True

    def apply_tentative(self, events: Sequence[JobRecord]) -> Tentative:
        """Fold one job's decision (and hold) now, so the next decision sees its GPUs and units,
        while the log is still to take them."""
        job_id = events[0].job_id
        assert all(e.job_id == job_id for e in events)
        job = self.jobs.get(job_id)
        before = Tentative(
            tuple(events), self.decisions.get(job_id), self.holds.get(job_id), replace(job) if job else None
        )
        for event in events:
            self.apply(event)
        return before

    def redo(self, tentative: Tentative) -> bool:
        """Fold again a voided decision the log took after all (its acknowledgement came after its
        answer's deadline), so the state is the log's fold again; False, and nothing done, when
        the job was decided anew meanwhile."""
        job_id = tentative.events[0].job_id
        if self.decisions.get(job_id) is not tentative.decision:
            return False
        for event in tentative.events:
            self.apply(event)
        return True

    def void(self, tentative: Tentative) -> None:
        """Take back a tentative decision and hold: the state is as if they had never come (the
        same events, appended to the log too late, are void there as well)."""
        for event in tentative.events:
            job_id = event.job_id
            self._seen.get(job_id, set()).discard(event.event_id)
            if isinstance(event, HoldPlaced):
                hold = self.holds.get(job_id)
                if hold is not None and not hold.released:
                    self.active_holds.get(hold.project, {}).pop(job_id, None)
                    self._count_hold(hold, -1)
                    self._ended.discard(job_id)
                    self._due.pop(job_id, None)
                if tentative.hold is None:
                    self.holds.pop(job_id, None)
                else:
                    self.holds[job_id] = tentative.hold
            elif isinstance(event, AdmissionDecided):
                if tentative.decision is None:
                    self.decisions.pop(job_id, None)
                else:
                    self.decisions[job_id] = tentative.decision
        job_id = tentative.events[0].job_id
        job = self.jobs.get(job_id)
        if job is None:
            return
        if tentative.job is None and job.last == (0, 0) and not job.busy_read_at and not job.low_read_at:
            del self.jobs[job_id]  # seen only through the voided admit
            for load in self.live.values():
                load.pop(job_id)
            return
        for name in _ADMIT_FIELDS:  # as it was; lifecycle events folded meanwhile stay
            setattr(
                job, name, getattr(tentative.job, name) if tentative.job else getattr(JobSeen(job_id), name)
            )
        self._reindex(job)

    def observe(self, event: JobEvent, partition: int = 0) -> bool:
        """Fold one job lifecycle event, in any order: the latest by (time, rank) decides. False
        (ignored) for a timed event of a job not held that is older than the last event of a job
        let go of from the same partition (a job's events share one): a late copy, which must
        not bring a job let go of back as running. (A submission carries the instant the job
        was queued: never late.)"""
        job = self.jobs.get(event.job_id)
        if job is None and not isinstance(event, JobSubmitted):
            through = self._retired_through.get(partition)
            if through is not None and event.occurred_at < through:
                return False
        if job is None:
            job = self.jobs[event.job_id] = JobSeen(event.job_id)
            self._retire_later(event.occurred_at, event.job_id)
        job.partition = partition
        if isinstance(event, JobUsageSample):
            self._reading(job, event.occurred_at, utilization_bp(event.gpu_utilization))
            return True
        match event:
            case JobSubmitted():
                if not job.cluster:  # an admission decision knows better, if there was one
                    job.cluster, job.project, job.user = event.cluster, event.project, event.user
                    job.gpus, job.priority_class = event.gpus, event.priority_class.value
                    job.interactive = event.interactive
                job.requested_seconds = job.requested_seconds or event.requested_seconds
            case JobStarted():
                if (event.occurred_at, _STARTED) > job.last:
                    job.last = (event.occurred_at, _STARTED)
                    job.started, job.since, job.hosts = True, event.occurred_at, tuple(event.hosts)
                    job.gpus = event.gpus
            case JobPreempted():
                suffered = (event.occurred_at, event.reason)
                if suffered not in job.preemptions:  # a redelivered copy is the same preemption
                    job.preemptions = tuple(sorted((*job.preemptions, suffered)))
                    self.preempted.add(job.job_id)
                if (event.occurred_at, _PREEMPTED) > job.last:
                    job.last = (event.occurred_at, _PREEMPTED)
                    job.started = False
            case JobFinished():
                job.finished = True
                job.last = max(job.last, (event.occurred_at, _FINISHED))
                job.started = False
        if isinstance(event, JobPreempted | JobFinished):
            self._retire_later(event.occurred_at, job.job_id)
        self._idle(job)
        self._reindex(job)
        return True

    def adopt(self, jobs: Mapping[str, JobSeen]) -> None:
        """Take the lifecycle folded elsewhere (job events read while the own log was replayed)."""
        for job_id, seen in jobs.items():
            held = self.jobs.get(job_id)
            if seen.preemptions:
                self.preempted.add(job_id)
            if held is None:
                self.jobs[job_id] = seen
                self._idle(seen)
                self._reindex(seen)
            elif seen.last > held.last or seen.finished:
                held.started, held.since, held.hosts = seen.started, seen.since or held.since, seen.hosts
                held.finished, held.last = held.finished or seen.finished, max(held.last, seen.last)
                held.gpus = seen.gpus or held.gpus
                held.requested_seconds = held.requested_seconds or seen.requested_seconds
            if held is not None:
                held.busy_read_at = max(held.busy_read_at, seen.busy_read_at)
                held.low_read_at = max(held.low_read_at, seen.low_read_at)
                self._idle(held)
                self._reindex(held)
            if held is not None and seen.preemptions:
                held.preemptions = tuple(sorted(set(held.preemptions) | set(seen.preemptions)))

    # -- letting go ---------------------------------------------------------------------------
    def _retire_later(self, at: int, job_id: str) -> None:
        if self.retention_s is not None:
            heapq.heappush(self._retire_at, (at + self.retention_s, job_id))

    def _last_activity(self, job_id: str, start_deadline_s: int) -> int | None:
        """The job's latest instant (a reservation's: its start deadline), or None while it runs
        or has a hold (released first, by `releasable`'s rules: then it may go)."""
        hold = self.holds.get(job_id)
        if hold is not None and not hold.released:
            return None
        decided = self.decisions.get(job_id)
        last = decided.occurred_at if decided is not None else 0
        job = self.jobs.get(job_id)
        if job is not None:
            if job.started or (decided is None and job.last == (0, 0)):
                return None  # running, or known by its submission alone: its start is on the way
            last = max(
                last, job.last[0], job.busy_read_at, job.low_read_at, *(at for at, _ in job.preemptions)
            )
            if job.may_hold_gpus():  # admitted, not started: holds its GPUs until its start deadline
                last = max(last, (job.admitted_at or 0) + start_deadline_s)
        return last

    def retire(
        self, now: int, start_deadline_s: int, busy: Container[str] = (), decided_through: int | None = None
    ) -> list[str]:
        """Let go of the jobs whose last event is `retention_s` or more before `now` and that hold
        no GPUs and no hold (ended, never started, queued or rejected and not asked again), but
        those in `busy` (a decision on its way to the log) and those decided after
        `decided_through` (the decision history has not taken them yet). Returns their ids.
        Costs what is due: jobs come off a heap of instants; one with a later event goes back."""
        if self.retention_s is None:
            return []
        retired: list[str] = []
        while self._retire_at and self._retire_at[0][0] <= now:
            _, job_id = heapq.heappop(self._retire_at)
            if job_id not in self.jobs and job_id not in self.decisions:
                continue  # let go of already (a job has several entries on the heap)
            last = self._last_activity(job_id, start_deadline_s)
            if last is None or job_id in busy:
                continue  # its end, start deadline or release pushes it again
            decided = self.decisions.get(job_id)
            if decided is not None and decided_through is not None and decided.occurred_at > decided_through:
                heapq.heappush(self._retire_at, (now + 1, job_id))  # asked again next round
                continue
            if last + self.retention_s > now:
                heapq.heappush(self._retire_at, (last + self.retention_s, job_id))
                continue
            job = self.jobs.get(job_id)
            if job is not None and job.partition >= 0:
                through = self._retired_through.get(job.partition, last)
                self._retired_through[job.partition] = max(through, last)
            self._forget(job_id)
            retired.append(job_id)
        horizon = now - self.retention_s
        for event_id in [e for e, at in self._seen_hosts.items() if at <= horizon]:
            del self._seen_hosts[event_id]
        if retired:
            self._compact_heaps()
        return retired

    def _compact_heaps(self) -> None:
        """Drop the heap entries of jobs let go of, once they are most of a heap: a start deadline
        or hold expiry is due only an hour or more after admission, and its entry would keep the
        job's id (and the heap) growing with every job admitted meanwhile."""
        limit = 2 * (len(self.jobs) + len(self.decisions) + 1024)
        if len(self._start_deadlines) > limit:
            self._start_deadlines = _kept(self._start_deadlines, self.jobs)
        if len(self._expiries) > limit:
            self._expiries = _kept(self._expiries, self.holds)
        if len(self._retire_at) > limit:
            self._retire_at = _kept(self._retire_at, self.jobs.keys() | self.decisions.keys())

    def _forget(self, job_id: str) -> None:
        self.decisions.pop(job_id, None)
        self.jobs.pop(job_id, None)
        self.holds.pop(job_id, None)
        self._seen.pop(job_id, None)
        self.preempted.discard(job_id)
        self._ended.discard(job_id)
        self._due.pop(job_id, None)
        for load in self.live.values():
            load.pop(job_id)

    # -- reads --------------------------------------------------------------------------------
    def load_on(self, cluster: str, now: int, start_deadline_s: int) -> ClusterLoad:
        """The jobs holding GPUs of the cluster at `now`, which must not go back between calls (a
        live view: read it under the lock that guards this state)."""
        self._pass_start_deadlines(now, start_deadline_s)
        return self.live.setdefault(cluster, ClusterLoad())

    def _pass_start_deadlines(self, now: int, start_deadline_s: int) -> None:
        """Jobs admitted `start_deadline_s` or longer ago: a reservation that did not start leaves
        its cluster's load for good, and a hold whose job holds no GPUs is due."""
        while self._start_deadlines and self._start_deadlines[0][0] + start_deadline_s <= now:
            admitted_at, job_id = heapq.heappop(self._start_deadlines)
            job = self.jobs.get(job_id)
            if job is None or job.admitted_at != admitted_at:  # an admit voided since
                continue
            if not job.started and job.last == (0, 0) and job.cluster in self.live:
                self.live[job.cluster].pop(job_id)
            hold = self.holds.get(job_id)
            if hold is not None and not hold.released and not job.holds_gpus(now, start_deadline_s):
                self._due[job_id] = "expired"

    def unhealthy_hosts(self, cluster: str) -> frozenset[str]:
        return frozenset(host for c, host in self.unhealthy if c == cluster)

    def held(self, job_charges: Mapping[str, int], project: str | None = None) -> dict[str, int]:
        """Units still held per allocation (active holds, less what usage has spent)."""
        found: dict[str, int] = {}
        for name in [project] if project is not None else list(self._held_base):
            for allocation_id, units in self._held_base.get(name, {}).items():
                found[allocation_id] = found.get(allocation_id, 0) + units
            # Only jobs that ran can have spent part of their hold: correct for those alone, as
            # `Hold.remaining` spends a hold (in the order it was placed). Inlined: this runs per
            # running job of the project on every admission request.
            holds = self.holds
            for job_id in self._spending.get(name, ()):
                spent = job_charges.get(job_id, 0)
                if spent <= 0:
                    continue
                for allocation_id, units in holds[job_id].allocations:
                    used = units if units < spent else spent
                    found[allocation_id] -= used
                    spent -= used
                    if not spent:
                        break
        return {a: units for a, units in found.items() if units}

    def releasable(self, now: int, start_deadline_s: int) -> list[tuple[str, str]]:
        """(job id, reason) of active holds whose job ended or did not start in time, by job id.

        Costs what is due, not what is held: ended jobs are collected as they end, and expiries
        and start deadlines come off heaps. A read: asked again without releasing, it answers the same."""
        while self._expiries and self._expiries[0][0] <= now:
            _, job_id = heapq.heappop(self._expiries)
            expiring = self.holds.get(job_id)
            if expiring is not None and not expiring.released:  # released before: nothing due
                self._due[job_id] = "expired"
        self._pass_start_deadlines(now, start_deadline_s)
        due = {}
        for job_id in self._ended | self._due.keys():
            hold = self.holds.get(job_id)
            if hold is None or hold.released:
                self._ended.discard(job_id)  # kept no longer: each read would walk it again
                self._due.pop(job_id, None)
                continue
            job = self.jobs.get(job_id)
            if job is not None and job.finished:
                due[job_id] = "finished"
            elif job is not None and job.last[1] == _PREEMPTED:
                due[job_id] = "preempted"
            elif (
                job_id not in self._ended
                and now < hold.expires_at
                and job is not None
                and job.holds_gpus(now, start_deadline_s)
            ):
                del self._due[job_id]  # found late for its start, then it started: no longer due
            else:  # past its expiry or start deadline, or never to hold GPUs again
                due[job_id] = "expired"
        return sorted(due.items())

    # -- checkpoints (services/admission_service.py): the state as plain data, and back ---------
    def dump(self) -> dict[str, Any]:
        """Everything a replay would rebuild, as JSON-able data in one canonical order: the same
        state gives the same data. Heaps keep their list order (a heap is a list with an order);
        the indexes that point at holds and jobs are dumped as ids. Not the settings (`retention_s`,
        `squat`): the restoring service gives its own, and a checkpoint taken under others is not
        loaded (its fingerprint)."""
        return dump_of(self.capture())

    def capture(self) -> dict[str, Any]:
        """What `dump` reads, as immutable values (references to frozen events, tuples): cheap
        enough to take under the lock that guards the state; `dump_of` orders it outside."""
        return {
            "decisions": dict(self.decisions),
            "holds": [_HOLD_ROW(h) for h in self.holds.values()],
            "jobs": [_JOB_ROW(j) for j in self.jobs.values()],
            "unhealthy": tuple(self.unhealthy),
            "seen": [(j, tuple(ids)) for j, ids in self._seen.items()],
            "seen_hosts": tuple(self._seen_hosts.items()),
            "retire_at": tuple(self._retire_at),
            "retired_through": tuple(self._retired_through.items()),
            "live": [(c, tuple(j.job_id for j in load.jobs)) for c, load in self.live.items()],
            "active_holds": [(p, tuple(h)) for p, h in self.active_holds.items()],
            "start_deadlines": tuple(self._start_deadlines),
            "held_base": [(p, tuple(b.items())) for p, b in self._held_base.items()],
            "spending": [(p, tuple(j)) for p, j in self._spending.items()],
            "ended": tuple(self._ended),
            "expiries": tuple(self._expiries),
            "due": tuple(self._due.items()),
            "preempted": tuple(self.preempted),
        }

    @classmethod
    def restore(
        cls, data: Mapping[str, Any], retention_s: int | None = None, squat: SquatRule | None = None
    ) -> AdmissionState:
        """The state `dump` was taken of. ValueError (or KeyError, TypeError) when the data cannot
        be what `dump` gave."""
        state = cls(retention_s=retention_s, squat=squat)
        for raw in data["decisions"]:
            decided = raw if isinstance(raw, AdmissionDecided) else AdmissionDecided.model_validate(raw)
            state.decisions[decided.job_id] = decided
        for job_id, project, allocations, expires_at, released in data["holds"]:
            pairs = tuple((str(a), _int(u)) for a, u in allocations)
            state.holds[job_id] = Hold(job_id, project, pairs, _int(expires_at), bool(released))
        for row in data["jobs"]:
            job = _job_of(row)
            state.jobs[job.job_id] = job
        state.unhealthy = {(c, h) for c, h in data["unhealthy"]}
        state._seen = {j: set(ids) for j, ids in data["seen"].items()}
        state._seen_hosts = {e: _int(at) for e, at in data["seen_hosts"].items()}
        state._retire_at = _heap(data["retire_at"])
        state._retired_through = {_int(p): _int(at) for p, at in data["retired_through"]}
        state.live = {
            c: ClusterLoad(state.jobs[j].as_running() for j in ids) for c, ids in data["live"].items()
        }
        state.active_holds = {p: {j: state.holds[j] for j in ids} for p, ids in data["active_holds"].items()}
        state._start_deadlines = _heap(data["start_deadlines"])
        state._held_base = {p: {a: _int(u) for a, u in b.items()} for p, b in data["held_base"].items()}
        state._spending = {p: set(ids) for p, ids in data["spending"].items()}
        state._ended = set(data["ended"])
        state._expiries = _heap(data["expiries"])
        state._due = dict(data["due"])
        state.preempted = set(data["preempted"])
        return state

    @classmethod
    def of(cls, events: Iterable[AdmissionEvent], job_events: Iterable[JobEvent] = ()) -> AdmissionState:
        state = cls()
        for event in events:
            state.apply(event)
        for job_event in job_events:
            state.observe(job_event)
        return state


def _kept(heap: list[tuple[int, str]], jobs: Container[str]) -> list[tuple[int, str]]:
    """The heap's entries of `jobs`, a heap again."""
    kept = [entry for entry in heap if entry[1] in jobs]
    heapq.heapify(kept)
    return kept


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"a checkpoint holds {value!r} where an integer belongs")
    return value


def _heap(rows: Iterable[Sequence[Any]]) -> list[tuple[int, str]]:
    """A dumped heap: its entries as tuples (a list entry would not compare with a pushed tuple),
    in its order, checked."""
    heap = [(_int(at), str(job)) for at, job in rows]
    if any(heap[(i - 1) // 2] > heap[i] for i in range(1, len(heap))):
        raise ValueError("a dumped heap is not in heap order")
    return heap


_JOB_FIELDS = (
    "job_id", "cluster", "project", "user", "gpus", "priority_class", "interactive", "requested_seconds",
    "lane", "admitted_at", "started", "since", "hosts", "finished", "last", "preemptions", "busy_read_at",
    "low_read_at", "idle_since", "partition",
)  # fmt: skip


_JOB_ROW = operator.attrgetter(*_JOB_FIELDS)  # every field's value is immutable: a snapshot
_HOLD_ROW = operator.attrgetter("job_id", "project", "allocations", "expires_at", "released")


def dump_of(captured: dict[str, Any]) -> dict[str, Any]:
    """`AdmissionState.dump`'s data from what `capture` took: sorted, as lists."""
    c = captured
    decisions = c["decisions"]
    return {
        # The frozen events themselves: serialised later, outside the caller's lock.
        "decisions": [decisions[j] for j in sorted(decisions)],
        "holds": [[j, p, [list(a) for a in allocations], expires, released]
                  for j, p, allocations, expires, released in sorted(c["holds"])],
        "jobs": [[list(v) if isinstance(v, tuple) else v for v in row]
                 for row in sorted(c["jobs"], key=_first)],
        "unhealthy": sorted([cl, h] for cl, h in c["unhealthy"]),
        "seen": {j: sorted(ids) for j, ids in sorted(c["seen"])},
        "seen_hosts": dict(sorted(c["seen_hosts"])),
        "retire_at": [list(e) for e in c["retire_at"]],
        "retired_through": sorted([p, at] for p, at in c["retired_through"]),
        "live": {cl: sorted(ids) for cl, ids in sorted(c["live"])},
        "active_holds": {p: sorted(ids) for p, ids in sorted(c["active_holds"])},
        "start_deadlines": [list(e) for e in c["start_deadlines"]],
        "held_base": {p: dict(sorted(b)) for p, b in sorted(c["held_base"])},
        "spending": {p: sorted(ids) for p, ids in sorted(c["spending"])},
        "ended": sorted(c["ended"]),
        "expiries": [list(e) for e in c["expiries"]],
        "due": dict(sorted(c["due"])),
        "preempted": sorted(c["preempted"]),
    }  # fmt: skip


def _first(row: tuple[Any, ...]) -> Any:
    return row[0]


def _job_of(row: Sequence[Any]) -> JobSeen:
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    for name in ("gpus", "requested_seconds", "since", "busy_read_at", "low_read_at", "partition"):
        _int(values[name])
    values["lane"] = Lane(values["lane"]) if values["lane"] is not None else None
    values["hosts"] = tuple(values["hosts"])
    values["last"] = (_int(values["last"][0]), _int(values["last"][1]))  # compared with tuples
    values["preemptions"] = tuple((_int(at), str(why)) for at, why in values["preemptions"])
    return JobSeen(**values)
