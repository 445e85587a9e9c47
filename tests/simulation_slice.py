"""A Philly slice and a plan for it: what the simulator's tests run (unit and through Kafka)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

from allmende.core.trace_files import read_trace
from allmende.domain.plan_file import Plan, parse_plan
from allmende.domain.simulation.behaviours import Behaviours, workload
from allmende.domain.simulation.model import HostFailure, SimJob
from allmende.domain.simulation.policies import class_prices
from allmende.domain.traces import TraceFormat, TraceJob

ROOT = Path(__file__).resolve().parents[1]
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly" / "philly_jobs_15000.csv"
HOUR = 3600
ON_CALL_S = 4 * HOUR
GPUS = 64


@functools.cache
def trace() -> tuple[TraceJob, ...]:
    """300 jobs from a busy stretch of the Philly cut (2017-09-20, about 3 hours of submissions)."""
    return tuple(list(read_trace(PHILLY, TraceFormat.PHILLY, limit=5_300))[5_000:])


@functools.cache
def plan() -> Plan:
    return parse_plan(plan_text(trace()))


def plan_text(jobs: Iterable[TraceJob]) -> str:
    """2017-Q3 on one 64-GPU cluster: every project allocated 1.2x the GPU-hours its trace jobs
    use (so squatting on top does not fit for free), philly-team-04 guaranteed 16 GPUs on 09-20."""
    used: dict[str, int] = {}
    for job in jobs:
        used[job.project] = used.get(job.project, 0) + job.gpu_seconds
    projects = "\n".join(f"  - {{id: {p}, parent: lab, kind: project, shares: 10}}" for p in sorted(used))
    allocations = "\n".join(
        f"  - {{project: {p}, gpu_hours: {round(1.2 * s / HOUR, 2)}}}" for p, s in sorted(used.items())
    )
    return f"""
plan: philly-test
period: 2017-Q3
clusters:
  - {{name: philly, gpu_type: P100, gpus: {GPUS}}}
organisation:
  - {{id: lab, kind: organisation, shares: 100}}
{projects}
policy:
  id: prices
  effective_from: 2017-01-01T00:00:00Z
  gpu_type_weights: {{P100: 1.00}}
  default_gpu_type_weight: 1.00
  priority_multipliers: {{preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}}
  interactive_rate: 1.25
allocations:
{allocations}
agreements:
  - {{id: team-04-day, project: philly-team-04, cluster: philly, gpus: 16,
      fixed: {{start: 2017-09-20T00:00:00Z, end: 2017-09-21T00:00:00Z}}}}
"""


def behaviours(seed: int) -> Behaviours:
    at = trace()[0].submit_at + HOUR
    return Behaviours(
        seed=seed,
        placeholder_user_share=0.3,
        inflating_user_share=0.3,
        interactive_share=0.2,
        host_failures=(HostFailure("philly", "philly-n001", at, recover_at=at + 12 * HOUR),),
    )


@functools.cache
def jobs(seed: int, policy: str = "baseline") -> tuple[SimJob, ...]:
    """The workload as submitted to `policy`: users pick their classes knowing its prices."""
    return tuple(workload(trace(), behaviours(seed), prices=class_prices(policy, plan())))
