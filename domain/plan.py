"""Plan against state: the admin events that make the state what a plan file describes.

`diff` is pure: the same plan and the same state give the same changes, with the same event ids
(`plan:<name>:<log position>:<n>`), so a plan submitted twice at once is applied once, and a plan
applied twice changes nothing the second time (the second diff is empty).

A plan manages what it describes. Clusters, nodes and policies are declared or changed, never
removed. Allocations are granted, or set to the plan's amount by an adjustment (transfers made
since are left alone: the plan sets the granted part); an allocation or agreement that an earlier
apply of the *same* plan created and the plan no longer lists is revoked (allocations are
adjusted to zero).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Literal, TypedDict

from allmende.domain.admin_state import AdminState
from allmende.domain.allocations import UNITS_PER_GPU_HOUR, Allocation
from allmende.domain.organisation import Cluster, Node
from allmende.domain.plan_file import AgreementSpec, Plan, to_unix
from allmende.schemas.admin_events import (
    AdminEvent,
    AgreementGranted,
    AgreementRevoked,
    AllocationAdjusted,
    AllocationExtended,
    AllocationGranted,
    ClusterDeclared,
    FixedWindowSpec,
    NodeDeclared,
    PolicyChanged,
    WeeklyWindowSpec,
    WindowSpec,
)

Action = Literal["declare", "change", "grant", "adjust", "revoke"]


class PlanConflict(ValueError):
    """The plan contradicts the state in a way only a person can resolve (reuse of an id)."""

    def __init__(self, message: str, where: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.where = where  # the place in the file: ("allocations", 2)


class _Envelope(TypedDict):
    event_id: str
    occurred_at: int
    actor: str
    source: str
    reason: str


@dataclass(frozen=True)
class Change:
    action: Action
    target: str
    detail: str
    event: AdminEvent
    where: tuple[str | int, ...] = ()  # the place in the file it comes from (none for revocations)


def hours(units: int) -> str:
    return f"{Decimal(units) / UNITS_PER_GPU_HOUR:f} GPU-hours"


def _window(spec: AgreementSpec, period: tuple[int, int]) -> WindowSpec:
    if spec.fixed is not None:
        return FixedWindowSpec(start=to_unix(spec.fixed.start, "start"), end=to_unix(spec.fixed.end, "end"))
    weekly = spec.weekly
    if weekly is None:
        raise ValueError(f"agreement {spec.id} has no window")  # the model requires one: a bug
    hour, minute = (int(part) for part in weekly.start.split(":"))
    return WeeklyWindowSpec(
        weekdays=weekly.weekdays(),
        hour=hour,
        minute=minute,
        duration_s=int(weekly.hours * 3600),
        time_zone=weekly.time_zone,
        valid_from=to_unix(weekly.valid_from, "valid_from") if weekly.valid_from is not None else period[0],
        valid_until=to_unix(weekly.valid_until, "valid_until")
        if weekly.valid_until is not None
        else period[1],
    )


def _depth(nodes: dict[str, str | None], node_id: str) -> int:
    depth, current = 0, nodes.get(node_id)
    while current is not None and depth <= len(nodes):
        depth, current = depth + 1, nodes.get(current)
    return depth


def _planned_end(state: AdminState, allocation: Allocation, period_end: int) -> int:
    """The end a plan gave the allocation: an approved extension (AllocationExtended) moved it on,
    and the allocation is still the plan's."""
    extended = allocation.end > period_end and any(
        isinstance(state.by_id.get(e), AllocationExtended) for e in allocation.event_ids
    )
    return period_end if extended else allocation.end


def diff(
    plan: Plan, state: AdminState, *, actor: str, now: int, charged: Callable[[Allocation], int] = lambda _: 0
) -> list[Change]:
    """The changes that bring `state` to `plan`, in an order the rules accept (parents first)."""
    source = f"plan:{plan.plan}"
    position = len(state.history)
    changes: list[Change] = []
    event: AdminEvent
    period = plan.bounds()
    label = plan.period_label()

    def envelope() -> _Envelope:
        return {
            "event_id": f"{source}:{position}:pending",  # numbered once the order is final
            "occurred_at": now,
            "actor": actor,
            "source": source,
            "reason": f"plan {plan.plan} for {label}",
        }

    for i, c in enumerate(plan.clusters):
        held = state.clusters.get(c.name)
        if held != Cluster(c.name, c.gpu_type, c.gpus):
            event = ClusterDeclared(**envelope(), cluster=c.name, gpu_type=c.gpu_type, gpus=c.gpus)
            what = f"{c.gpus} {c.gpu_type} GPUs" + (f" (was {held.gpus} {held.gpu_type})" if held else "")
            action: Action = "change" if held else "declare"
            changes.append(Change(action, f"cluster {c.name}", what, event, ("clusters", i)))

    parents = {
        **{n.node_id: n.parent for n in state.nodes.values()},
        **{n.id: n.parent for n in plan.organisation},
    }
    at_line = {n.id: i for i, n in enumerate(plan.organisation)}
    for n in sorted(plan.organisation, key=lambda n: _depth(parents, n.id)):
        held_node = state.nodes.get(n.id)
        wanted = Node(n.id, n.parent, n.kind, n.shares, tuple(n.leads))
        if held_node != wanted:
            event = NodeDeclared(
                **envelope(),
                node_id=n.id, parent=n.parent, kind=n.kind, shares=n.shares, leads=tuple(n.leads),
            )  # fmt: skip
            what = (
                f"{n.kind} under {n.parent or 'root'}, shares {n.shares}, leads {', '.join(n.leads) or '-'}"
            )
            action = "change" if held_node else "declare"
            changes.append(Change(action, f"{n.kind} {n.id}", what, event, ("organisation", at_line[n.id])))

    if plan.policy is not None:
        p = plan.policy
        rates = p.hundredths()
        effective_from = (
            to_unix(p.effective_from, "effective_from") if p.effective_from is not None else period[0]
        )
        held_policy = state.policies.get(p.id)
        if held_policy is None:
            event = PolicyChanged(**envelope(), policy_id=p.id, effective_from=effective_from, **rates)
            since = dt.datetime.fromtimestamp(effective_from, dt.UTC).isoformat()
            changes.append(Change("declare", f"policy {p.id}", f"in force from {since}", event, ("policy",)))
        elif (held_policy.effective_from, held_policy.gpu_type_weights, held_policy.default_gpu_type_weight,
              held_policy.priority_multipliers, held_policy.interactive_rate) != (
              effective_from, rates["gpu_type_weights"], rates["default_gpu_type_weight"],
              rates["priority_multipliers"], rates["interactive_rate"]):  # fmt: skip
            raise PlanConflict(
                f"policy {p.id} exists with other rates; a new price list needs a new policy id", ("policy",)
            )

    listed = set()
    for i, a in enumerate(plan.allocations):
        where: tuple[str | int, ...] = ("allocations", i)
        allocation_id = a.allocation_id(label)
        listed.add(allocation_id)
        held_alloc = state.allocations.get(allocation_id)
        if held_alloc is None:
            event = AllocationGranted(
                **envelope(),
                allocation_id=allocation_id, project=a.project, period=label, period_start=period[0],
                period_end=period[1], amount_units=a.amount_units, cluster=a.cluster, gpu_type=a.gpu_type,
                rollover=a.rollover,
            )  # fmt: skip
            changes.append(
                Change("grant", f"allocation {allocation_id}", hours(a.amount_units), event, where)
            )
            continue
        end = _planned_end(state, held_alloc, period[1])
        if (held_alloc.project, held_alloc.start, end, held_alloc.cluster, held_alloc.gpu_type,
                held_alloc.rollover) != (a.project, *period, a.cluster, a.gpu_type, a.rollover):  # fmt: skip
            raise PlanConflict(
                f"allocation {allocation_id} exists with another project, period or scope; "
                "give it another id",
                where,
            )
        set_part = held_alloc.granted_units + held_alloc.adjusted_units
        if set_part != a.amount_units and not held_alloc.expired:
            if held_alloc.allocated_units + a.amount_units - set_part < 0:
                raise PlanConflict(
                    f"allocation {allocation_id} has moved {held_alloc.transferred_out_units} units out "
                    f"by transfers; it cannot be set to {hours(a.amount_units)}",
                    where,
                )
            event = AllocationAdjusted(
                **envelope(), allocation_id=allocation_id, delta_units=a.amount_units - set_part
            )
            changes.append(
                Change(
                    "adjust",
                    f"allocation {allocation_id}",
                    f"{hours(set_part)} -> {hours(a.amount_units)}",
                    event,
                    where,
                )
            )
    for held_alloc in sorted(state.allocations.values(), key=lambda x: x.allocation_id):
        set_part = held_alloc.granted_units + held_alloc.adjusted_units
        ours = any(e.source == source for e in state.history if isinstance(e, AllocationGranted)
                   and e.allocation_id == held_alloc.allocation_id)  # fmt: skip
        # What the plan granted and nobody spent goes back: not what transfers moved out, not
        # what usage already charged; units transferred in came from other budgets and stay. Only
        # this plan's period: the same plan name for the next quarter leaves the last one alone.
        unspent = held_alloc.allocated_units - charged(held_alloc)
        take_back = max(0, min(set_part, unspent))
        this_period = (held_alloc.start, _planned_end(state, held_alloc, period[1])) == period
        if (
            ours
            and this_period
            and held_alloc.allocation_id not in listed
            and take_back > 0
            and not held_alloc.expired
        ):
            event = AllocationAdjusted(
                **envelope(), allocation_id=held_alloc.allocation_id, delta_units=-take_back
            )
            left = hours(held_alloc.allocated_units - take_back)
            changes.append(
                Change(
                    "revoke",
                    f"allocation {held_alloc.allocation_id}",
                    f"{hours(take_back)} back, {left} left",
                    event,
                )
            )

    listed_agreements = set()
    for i, g in enumerate(plan.agreements):
        listed_agreements.add(g.id)
        window = _window(g, period)
        held_agreement = state.agreements.get(g.id)
        if held_agreement is None:
            event = AgreementGranted(
                **envelope(),
                agreement_id=g.id,
                project=g.project,
                cluster=g.cluster,
                gpus=g.gpus,
                window=window,
            )
            what = f"{g.gpus} GPUs of {g.cluster} for {g.project}, {window.kind} window"
            changes.append(Change("grant", f"agreement {g.id}", what, event, ("agreements", i)))
            continue
        held_terms = (
            held_agreement.project,
            held_agreement.cluster,
            held_agreement.gpus,
            held_agreement.window,
        )
        if g.id in state.revoked or held_terms != (g.project, g.cluster, g.gpus, window):
            raise PlanConflict(
                f"agreement {g.id} exists with other terms (or was revoked); give it a new id",
                ("agreements", i),
            )
    for agreement_id, granted in sorted(state.agreements.items()):
        if (
            granted.source == source
            and agreement_id not in listed_agreements
            and agreement_id not in state.revoked
        ):
            event = AgreementRevoked(**envelope(), agreement_id=agreement_id)
            changes.append(Change("revoke", f"agreement {agreement_id}", "no longer in the plan", event))
    # Revocations first: they free the capacity and budget that grants and shrinks may need.
    ordered = [c for c in changes if c.action == "revoke"] + [c for c in changes if c.action != "revoke"]
    return [
        replace(c, event=c.event.model_copy(update={"event_id": f"{source}:{position}:{n}"}))
        for n, c in enumerate(ordered)
    ]
