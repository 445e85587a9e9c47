"""The discrete-event loop: jobs arrive, a policy decides, the engine places, runs and stops them.

Time is integer simulated UTC seconds; events sit on a heap as (time, seq, ...), and the sequence
number breaks ties, so two runs with the same input process the same events in the same order.
Events: arrival, end of a run (its remaining work done), host bad / recovered, a stop a policy
asked for, a scheduling pass of one cluster's queue (after every change that frees GPUs), and two
periodic ticks (a pass over every queue; usage samples of every running job).

A preempted job goes back to the queue. By default it keeps the work it had left when the run
started (no checkpoint: the run's GPU-seconds are lost work); `keep_progress_on_preemption`
credits what the run did instead. A run on a host that goes bad makes no progress from then on,
holds its GPUs until it is stopped, and is recorded with the instant it stalled.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from allmende.domain.admission_model import JobRequest, RunningJob
from allmende.domain.simulation import lifecycle
from allmende.domain.simulation.cluster import GPUS_PER_HOST, Cluster
from allmende.domain.simulation.interfaces import Policy, SimView, Sink
from allmende.domain.simulation.model import (
    ClusterSize,
    HostFailure,
    JobOutcome,
    JobRecord,
    Queue,
    Reject,
    RunEnd,
    RunRecord,
    SimJob,
    SimulationError,
    SimulationResult,
    Start,
    Stop,
)
from allmende.domain.simulation.waiting import Entry, WaitingQueue


@dataclass(frozen=True)
class EngineConfig:
    run_id: str = "sim"  # part of every event id: use a new one per simulated run
    start_at: int | None = None  # None: the first submission
    end_at: int | None = None  # None: when no job event is left (jobs then still queued stay so)
    # A pass over every queue this often, for policies whose answers change with time (budgets,
    # time-slice windows). None for a policy that reads only the state (the baseline): every
    # change of the state already triggers a pass, so periodic ones would only repeat answers.
    reschedule_every_s: int | None = 600
    sample_every_s: int | None = None  # usage samples of running jobs; None: only the closing one
    keep_progress_on_preemption: bool = False
    # Jobs asked per pass, in queue order (those the policy promised to wait are not asked): a
    # bound on the cost of a pass over a long queue, like Slurm's default_queue_depth (100).
    max_decisions_per_pass: int = 100
    max_events: int = 50_000_000  # a runaway (preemption ping-pong) stops instead of spinning
    strict: bool = True  # a Start that cannot be placed is a policy bug; False: count it, keep queued
    gpus_per_host: int = GPUS_PER_HOST

    def __post_init__(self) -> None:
        periods = (self.reschedule_every_s, self.sample_every_s)
        if any(p is not None and p < 1 for p in periods):
            raise ValueError("periods must be at least one second")
        if self.start_at is not None and self.end_at is not None and self.end_at < self.start_at:
            raise ValueError(f"the simulation ends at {self.end_at}, before it starts at {self.start_at}")
        if self.max_decisions_per_pass < 1 or self.max_events < 1:
            raise ValueError("limits must be positive")


class _Kind(IntEnum):
    ARRIVAL = 0
    END = 1
    HOST_BAD = 2
    HOST_OK = 3
    STOP = 4
    PASS = 5  # one cluster's queue, triggered by a change: counts as pending work
    TICK = 6  # periodic pass over every queue
    SAMPLE = 7  # periodic usage samples


_PERIODIC = (_Kind.TICK, _Kind.SAMPLE)
# (time, seq, kind, key: job id or cluster, run number, extra: host or reason)
_Event = tuple[int, int, int, str, int, str]


@dataclass(slots=True)
class _Run:
    run_no: int
    start: int
    gpus: int
    hosts: tuple[str, ...]
    work_at_start_s: int
    stalled_at: int | None = None
    last_sample_at: int = -1


@dataclass(slots=True)
class _JobState:
    job: SimJob
    request: JobRequest
    remaining_s: int
    outcome: JobOutcome | None = None  # None: not arrived yet
    runs: list[RunRecord] = field(default_factory=list)
    current: _Run | None = None
    ended_at: int | None = None
    reason: str = ""


class Simulation:
    """One simulated run of `jobs` on `clusters` under `policy`; `run()` returns the records."""

    def __init__(
        self,
        clusters: Iterable[ClusterSize],
        jobs: Iterable[SimJob],
        policy: Policy,
        sink: Sink,
        config: EngineConfig = EngineConfig(),
        host_failures: Sequence[HostFailure] = (),
    ) -> None:
        self.config = config
        self.policy = policy
        self.sink = sink
        self._sizes = tuple(sorted(clusters, key=lambda c: c.name))
        self._clusters = {c.name: Cluster(c.name, c.gpus, config.gpus_per_host) for c in self._sizes}
        if len(self._clusters) != len(self._sizes):
            raise ValueError("a cluster is listed twice")
        ordered = sorted(jobs, key=lambda j: (j.submit_at, j.job_id))
        self._jobs: dict[str, _JobState] = {}
        for job in ordered:
            if job.job_id in self._jobs:
                raise ValueError(f"job id {job.job_id} is used twice")
            self._jobs[job.job_id] = _JobState(job, job.request(), job.duration_s)
        first = ordered[0].submit_at if ordered else (config.start_at or 0)
        self.start_at = first if config.start_at is None else config.start_at
        if ordered and first < self.start_at:
            raise ValueError(
                f"job {ordered[0].job_id} is submitted at {first}, before the start {self.start_at}"
            )
        self._failures = tuple(host_failures)
        self._queued: dict[str, dict[str, None]] = {name: {} for name in self._clusters}
        # Per cluster: the queue in the policy's order, grouped by the policy's promises, kept
        # between passes while the policy's `queue_version` stands.
        self._waiting: dict[str, WaitingQueue] = {name: WaitingQueue() for name in self._clusters}
        self._running: dict[str, _JobState] = {}
        self._heap: list[_Event] = []
        self._seq = 0
        self._real_pending = 0
        self._pass_pending: set[str] = set()
        self._now = self.start_at
        self._last_change_at = self.start_at
        self._closed_at: int | None = None
        self.decisions = 0
        self.events_processed = 0
        self.misfits = 0
        self.view = SimView(self._clusters, self._queued, lambda: self._now)
        self._schedule_inputs(ordered)

    # -- the heap -------------------------------------------------------------------------------
    def _push(self, at: int, kind: _Kind, key: str = "", run_no: int = 0, extra: str = "") -> None:
        if at < self._now:
            raise SimulationError(f"event {kind.name} for {key} at {at} is before now {self._now}")
        self._seq += 1
        if kind not in _PERIODIC:
            self._real_pending += 1
        heapq.heappush(self._heap, (at, self._seq, int(kind), key, run_no, extra))

    def _schedule_inputs(self, ordered: Sequence[SimJob]) -> None:
        end_at = self.config.end_at
        for job in ordered:
            if end_at is None or job.submit_at <= end_at:
                self._push(job.submit_at, _Kind.ARRIVAL, job.job_id)
        for f in sorted(self._failures, key=lambda f: (f.at, f.cluster, f.host)):
            cluster = self._clusters.get(f.cluster)
            if cluster is None or not cluster.has_host(f.host):
                raise ValueError(f"host failure names an unknown host {f.cluster}/{f.host}")
            self._push(max(f.at, self.start_at), _Kind.HOST_BAD, f.cluster, extra=f.host)
            if f.recover_at is not None:
                self._push(max(f.recover_at, self.start_at), _Kind.HOST_OK, f.cluster, extra=f.host)
        if self.config.reschedule_every_s is not None:
            self._push(self.start_at + self.config.reschedule_every_s, _Kind.TICK)
        if self.config.sample_every_s is not None:
            self._push(self.start_at + self.config.sample_every_s, _Kind.SAMPLE)

    # -- the loop -------------------------------------------------------------------------------
    @property
    def now(self) -> int:
        return self._now

    def step(self) -> bool:
        """Process the next event; False when the simulation is over."""
        if self._closed_at is not None or not self._heap:
            return False
        at = self._heap[0][0]
        if self.config.end_at is not None and at > self.config.end_at:
            return False
        _, _, kind_value, key, run_no, extra = heapq.heappop(self._heap)
        kind = _Kind(kind_value)
        if kind in _PERIODIC:
            # Ticks only matter while something else can still happen (or, with a fixed end, while
            # a queued job may yet be admitted by a policy whose answer changes with time).
            waiting = self.config.end_at is not None and self._any_queued()
            if self._real_pending == 0 and not waiting:
                return bool(self._heap) and self.step()
        else:
            self._real_pending -= 1
        self.events_processed += 1
        if self.events_processed > self.config.max_events:
            raise SimulationError(f"more than {self.config.max_events} events: a runaway simulation")
        self._now = at
        self._handle(kind, key, run_no, extra)
        return True

    def run(self) -> SimulationResult:
        while self.step():
            pass
        return self.result()

    def _handle(self, kind: _Kind, key: str, run_no: int, extra: str) -> None:
        if kind is _Kind.ARRIVAL:
            self._arrive(self._jobs[key])
        elif kind is _Kind.END:
            state = self._jobs[key]
            run = state.current
            if run is not None and run.run_no == run_no and run.stalled_at is None:
                self._finish(state, run)
        elif kind in (_Kind.HOST_BAD, _Kind.HOST_OK):
            self._host_health(key, extra, healthy=kind is _Kind.HOST_OK)
        elif kind is _Kind.STOP:
            state = self._jobs[key]
            if state.current is not None and state.current.run_no == run_no:
                self._preempt(state, extra)
        elif kind is _Kind.PASS:
            self._pass_pending.discard(key)
            self._pass(key)
        elif kind is _Kind.TICK:
            for name in self._clusters:
                if self._queued[name]:
                    self._request_pass(name)
            if self.config.reschedule_every_s is not None:
                self._push(self._now + self.config.reschedule_every_s, _Kind.TICK)
        elif kind is _Kind.SAMPLE:
            for state in list(self._running.values()):
                self._sample(state)
            if self.config.sample_every_s is not None:
                self._push(self._now + self.config.sample_every_s, _Kind.SAMPLE)

    def _any_queued(self) -> bool:
        return any(self._queued.values())

    def _changed(self) -> None:
        self._last_change_at = self._now

    # -- jobs -----------------------------------------------------------------------------------
    def _arrive(self, state: _JobState) -> None:
        self._changed()
        self.sink.emit(lifecycle.submitted(self.config.run_id, state.job))
        state.outcome = JobOutcome.QUEUED
        self._enqueue(state)
        # Only the new job is decided: nothing has been freed since the queue's last pass.
        self._try(state)

    def _try(self, state: _JobState) -> None:
        job = state.job
        self.decisions += 1
        outcome = self.policy.decide(state.request, self.view, self._now)
        if isinstance(outcome, Reject):
            self._changed()
            self._dequeue(state)
            state.outcome, state.ended_at, state.reason = JobOutcome.CANCELLED, self._now, outcome.reason
            self.sink.emit(lifecycle.cancelled(self.config.run_id, job, self._now))
        elif isinstance(outcome, Queue):
            state.reason = outcome.reason
            waiting = self._waiting.get(job.cluster)
            if waiting is not None:
                waiting.promise(job.job_id, outcome.wait_for_free_gpus, outcome.reclaimable_counts)
        elif isinstance(outcome, Start):
            self._start(state, outcome)
        else:  # pragma: no cover - the Outcome union is closed
            raise SimulationError(f"policy answered {outcome!r} for {job.job_id}")

    def _start(self, state: _JobState, outcome: Start) -> None:
        job = state.job
        cluster = self._clusters.get(job.cluster)
        if cluster is None:
            raise SimulationError(f"policy started {job.job_id} on unknown cluster {job.cluster}")
        for victim_id in dict.fromkeys(outcome.victims):
            victim = self._jobs.get(victim_id)
            if (
                victim is None
                or victim.current is None
                or victim.job.cluster != job.cluster
                or victim_id == job.job_id
            ):
                if self.config.strict:
                    raise SimulationError(
                        f"victim {victim_id} of {job.job_id} is not running on {job.cluster}"
                    )
                continue
            self._preempt(victim, f"preempted to start job {job.job_id}")
        placed = RunningJob(
            job_id=job.job_id,
            project=job.project,
            user=job.user,
            gpus=job.gpus,
            priority_class=job.priority_class.value,
            lane=outcome.lane,
            since=self._now,
            interactive=job.interactive,
        )
        hosts = cluster.place(placed)
        if hosts is None:
            if self.config.strict:
                raise SimulationError(
                    f"policy {self.policy.name} started {job.job_id} ({job.gpus} GPUs) with "
                    f"{cluster.free_healthy} free on {job.cluster}"
                )
            self.misfits += 1
            state.reason = "admitted but no room to place it"
            return
        self._changed()
        self._dequeue(state)
        run = _Run(len(state.runs) + 1, self._now, job.gpus, hosts, state.remaining_s)
        state.current, state.outcome = run, JobOutcome.RUNNING
        self._running[job.job_id] = state
        self.sink.emit(lifecycle.started(self.config.run_id, job, run.run_no, self._now, hosts))
        self._push(self._now + state.remaining_s, _Kind.END, job.job_id, run.run_no)

    def _close_run(
        self, state: _JobState, run: _Run, ended: RunEnd, progress_s: int, reason: str = ""
    ) -> None:
        self._clusters[state.job.cluster].release(state.job.job_id)
        del self._running[state.job.job_id]
        state.current = None
        state.runs.append(
            RunRecord(
                run.run_no,
                run.start,
                self._now,
                run.gpus,
                run.hosts,
                ended,
                progress_s,
                run.stalled_at,
                reason,
            )
        )

    def _done_s(self, run: _Run) -> int:
        """Seconds of work the run has done by now (none after its host went bad)."""
        until = self._now if run.stalled_at is None else run.stalled_at
        return min(run.work_at_start_s, until - run.start)

    def _finish(self, state: _JobState, run: _Run) -> None:
        self._changed()
        self._close_run(state, run, RunEnd.FINISHED, run.work_at_start_s)
        state.remaining_s, state.outcome, state.ended_at = 0, JobOutcome.FINISHED, self._now
        self.sink.emit(lifecycle.finished(self.config.run_id, state.job, run.run_no, self._now, run.start))
        self._request_pass(state.job.cluster)

    def _preempt(self, state: _JobState, reason: str) -> None:
        run = state.current
        if run is None:
            raise SimulationError(f"job {state.job.job_id} is not running")
        self._changed()
        kept = self._done_s(run) if self.config.keep_progress_on_preemption else 0
        self._close_run(state, run, RunEnd.PREEMPTED, kept, reason)
        state.remaining_s -= kept
        state.outcome, state.reason = JobOutcome.QUEUED, reason
        self._enqueue(state)
        self.sink.emit(
            lifecycle.preempted(self.config.run_id, state.job, run.run_no, self._now, run.start, reason)
        )
        self._request_pass(state.job.cluster)

    def _sample(self, state: _JobState, utilization: float | None = None) -> None:
        run = state.current
        if run is None or run.last_sample_at >= self._now or run.start >= self._now:
            return
        if utilization is None:
            utilization = 0.0 if run.stalled_at is not None else state.job.utilization
        run.last_sample_at = self._now
        self._changed()  # an emitted reading is part of the run's history: the end is never before it
        self.sink.emit(lifecycle.sample(self.config.run_id, state.job, run.run_no, self._now, utilization))

    # -- hosts and queues -------------------------------------------------------------------------
    def _host_health(self, cluster_name: str, host: str, healthy: bool) -> None:
        cluster = self._clusters[cluster_name]
        if not cluster.set_health(host, healthy):
            return
        self._changed()
        if not healthy:
            for running in cluster.jobs_on(host):
                state = self._jobs[running.job_id]
                run = state.current
                if run is not None and run.stalled_at is None:
                    if self.config.sample_every_s is not None:
                        self._sample(state, state.job.utilization)  # closes the span it was working
                    run.stalled_at = self._now
        stops = self.policy.on_host_health(cluster_name, host, healthy, self.view, self._now)
        self._apply_stops(stops)
        self._request_pass(cluster_name)

    def _apply_stops(self, stops: Iterable[Stop]) -> None:
        for stop in stops:
            state = self._jobs.get(stop.job_id)
            if state is None or state.current is None:
                if self.config.strict:
                    raise SimulationError(f"policy stops {stop.job_id}, which is not running")
                continue
            if stop.at < self._now:
                raise SimulationError(f"policy stops {stop.job_id} at {stop.at}, in the past ({self._now})")
            if stop.at == self._now:
                self._preempt(state, stop.reason)
            else:
                self._push(stop.at, _Kind.STOP, stop.job_id, state.current.run_no, stop.reason)

    def _request_pass(self, cluster: str) -> None:
        # One pass per cluster and instant, after everything else due at this instant.
        if cluster not in self._pass_pending and cluster in self._clusters:
            self._pass_pending.add(cluster)
            self._push(self._now, _Kind.PASS, cluster)

    def _enqueue(self, state: _JobState) -> None:
        job_id, cluster = state.job.job_id, state.job.cluster
        self._queued.setdefault(cluster, {})[job_id] = None
        waiting = self._waiting.get(cluster)
        if waiting is not None:
            waiting.add(job_id, self._entry(job_id))

    def _dequeue(self, state: _JobState) -> None:
        job_id, cluster = state.job.job_id, state.job.cluster
        self._queued.get(cluster, {}).pop(job_id, None)
        waiting = self._waiting.get(cluster)
        if waiting is not None:
            waiting.remove(job_id)

    def _reclaimable(self, cluster: str) -> int:
        reclaimable = getattr(self.policy, "reclaimable_gpus", None)
        return 0 if reclaimable is None else int(reclaimable(cluster))

    def _pass(self, cluster: str) -> None:
        waiting = self._waiting[cluster]
        if not waiting:
            return
        waiting.rekey(getattr(self.policy, "queue_version", None), self._entry)
        # Backfill: a job that does not fit waits, the ones behind it may still start.
        place = self._clusters[cluster]
        decided, last = 0, None
        while decided < self.config.max_decisions_per_pass:
            # Jobs the policy promised the same answer until more GPUs are free are not asked.
            last = waiting.next_after(last, place.free_healthy, self._reclaimable(cluster))
            if last is None:
                break
            decided += 1
            self._try(self._jobs[last[2]])

    def _entry(self, job_id: str) -> Entry:
        state = self._jobs[job_id]
        key = self.policy.queue_key(state.request, state.job.submit_at, self._now)
        return (key, state.job.submit_at, job_id)

    # -- the end --------------------------------------------------------------------------------
    def _close(self) -> int:
        if self._closed_at is not None:
            return self._closed_at
        end = self.config.end_at if self.config.end_at is not None else self._last_change_at
        self._now = max(self._now, end) if self.config.end_at is not None else end
        for state in list(self._running.values()):
            run = state.current
            if run is None:
                continue
            # A closing reading gives the ledger the GPU-seconds of runs that are still going.
            self._sample(state)
            self._close_run(state, run, RunEnd.CUT, self._done_s(run))
            state.outcome = JobOutcome.RUNNING
        self._closed_at = end
        return end

    def result(self) -> SimulationResult:
        """Close the simulation (runs still going are cut at its end) and return the records."""
        end = self._close()
        records = tuple(
            JobRecord(s.job, s.outcome, tuple(s.runs), s.ended_at, s.reason)
            for s in self._jobs.values()
            if s.outcome is not None
        )
        return SimulationResult(
            run_id=self.config.run_id,
            policy=self.policy.name,
            start_at=self.start_at,
            end_at=end,
            clusters=self._sizes,
            jobs=records,
            decisions=self.decisions,
            events_processed=self.events_processed,
            misfits=self.misfits,
            host_failures=self._failures,
            not_arrived=sum(1 for s in self._jobs.values() if s.outcome is None),
        )

    def fingerprint(self) -> tuple[object, ...]:
        """The engine's whole state, to check that something (a policy's decision) changed none of it."""
        return (
            self._now,
            tuple(sorted(self._heap)),
            tuple((name, c.fingerprint()) for name, c in sorted(self._clusters.items())),
            tuple((name, tuple(q)) for name, q in sorted(self._queued.items())),
            tuple(
                (s.job.job_id, s.remaining_s, s.outcome, tuple(s.runs), repr(s.current), s.reason)
                for s in self._jobs.values()
            ),
            self.decisions,
        )


def simulate(
    clusters: Iterable[ClusterSize],
    jobs: Iterable[SimJob],
    policy: Policy,
    sink: Sink,
    config: EngineConfig = EngineConfig(),
    host_failures: Sequence[HostFailure] = (),
) -> SimulationResult:
    """Run a whole simulation (use `Simulation.step` to drive it piecewise, e.g. for a progress bar)."""
    return Simulation(clusters, jobs, policy, sink, config, host_failures).run()
