"""The policies `allmende simulate` can run, by name: each factory builds one from a plan.

`POLICIES` maps a name to `factory(plan, args) -> Policy`; the command runs every registered
policy unless told otherwise, in the registry's order. A policy whose answers depend on time
(budgets, time-slice windows) wants the engine's periodic passes; one that reads only the
engine's state does not, and says so in `RESCHEDULE_EVERY_S` (absent: the engine's default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from allmende.domain.plan_file import Plan
from allmende.domain.simulation.baseline import HOUR_S, BaselineConfig, BaselinePolicy, protected_by_shares
from allmende.domain.simulation.engine import EngineConfig
from allmende.domain.simulation.from_plan import clusters_from_plan, project_shares
from allmende.domain.simulation.interfaces import Policy


@dataclass(frozen=True)
class PolicyArgs:
    """What a factory may use besides the plan: the run's options and the workload it will see."""

    seed: int = 0
    on_call_hours: float = 4.0  # the baseline: a non-preemptible job on a bad host waits this long
    protected_percent: int = 50  # the baseline: share of every cluster's GPUs protected per project
    projects: tuple[str, ...] = ()  # the projects that submit jobs in the simulated workload

    def __post_init__(self) -> None:
        if self.on_call_hours < 0:
            raise ValueError(f"the on-call delay cannot be negative, got {self.on_call_hours} hours")
        if not 0 <= self.protected_percent <= 100:
            raise ValueError(f"the protected percent must be 0..100, got {self.protected_percent}")


PolicyFactory = Callable[[Plan, PolicyArgs], Policy]


def protection_shares(plan: Plan, projects: tuple[str, ...]) -> dict[str, int]:
    """Whom the baseline protects GPUs for: the plan's projects that submit jobs, by their plan
    shares; when none of the workload's projects is in the plan (a trace from elsewhere), every
    project of the workload with an equal share. An empty workload: every project of the plan."""
    shares = project_shares(plan)
    if not projects:
        return shares
    known = {p: shares[p] for p in sorted(set(projects)) if p in shares}
    return known or dict.fromkeys(sorted(set(projects)), 1)


def baseline(plan: Plan, args: PolicyArgs) -> Policy:
    clusters = clusters_from_plan(plan)
    protected = protected_by_shares(
        {c.name: c.gpus for c in clusters}, protection_shares(plan, args.projects), args.protected_percent
    )
    return BaselinePolicy(
        BaselineConfig(protected_gpus=protected, on_call_delay_s=round(args.on_call_hours * HOUR_S))
    )


POLICIES: dict[str, PolicyFactory] = {"baseline": baseline}

# Policies that charge by priority class, as users see it when they pick one: the plan's
# multipliers (the platform's charges). Absent: priority is free (the baseline's static classes).
PRICES_CLASSES = {"platform"}


def class_prices(policy: str, plan: Plan) -> dict[str, int] | None:
    """The priority classes' prices a user of `policy` faces (hundredths), or None when free."""
    if policy not in PRICES_CLASSES or plan.policy is None:
        return None
    return dict(plan.policy.hundredths()["priority_multipliers"])


# Periodic passes over every queue per policy (None: none; the baseline reads only the state).
RESCHEDULE_EVERY_S: dict[str, int | None] = {"baseline": None}
# Policies whose Start may not fit the engine's placement: the platform counts GPUs of jobs it
# admitted that have not started yet, so its view of a cluster can be fuller than the engine's
# (a misfit is counted and the job stays queued, instead of stopping the run).
LOOSE_PLACEMENT = frozenset({"platform"})


def engine_config(policy: str, run_id: str, sample_every_s: int | None = None) -> EngineConfig:
    default = EngineConfig().reschedule_every_s
    return EngineConfig(
        run_id=run_id,
        reschedule_every_s=RESCHEDULE_EVERY_S.get(policy, default),
        sample_every_s=sample_every_s,
        strict=policy not in LOOSE_PLACEMENT,
    )
