"""The platform as a simulator policy: the real admission service, fed on the simulation's clock.

`PlatformPolicy` answers the simulator (`domain.simulation`) with the admission service's own
decision path (`AdmissionService.decide_unrecorded`: validation, snapshot, `domain.admission`,
holds), on a clock the simulation sets; nothing here reads the wall clock. Its inputs are fed
synchronously, in simulated-time order, so two runs with the same seed decide the same:

- the plan's admin events, folded once (`PlanAdmin`, in place of the Kafka-backed admin log);
- every lifecycle event the engine emits (`observe`): into the admission state (running jobs,
  holds) and through the real meter logic (`domain.metering.JobMeter`) into the usage that budgets
  and fair share read (`FairShareCalculator.usage`, as the ledger stream would fill it);
- fair-share factors recomputed every `factors_every_s` simulated seconds (6 h by default: beside a
  half-life of days they barely move in that time, and a recompute costs tens of milliseconds).

Every admission event (decisions, holds, releases, host reports) is kept in `recorded`, in order,
for the run's own admission log.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import cast

from allmende.core.settings import Settings
from allmende.domain.admin_state import AdminState
from allmende.domain.admission_model import JobRequest, Lane
from allmende.domain.charging import PolicyTimeline
from allmende.domain.fairshare.usage import UsageLedger
from allmende.domain.metering import JobMeter
from allmende.domain.plan import diff
from allmende.domain.plan_file import Plan
from allmende.domain.preemption import class_rank, fairshare_rank, stop_action
from allmende.domain.simulation.interfaces import SimEvent, SimView, Sink
from allmende.domain.simulation.model import Outcome, Queue, Reject, Start, Stop
from allmende.domain.simulation.report import ProjectBudget
from allmende.schemas.admission_events import AdmissionEvent
from allmende.schemas.events import JobFinished, JobPreempted
from allmende.services.admission_service import AdmissionRefused, AdmissionService
from allmende.streams.admin_log import AdminLog
from allmende.streams.fairshare_calculator import FairShareCalculator

ACTOR = "allmende-simulator"


class PlanAdmin:
    """The admin log's two reads the services make (`state`, `timeline()`), from a plan folded
    once at the start of its period: a simulated run has no admin changes while it runs."""

    def __init__(self, plan: Plan) -> None:
        state = AdminState()
        for change in diff(plan, state, actor=ACTOR, now=plan.bounds()[0]):
            state.apply(change.event)
        self.state = state
        self._timeline = state.timeline()

    def timeline(self) -> PolicyTimeline:
        return self._timeline


class PlatformPolicy:
    """`domain.simulation.interfaces.Policy` answered by the admission service."""

    name = "platform"

    def __init__(self, plan: Plan, settings: Settings, factors_every_s: int = 6 * 3600) -> None:
        self.admin = PlanAdmin(plan)
        # Duck-typed: the services read only `state` and `timeline()` of the admin log.
        admin_log = cast(AdminLog, self.admin)
        self.calculator = FairShareCalculator(settings, admin_log)
        self.now = plan.bounds()[0]
        self.service = AdmissionService(settings, admin_log, self.calculator, clock=lambda: self.now)
        self.calculator.ready.set()  # fed synchronously: always caught up
        self.factors_every_s = factors_every_s
        self._factors_due = 0
        self.accounting = Accounting(self.admin, self.calculator.usage, self.calculator.lock)
        self.recorded: list[AdmissionEvent] = []
        self._keys: dict[tuple[str, str], tuple[int, int]] = {}  # (project, class) -> queue key
        self._levels: dict[str | None, int] = {}  # project -> place in fair-share order
        self.queue_version = 0  # the engine keeps its queue order while this stands
        # Victims the plan says to cancel (squatters, `stop_action`): the engine requeues every
        # victim, and their next decision ends them, as the Slurm agent's scancel would.
        self._to_cancel: dict[str, str] = {}
        self._released_at: int | None = None

    def reclaimable_gpus(self, cluster: str) -> int:
        """GPUs of squatting jobs on the cluster: any job in a lane that may preempt takes them."""
        load = self.service.state.live.get(cluster)
        return 0 if load is None else load.squatting_gpus

    # -- inputs --------------------------------------------------------------------------------
    def observe(self, event: SimEvent) -> None:
        """One lifecycle event, as the admission service and the meter would see it from Kafka."""
        self.service.state.observe(event)
        self.accounting.observe(event)
        if isinstance(event, JobPreempted | JobFinished):
            self._released_at = None  # a hold may be due: look again at the next decision

    def _tick(self, now: int) -> None:
        self.now = now
        # Holds come due as runs end or time passes: looked for once per instant and end.
        if self._released_at != now:
            self._released_at = now
            self.recorded.extend(self.service.release_unrecorded(ACTOR))
        if now >= self._factors_due:
            self.calculator.latest = self.calculator.snapshot()
            self._factors_due = now + self.factors_every_s
            levels = self._factor_levels()
            if levels != self._levels:  # the projects' order changed: new keys, new queue order
                self._levels = levels
                self._keys.clear()
                self.queue_version += 1

    # -- the Policy protocol --------------------------------------------------------------------
    def decide(self, job: JobRequest, view: SimView, now: int) -> Outcome:
        self._tick(now)
        cancelled = self._to_cancel.pop(job.job_id, None)
        if cancelled is not None:
            return Reject(cancelled)
        prior = self.service.state.decisions.get(job.job_id)
        if prior is not None and prior.verdict == "admit":
            # Requeued after a preemption: the job keeps its decision (as a Slurm requeue keeps
            # the job and its admin comment) and starts again once GPUs are free; its victims
            # were stopped already.
            if view.free_gpus(job.cluster) >= job.gpus:
                return Start(reason="requeued: starts again", lane=Lane(prior.lane) if prior.lane else None)
            return Queue("requeued: waiting for free GPUs", wait_for_free_gpus=job.gpus)
        try:
            answer, events = self.service.decide_unrecorded(job, ACTOR)
        except AdmissionRefused as exc:  # unknown project or cluster, more GPUs than the cluster
            return Reject(str(exc))
        self.recorded.extend(events)
        sentence = " ".join(r.message for r in answer.reasons)
        if answer.verdict == "admit":
            for victim in answer.preempt:
                if stop_action(victim.code, "requeue") == "cancel":
                    self._to_cancel[victim.job_id] = f"cancelled to start job {job.job_id}: {victim.reason}"
            lane = Lane(answer.lane) if answer.lane else None
            return Start(victims=tuple(v.job_id for v in answer.preempt), reason=sentence, lane=lane)
        if answer.verdict == "reject":
            return Reject(sentence)
        codes = {r.code for r in answer.reasons}
        # Promises are in the engine's free GPUs; the service may count fewer free (a job it
        # admitted that has not been placed holds a reservation until its start deadline), and
        # the answer stays the same until the engine has that many more free too.
        engine_free = view.free_gpus(job.cluster)
        gap = max(0, engine_free - self._service_free(job.cluster))
        if "no-idle-gpus" in codes:  # over budget: it needs that many idle GPUs, nothing less
            return Queue(sentence, wait_for_free_gpus=job.gpus + gap)
        if "cluster-full" in codes:  # not even with preemption: ask again once a GPU frees up
            # (or a job starts squatting: the GPUs it holds can be taken, as free ones)
            room = engine_free - gap + self.reclaimable_gpus(job.cluster)
            return Queue(sentence, wait_for_free_gpus=min(job.gpus, room + 1) + gap, reclaimable_counts=True)
        return Queue(sentence)

    def _service_free(self, cluster: str) -> int:
        """Free GPUs of the cluster as the admission service counts them."""
        load = self.service.state.load_on(cluster, self.now, self.service.settings.admission_start_deadline_s)
        return self.admin.state.clusters[cluster].gpus - load.used_gpus

    def queue_key(self, job: JobRequest, submitted_at: int, now: int) -> tuple[int, ...]:
        """Priority class, then the project's fair-share factor, highest first (the order the
        Slurm agent asks held jobs in). The engine asks for every queued job at every pass: the
        keys are kept until the factors change."""
        key = self._keys.get((job.project, job.priority_class))
        if key is None:
            level = self._levels.get(job.project, self._levels.get(None, 0))
            key = self._keys[(job.project, job.priority_class)] = (class_rank(job.priority_class), level)
        return key

    def _factor_levels(self) -> dict[str | None, int]:
        """Each project's place in fair-share order (`fairshare_rank`, densely numbered; None: a
        project without a factor). Keys from places, not factors, stay the same while the order
        does, so the engine keeps its sorted queue across recomputes that move no project."""
        factors = self.calculator.current_factors()
        ranks: dict[str | None, int] = {p: fairshare_rank(f) for p, f in factors.items()}
        ranks[None] = fairshare_rank(None)
        place = {rank: i for i, rank in enumerate(sorted(set(ranks.values())))}
        return {project: place[rank] for project, rank in ranks.items()}

    def on_host_health(
        self, cluster: str, host: str, healthy: bool, view: SimView, now: int
    ) -> tuple[Stop, ...]:
        """The Slurm agent's rule: a bad host is reported, and every job on it is requeued."""
        self._tick(now)
        reason = "" if healthy else f"simulated: host {host} went bad"
        self.recorded.append(self.service.host_unrecorded(cluster, host, healthy, reason, ACTOR))
        if healthy:
            return ()
        return tuple(
            Stop(j.job_id, now, f"host {host} is unhealthy") for j in view.jobs_on_host(cluster, host)
        )

    # -- results -------------------------------------------------------------------------------
    def budgets(self) -> dict[str, ProjectBudget]:
        return self.accounting.budgets()

    def gpu_seconds(self) -> dict[str, int]:
        return self.accounting.gpu_seconds()


class Accounting:
    """The meter's logic and the usage ledger, fed event by event: what the ledger will charge,
    known at once (budgets for the platform's decisions; for any policy, its budget adherence)."""

    def __init__(
        self, admin: PlanAdmin, usage: UsageLedger | None = None, lock: threading.Lock | None = None
    ) -> None:
        self.admin = admin
        self.usage = usage if usage is not None else UsageLedger()
        self.lock = lock if lock is not None else threading.Lock()
        self._meters: dict[str, JobMeter] = {}

    def observe(self, event: SimEvent) -> None:
        meter = self._meters.get(event.job_id)
        if meter is None:
            meter = self._meters[event.job_id] = JobMeter(job_id=event.job_id)
        entries = meter.apply(event)
        timeline = self.admin.timeline()
        with self.lock:
            for entry in entries:
                self.usage.apply(entry, timeline)

    def emit(self, event: SimEvent) -> None:  # a Sink too
        self.observe(event)

    def budgets(self, charged: Mapping[str, int] | None = None) -> dict[str, ProjectBudget]:
        """Charged against allocated (charge units), per project with an allocation; `charged`
        (the ledger's, through the pipeline) in place of this metering's when given."""
        state = self.admin.state
        found = {}
        for project in state.projects():
            allocated = sum(a.allocated_units for a in state.allocations_of(project))
            if allocated:
                used = charged.get(project, 0) if charged is not None else self.usage.charge_units(project)
                found[project] = ProjectBudget(used, allocated)
        return found

    def gpu_seconds(self) -> dict[str, int]:
        """GPU-seconds the meter logic counted per job (the ledger must hold the same)."""
        return {job_id: meter.gpu_seconds() for job_id, meter in self._meters.items()}


class ObservingSink:
    """Hands every event to the platform (or an `Accounting`) first, then on."""

    def __init__(self, policy: PlatformPolicy | Accounting, inner: Sink | None = None) -> None:
        self.policy = policy
        self.inner = inner

    def emit(self, event: SimEvent) -> None:
        self.policy.observe(event)
        if self.inner is not None:
            self.inner.emit(event)
