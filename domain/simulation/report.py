"""The figures of one simulated run, from the engine's records alone (budgets come from outside).

All amounts are integer seconds and GPU-seconds; only utilisations and shares are floats (and
`to_dict` rounds them, so the same run gives the same bytes).

Definitions:
- capacity: every cluster's GPUs over the simulation's span (bad hosts included: a bad host is
  lost capacity);
- busy: GPU-seconds of every run (held GPUs, whatever they did);
- useful: busy minus the idle part of placeholder runs (GPU-seconds x (1 - utilisation), on the
  part of the run before any host failure) minus GPU-seconds stuck on a bad host;
- lost to preemption: GPU-seconds of preempted runs that the job does not keep (by default the
  whole run: the job starts its work again);
- queueing delay: submission to first start; a job that never started counts with the time it
  waited until the end (a lower bound), so starving a job cannot improve the figures;
  cancelled (rejected) jobs have none. Percentiles are nearest-rank, in whole seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from allmende.domain.simulation.model import (
    TOP_CLASS,
    JobOutcome,
    JobRecord,
    RunEnd,
    RunRecord,
    SimulationResult,
)

PERCENTILES = (50, 90, 99)
BASIS_POINTS = 10_000
ROUND_DIGITS = 6


def nearest_rank(sorted_values: list[int], percent: int) -> int | None:
    """The smallest value with at least `percent` % of the values at or below it."""
    if not sorted_values:
        return None
    rank = max(1, (percent * len(sorted_values) + 99) // 100)
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class DelayStats:
    jobs: int
    p50_s: int | None
    p90_s: int | None
    p99_s: int | None
    max_s: int | None

    @classmethod
    def of(cls, delays: Iterable[int]) -> DelayStats:
        values = sorted(delays)
        return cls(
            len(values),
            nearest_rank(values, 50),
            nearest_rank(values, 90),
            nearest_rank(values, 99),
            values[-1] if values else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "p50_s": self.p50_s,
            "p90_s": self.p90_s,
            "p99_s": self.p99_s,
            "max_s": self.max_s,
        }


@dataclass(frozen=True)
class ProjectBudget:
    """What the ledger charged a project against what it was allocated (charge units)."""

    charged_units: int
    allocated_units: int

    @property
    def ratio(self) -> float | None:
        return None if self.allocated_units == 0 else self.charged_units / self.allocated_units

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "charged_units": self.charged_units,
            "allocated_units": self.allocated_units,
            "ratio": None if ratio is None else round(ratio, ROUND_DIGITS),
        }


@dataclass(frozen=True)
class StuckRun:
    job_id: str
    run_no: int
    hosts: tuple[str, ...]
    gpus: int
    stalled_at: int
    stuck_s: int
    ended: RunEnd

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "run_no": self.run_no,
            "hosts": list(self.hosts),
            "gpus": self.gpus,
            "stalled_at": self.stalled_at,
            "stuck_s": self.stuck_s,
            "ended": self.ended.value,
        }


@dataclass(frozen=True)
class SimulationReport:
    run_id: str
    policy: str
    start_at: int
    end_at: int
    capacity_gpu_seconds: int
    busy_gpu_seconds: int
    useful_gpu_seconds: int
    placeholder_held_gpu_seconds: int
    placeholder_idle_gpu_seconds: int
    stuck_gpu_seconds: int
    lost_to_preemption_gpu_seconds: int
    preemptions: int
    jobs: int
    top_class_jobs: int
    outcomes: Mapping[str, int]  # every JobOutcome, each job counted once
    queue_delay: DelayStats
    queue_delay_by_project: Mapping[str, DelayStats]
    queue_delay_interactive: DelayStats
    stuck_runs: tuple[StuckRun, ...]
    decisions: int
    misfits: int
    not_arrived: int
    budgets: Mapping[str, ProjectBudget] | None = None  # filled by the adapter from the ledger
    extra: Mapping[str, int] = field(default_factory=dict)  # adapter figures (integers), shown as-is

    @property
    def busy_utilization(self) -> float:
        return self.busy_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0

    @property
    def useful_utilization(self) -> float:
        return self.useful_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0

    @property
    def top_class_share(self) -> float:
        return self.top_class_jobs / self.jobs if self.jobs else 0.0

    @property
    def stuck_seconds_total(self) -> int:
        return sum(r.stuck_s for r in self.stuck_runs)

    @property
    def stuck_seconds_max(self) -> int:
        return max((r.stuck_s for r in self.stuck_runs), default=0)

    def with_budgets(self, budgets: Mapping[str, ProjectBudget]) -> SimulationReport:
        return replace(self, budgets=dict(budgets))

    def to_dict(self) -> dict[str, Any]:
        """Plain values in a fixed order: `json.dumps` of it is the same bytes for the same run."""
        return {
            "run_id": self.run_id,
            "policy": self.policy,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "capacity_gpu_seconds": self.capacity_gpu_seconds,
            "busy_gpu_seconds": self.busy_gpu_seconds,
            "useful_gpu_seconds": self.useful_gpu_seconds,
            "busy_utilization": round(self.busy_utilization, ROUND_DIGITS),
            "useful_utilization": round(self.useful_utilization, ROUND_DIGITS),
            "placeholder_held_gpu_seconds": self.placeholder_held_gpu_seconds,
            "placeholder_idle_gpu_seconds": self.placeholder_idle_gpu_seconds,
            "stuck_gpu_seconds": self.stuck_gpu_seconds,
            "lost_to_preemption_gpu_seconds": self.lost_to_preemption_gpu_seconds,
            "preemptions": self.preemptions,
            "jobs": self.jobs,
            "top_class_jobs": self.top_class_jobs,
            "top_class_share": round(self.top_class_share, ROUND_DIGITS),
            "outcomes": {k: self.outcomes[k] for k in sorted(self.outcomes)},
            "queue_delay": self.queue_delay.to_dict(),
            "queue_delay_by_project": {
                p: self.queue_delay_by_project[p].to_dict() for p in sorted(self.queue_delay_by_project)
            },
            "queue_delay_interactive": self.queue_delay_interactive.to_dict(),
            "stuck_runs": [r.to_dict() for r in self.stuck_runs],
            "stuck_seconds_total": self.stuck_seconds_total,
            "stuck_seconds_max": self.stuck_seconds_max,
            "decisions": self.decisions,
            "misfits": self.misfits,
            "not_arrived": self.not_arrived,
            "budgets": None
            if self.budgets is None
            else {p: self.budgets[p].to_dict() for p in sorted(self.budgets)},
            "extra": {k: self.extra[k] for k in sorted(self.extra)},
        }


def _placeholder_idle(run: RunRecord, utilization: float) -> int:
    """Idle GPU-seconds of a placeholder run before any host failure (the rest is counted stuck)."""
    held = run.gpu_seconds - run.stuck_gpu_seconds
    busy_bp = min(BASIS_POINTS, max(0, round(utilization * BASIS_POINTS)))
    return held * (BASIS_POINTS - busy_bp) // BASIS_POINTS


def _delay(record: JobRecord, end_at: int) -> int | None:
    if record.outcome is JobOutcome.CANCELLED:
        return None
    first = record.first_start
    return (first if first is not None else end_at) - record.job.submit_at


def build_report(
    result: SimulationResult, budgets: Mapping[str, ProjectBudget] | None = None
) -> SimulationReport:
    busy = held = idle = stuck = lost = preemptions = top = 0
    outcomes = {o.value: 0 for o in JobOutcome}
    delays: list[int] = []
    by_project: dict[str, list[int]] = {}
    interactive: list[int] = []
    stuck_runs: list[StuckRun] = []
    for record in result.jobs:
        job = record.job
        outcomes[record.outcome.value] += 1
        top += job.priority_class is TOP_CLASS
        for run in record.runs:
            busy += run.gpu_seconds
            stuck += run.stuck_gpu_seconds
            lost += run.lost_gpu_seconds
            preemptions += run.ended is RunEnd.PREEMPTED
            if job.placeholder:
                held += run.gpu_seconds
                idle += _placeholder_idle(run, job.utilization)
            if run.stalled_at is not None and run.end > run.stalled_at:  # stopped at once: not stuck
                stuck_runs.append(
                    StuckRun(
                        job.job_id,
                        run.run_no,
                        run.hosts,
                        run.gpus,
                        run.stalled_at,
                        run.end - run.stalled_at,
                        run.ended,
                    )
                )
        delay = _delay(record, result.end_at)
        if delay is not None:
            delays.append(delay)
            by_project.setdefault(job.project, []).append(delay)
            if job.interactive:
                interactive.append(delay)
    return SimulationReport(
        run_id=result.run_id,
        policy=result.policy,
        start_at=result.start_at,
        end_at=result.end_at,
        capacity_gpu_seconds=result.capacity_gpu_seconds,
        busy_gpu_seconds=busy,
        useful_gpu_seconds=busy - idle - stuck,
        placeholder_held_gpu_seconds=held,
        placeholder_idle_gpu_seconds=idle,
        stuck_gpu_seconds=stuck,
        lost_to_preemption_gpu_seconds=lost,
        preemptions=preemptions,
        jobs=len(result.jobs),
        top_class_jobs=top,
        outcomes=outcomes,
        queue_delay=DelayStats.of(delays),
        queue_delay_by_project={p: DelayStats.of(v) for p, v in sorted(by_project.items())},
        queue_delay_interactive=DelayStats.of(interactive),
        stuck_runs=tuple(sorted(stuck_runs, key=lambda r: (r.stalled_at, r.job_id, r.run_no))),
        decisions=result.decisions,
        misfits=result.misfits,
        not_arrived=result.not_arrived,
        budgets=None if budgets is None else dict(budgets),
    )
