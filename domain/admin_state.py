"""The admin state: the fold of the admin events, and the rules a new admin event must pass.

`AdminState.apply` folds events already on the log (in log order, each event id once). `check`
is the guard a command passes *before* its event is published: it raises an `AdminRejected`
subclass whose message says what is wrong and, where it can, what would be right. Events on the
log are never re-judged: a replay folds them as they were accepted.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace

from allmende.domain.allocation_requests import AllocationRequest
from allmende.domain.allocations import Allocation, rollover_successor
from allmende.domain.charging import ChargePolicy, PolicyInvalid, PolicyTimeline, flat_policy
from allmende.domain.organisation import ROOT, Cluster, Node, TreeInvalid, check_node
from allmende.domain.timeslices import (
    MAX_RANGE,
    Agreement,
    AgreementInvalid,
    FixedWindow,
    WeeklyWindow,
    find_overbooking,
)
from allmende.schemas.admin_events import (
    AdminEvent,
    AgreementGranted,
    AgreementRevoked,
    AllocationAdjusted,
    AllocationExpired,
    AllocationExtended,
    AllocationGranted,
    AllocationRequestDecided,
    AllocationRequested,
    AllocationTransferred,
    ClusterDeclared,
    DisputeResolved,
    FixedWindowSpec,
    NodeDeclared,
    PolicyChanged,
    UsageDisputed,
    WindowSpec,
)


class AdminRejected(ValueError):
    """A command the rules refuse; `code` is machine-readable, the message is for people."""

    code = "rejected"


class UnknownReference(AdminRejected):
    code = "unknown"


class Conflict(AdminRejected):
    code = "conflict"


class InsufficientBudget(AdminRejected):
    code = "insufficient-budget"


class RetroactivePolicy(AdminRejected):
    code = "retroactive-policy"


class Overbooked(AdminRejected):
    code = "overbooked"

    def __init__(self, message: str, conflicting: tuple[str, ...]) -> None:
        super().__init__(message)
        self.conflicting = conflicting


class InvalidChange(AdminRejected):
    code = "invalid"


def policy_of(event: PolicyChanged) -> ChargePolicy:
    return ChargePolicy(
        policy_id=event.policy_id,
        effective_from=event.effective_from,
        gpu_type_weights=dict(event.gpu_type_weights),
        priority_multipliers={str(k): v for k, v in event.priority_multipliers.items()},
        interactive_rate=event.interactive_rate,
        default_gpu_type_weight=event.default_gpu_type_weight,
    )


def window_of(spec: WindowSpec) -> FixedWindow | WeeklyWindow:
    if isinstance(spec, FixedWindowSpec):
        return FixedWindow(spec.start, spec.end)
    return WeeklyWindow(
        weekdays=frozenset(spec.weekdays),  # type: ignore[arg-type]
        hour=spec.hour,
        minute=spec.minute,
        duration=spec.duration_s,
        time_zone=spec.time_zone,
        valid_from=spec.valid_from,
        valid_until=spec.valid_until,
    )


def agreement_of(event: AgreementGranted) -> Agreement:
    return Agreement(event.agreement_id, event.project, event.cluster, event.gpus, window_of(event.window))


def _span(agreement: Agreement) -> tuple[int, int]:
    w = agreement.window
    return (w.start, w.end) if isinstance(w, FixedWindow) else (w.valid_from, w.valid_until)


def first_overbooking(
    existing: Iterable[Agreement], candidate: Agreement, cluster_gpus: int
) -> tuple[int, int, tuple[str, ...]] | None:
    """(instant, GPUs guaranteed, conflicting ids) where `candidate` overbooks its cluster, or None.

    The candidate's whole span is swept in slices of at most 400 days (the sweep's bound).
    """
    others = [
        a for a in existing if a.cluster == candidate.cluster and a.agreement_id != candidate.agreement_id
    ]
    start, end = _span(candidate)
    while start < end:
        stop = min(end, start + MAX_RANGE)
        found = find_overbooking(others, candidate, cluster_gpus, start, stop)
        if found is not None:
            return found.at, found.total_gpus, found.conflicting
        start = stop
    return None


# What the rules need from outside the admin log: the ledger's charges (a port, not a database).
ChargedUnits = Callable[[Allocation], int]


@dataclass(frozen=True, slots=True)
class Dispute:
    """A job's disputed usage and its resolution. Its stage only grows (0 none, 1 disputed,
    2 charged, 3 dropped), so the meter's revision of the job's entries grows with it."""

    raised: UsageDisputed
    resolved: DisputeResolved | None = None

    @property
    def stage(self) -> int:
        if self.resolved is None:
            return DISPUTED
        return CHARGED if self.resolved.action == "charge" else DROPPED

    @property
    def withheld(self) -> bool:
        """Charged to no project: disputed and not (yet) resolved to charge."""
        return self.stage != CHARGED


NOT_DISPUTED, DISPUTED, CHARGED, DROPPED = 0, 1, 2, 3


@dataclass
class AdminState:
    nodes: dict[str, Node] = field(default_factory=dict)
    clusters: dict[str, Cluster] = field(default_factory=dict)
    policies: dict[str, PolicyChanged] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    agreements: dict[str, AgreementGranted] = field(default_factory=dict)
    revoked: dict[str, AgreementRevoked] = field(default_factory=dict)
    # Disputed usage per job: raised, and how it was resolved (None: not yet).
    disputes: dict[str, Dispute] = field(default_factory=dict)
    # Leads' requests for more (domain/allocation_requests.py), with their decisions.
    requests: dict[str, AllocationRequest] = field(default_factory=dict)
    history: list[AdminEvent] = field(default_factory=list)
    by_id: dict[str, AdminEvent] = field(default_factory=dict)  # every event applied, by id
    # Built from `agreements` on first use after a change: admission asks on every request.
    _active: list[Agreement] | None = field(default=None, repr=False, compare=False)

    # -- fold ---------------------------------------------------------------------------------
    def apply(self, event: AdminEvent) -> bool:
        """Fold one event from the log; False when its id was already applied (a duplicate)."""
        if event.event_id in self.by_id:
            return False
        self._fold(event)  # first: an event that cannot be folded leaves no trace in the history
        self.history.append(event)
        self.by_id[event.event_id] = event
        return True

    def _fold(self, event: AdminEvent) -> None:
        match event:
            case NodeDeclared():
                self.nodes[event.node_id] = Node(
                    event.node_id, event.parent, event.kind, event.shares, tuple(event.leads)
                )
            case ClusterDeclared():
                self.clusters[event.cluster] = Cluster(event.cluster, event.gpu_type, event.gpus)
            case PolicyChanged():
                self.policies[event.policy_id] = event
            case AllocationGranted():
                self.allocations[event.allocation_id] = Allocation(
                    allocation_id=event.allocation_id,
                    project=event.project,
                    period=event.period,
                    start=event.period_start,
                    end=event.period_end,
                    cluster=event.cluster,
                    gpu_type=event.gpu_type,
                    rollover=event.rollover,
                    granted_units=event.amount_units,
                    granted_at=event.occurred_at,
                    event_ids=(event.event_id,),
                )
            case AllocationAdjusted():
                a = self.allocations[event.allocation_id]
                self.allocations[a.allocation_id] = a.with_event(
                    event.event_id, adjusted_units=a.adjusted_units + event.delta_units
                )
            case AllocationTransferred():
                src = self.allocations[event.from_allocation]
                dst = self.allocations[event.to_allocation]
                self.allocations[src.allocation_id] = src.with_event(
                    event.event_id, transferred_out_units=src.transferred_out_units + event.amount_units
                )
                self.allocations[dst.allocation_id] = dst.with_event(
                    event.event_id, transferred_in_units=dst.transferred_in_units + event.amount_units
                )
            case AllocationExpired():
                a = self.allocations[event.allocation_id]
                rolled = event.rollover_allocation_id
                self.allocations[a.allocation_id] = a.with_event(
                    event.event_id,
                    expired=True,
                    forfeited_units=0 if rolled else event.unused_units,
                    rolled_over_to=rolled,
                )
                if rolled:
                    self.allocations[rolled] = rollover_successor(
                        a, rolled, event.unused_units, event.event_id
                    )
            case AgreementGranted():
                self.agreements[event.agreement_id] = event
                self.revoked.pop(event.agreement_id, None)
                self._active = None
            case AgreementRevoked():
                self.revoked[event.agreement_id] = event
                self._active = None
            case UsageDisputed():
                # Disputed once: after an admin's decision the job is not disputed again.
                self.disputes.setdefault(event.job_id, Dispute(event))
            case DisputeResolved():
                held = self.disputes.get(event.job_id)
                if held is not None and held.resolved is None:
                    self.disputes[event.job_id] = Dispute(held.raised, event)
            case AllocationExtended():
                a = self.allocations[event.allocation_id]
                self.allocations[a.allocation_id] = a.with_event(event.event_id, end=event.period_end)
            case AllocationRequested():
                self.requests.setdefault(event.request_id, AllocationRequest(event))
            case AllocationRequestDecided():
                asked = self.requests.get(event.request_id)
                if asked is not None and asked.decided is None:
                    self.requests[event.request_id] = AllocationRequest(asked.asked, event)

    @classmethod
    def of(cls, events: Iterable[AdminEvent]) -> AdminState:
        state = cls()
        for event in events:
            state.apply(event)
        return state

    def as_of(self, at: int) -> AdminState:
        """The state the events that had occurred by `at` (inclusive) give: a replay up to then."""
        return AdminState.of(e for e in self.history if e.occurred_at <= at)

    # -- read ---------------------------------------------------------------------------------
    def timeline(self) -> PolicyTimeline:
        """The declared policies over a flat base: time before the first policy costs 1.00 per GPU-second."""
        return PolicyTimeline([flat_policy(), *(policy_of(p) for p in self.policies.values())])

    def active_agreements(self) -> list[Agreement]:
        if self._active is None:
            self._active = [
                agreement_of(a) for k, a in sorted(self.agreements.items()) if k not in self.revoked
            ]
        return list(self._active)

    def projects(self) -> list[str]:
        return sorted(n.node_id for n in self.nodes.values() if n.kind == "project")

    def leads_of(self, project: str) -> set[str]:
        """Leads of the project and of every node above it: a group lead reads the group's projects."""
        leads: set[str] = set()
        current: str | None = project
        for _ in range(len(self.nodes) + 1):
            if current is None or current not in self.nodes:
                break
            leads.update(self.nodes[current].leads)
            current = self.nodes[current].parent
        return leads

    def allocations_of(self, project: str) -> list[Allocation]:
        return sorted(
            (a for a in self.allocations.values() if a.project == project),
            key=lambda a: (a.start, a.end, a.allocation_id),
        )

    def history_of(self, project: str) -> list[AdminEvent]:
        """Every event that touched the project: its node, allocations, transfers and agreements."""
        mine = {a.allocation_id for a in self.allocations.values() if a.project == project}
        agreements = {k for k, a in self.agreements.items() if a.project == project}

        def touches(e: AdminEvent) -> bool:
            match e:
                case NodeDeclared():
                    return e.node_id == project
                case AllocationGranted():
                    return e.project == project
                case AllocationAdjusted() | AllocationExpired():
                    return e.allocation_id in mine
                case AllocationTransferred():
                    return e.from_allocation in mine or e.to_allocation in mine
                case AgreementGranted() | AgreementRevoked():
                    return e.agreement_id in agreements
                case PolicyChanged():
                    return True  # a price change touches everybody's balance
                case UsageDisputed() | DisputeResolved():
                    held = self.disputes.get(e.job_id)
                    return held is not None and held.raised.project == project
                case AllocationExtended():
                    return e.allocation_id in mine
                case AllocationRequested() | AllocationRequestDecided():
                    asked = self.requests.get(e.request_id)
                    return asked is not None and asked.project == project
            return False

        return [e for e in self.history if touches(e)]

    # -- rules --------------------------------------------------------------------------------
    def check(
        self,
        event: AdminEvent,
        *,
        now: int,
        charged: ChargedUnits = lambda _: 0,
        charge_horizon: int | None = None,
    ) -> None:
        """Raise an AdminRejected subclass unless `event` may be appended to the log now.

        `charged` gives an allocation's charges so far (from the ledger); `charge_horizon` is the
        latest instant of usage the ledger has charged, None when it cannot tell (a writer in
        another process), in which case policies must take effect in the future.
        """
        match event:
            case NodeDeclared():
                try:
                    check_node(
                        self.nodes,
                        Node(event.node_id, event.parent, event.kind, event.shares, tuple(event.leads)),
                    )
                except TreeInvalid as exc:
                    raise InvalidChange(str(exc)) from None
                if event.shares == "parent" and event.parent is None:
                    raise InvalidChange(f"node {event.node_id!r} has shares 'parent' but sits under {ROOT!r}")
                held = self.nodes.get(event.node_id)
                if (
                    held is not None
                    and held.kind == "project"
                    and event.kind != "project"
                    and any(a.project == event.node_id for a in self.allocations.values())
                ):
                    raise InvalidChange(f"project {event.node_id!r} holds allocations; it stays a project")
            case ClusterDeclared():
                self._check_cluster_shrink(event)
            case PolicyChanged():
                self._check_policy(event, now, charge_horizon)
            case AllocationGranted():
                self._check_grant(event)
            case AllocationAdjusted():
                a = self._open_allocation(event.allocation_id)
                if not event.reason.strip():
                    raise InvalidChange("an adjustment needs a reason")
                if a.allocated_units + event.delta_units < 0:
                    raise InsufficientBudget(
                        f"allocation {a.allocation_id} holds {a.allocated_units} units; "
                        f"it cannot go down by {-event.delta_units}"
                    )
            case AllocationTransferred():
                self._check_transfer(event, charged)
            case AllocationExpired():
                a = self._open_allocation(event.allocation_id)
                if now < a.end:
                    raise InvalidChange(f"allocation {a.allocation_id} runs until {a.end}; it has not ended")
                if event.unused_units > max(0, a.allocated_units):
                    raise InvalidChange(
                        f"allocation {a.allocation_id} holds {a.allocated_units} units; "
                        f"{event.unused_units} cannot be unused"
                    )
                successor = event.rollover_allocation_id
                if successor is not None and successor in self.allocations:
                    raise Conflict(f"allocation {successor} exists; a rollover needs a new id")
                if successor is not None and not a.rollover:
                    raise InvalidChange(f"allocation {a.allocation_id} does not roll over")
            case AgreementGranted():
                self._check_agreement(event)
            case AgreementRevoked():
                if event.agreement_id not in self.agreements or event.agreement_id in self.revoked:
                    raise UnknownReference(f"no active agreement {event.agreement_id!r}")
            case UsageDisputed():
                if event.job_id in self.disputes:
                    raise Conflict(f"job {event.job_id} is disputed already")
            case DisputeResolved():
                dispute = self.disputes.get(event.job_id)
                if dispute is None:
                    raise UnknownReference(f"no disputed usage of job {event.job_id!r}")
                if dispute.resolved is not None:
                    raise Conflict(
                        f"the dispute of job {event.job_id} was resolved ({dispute.resolved.action}) "
                        f"by {dispute.resolved.actor}"
                    )
            case AllocationExtended():
                self._check_extension(event.allocation_id, event.period_end)
            case AllocationRequested():
                self._check_request(event)
            case AllocationRequestDecided():
                self._check_decision(event)

    def _open_allocation(self, allocation_id: str) -> Allocation:
        a = self.allocations.get(allocation_id)
        if a is None:
            raise UnknownReference(f"no allocation {allocation_id!r}")
        if a.expired:
            raise InvalidChange(f"allocation {allocation_id} expired at the end of {a.period}")
        return a

    def _require_project(self, project: str) -> None:
        node = self.nodes.get(project)
        if node is None or node.kind != "project":
            raise UnknownReference(f"no project {project!r}; declare it first")

    def _require_cluster(self, cluster: str) -> Cluster:
        found = self.clusters.get(cluster)
        if found is None:
            raise UnknownReference(f"no cluster {cluster!r}; declare it first")
        return found

    def _check_policy(self, event: PolicyChanged, now: int, charge_horizon: int | None) -> None:
        held = self.policies.get(event.policy_id)
        if held is not None:
            raise Conflict(f"policy {event.policy_id} exists; a new price list needs a new policy id")
        try:
            self.timeline().add(policy_of(event))
        except PolicyInvalid as exc:
            raise InvalidChange(str(exc)) from None
        # Past charges are never rewritten: a policy may only start where nothing is charged yet.
        if charge_horizon is None and event.effective_from < now:
            raise RetroactivePolicy(
                f"policy {event.policy_id} would take effect at {event.effective_from}, before now "
                f"({now}); with the ledger in another process a policy can only take effect later"
            )
        if charge_horizon is not None and event.effective_from < charge_horizon:
            raise RetroactivePolicy(
                f"policy {event.policy_id} would take effect at {event.effective_from}, but the ledger "
                f"has charged usage up to {charge_horizon}; past charges are not rewritten"
            )

    def _check_grant(self, event: AllocationGranted) -> None:
        if event.allocation_id in self.allocations:
            raise Conflict(f"allocation {event.allocation_id} exists; change it with an adjustment")
        self._require_project(event.project)
        if event.period_end <= event.period_start:
            raise InvalidChange(f"allocation {event.allocation_id}: the period ends before it starts")
        if event.cluster is not None:
            cluster = self._require_cluster(event.cluster)
            if event.gpu_type is not None and event.gpu_type != cluster.gpu_type:
                raise InvalidChange(
                    f"allocation {event.allocation_id}: cluster {cluster.cluster} has {cluster.gpu_type} "
                    f"GPUs, not {event.gpu_type}"
                )

    def _check_request(self, event: AllocationRequested) -> None:
        if event.request_id in self.requests:
            raise Conflict(f"request {event.request_id} exists")
        self._require_project(event.project)
        if not event.reason.strip():
            raise InvalidChange("a request needs a reason: what the GPU-hours are for")
        match event.kind:
            case "gpu-hours":
                if event.amount_units <= 0 or event.period_start is None or event.period_end is None:
                    raise InvalidChange("a request for GPU-hours needs an amount above zero and a period")
                if event.period_end <= event.period_start:
                    raise InvalidChange("the requested period ends before it starts")
                if event.cluster is not None:
                    self._require_cluster(event.cluster)
            case "extension":
                if event.allocation_id is None or event.extend_to is None:
                    raise InvalidChange("an extension names an allocation and its new end")
                a = self._check_extension(event.allocation_id, event.extend_to)
                if a.project != event.project:
                    raise InvalidChange(f"allocation {a.allocation_id} is not {event.project}'s")
            case "time-slice":
                if event.cluster is None or event.gpus is None or event.window is None:
                    raise InvalidChange("a time-slice request names a cluster, a number of GPUs and a window")
                cluster = self._require_cluster(event.cluster)
                if event.gpus > cluster.gpus:
                    raise InvalidChange(f"{cluster.cluster} has {cluster.gpus} GPUs, not {event.gpus}")

    def _check_extension(self, allocation_id: str, new_end: int) -> Allocation:
        a = self._open_allocation(allocation_id)
        if new_end <= a.end:
            raise InvalidChange(f"allocation {allocation_id} ends at {a.end}; an extension ends later")
        return a

    def _check_decision(self, event: AllocationRequestDecided) -> None:
        asked = self.requests.get(event.request_id)
        if asked is None:
            raise UnknownReference(f"no request {event.request_id!r}")
        if asked.decided is not None:
            raise Conflict(
                f"request {event.request_id} was {asked.decided.decision} by {asked.decided.actor} already"
            )
        if event.decision == "approved" and (
            event.granted_event_id is None or event.granted_event_id not in self.by_id
        ):
            raise InvalidChange(f"approving request {event.request_id} needs the event it grants, first")

    def _check_transfer(self, event: AllocationTransferred, charged: ChargedUnits) -> None:
        if event.from_allocation == event.to_allocation:
            raise InvalidChange("a transfer needs two different allocations")
        src = self._open_allocation(event.from_allocation)
        self._open_allocation(event.to_allocation)
        available = src.allocated_units - charged(src)
        if event.amount_units > available:
            raise InsufficientBudget(
                f"allocation {src.allocation_id} has {max(available, 0)} units available; "
                f"cannot transfer {event.amount_units}"
            )

    def _check_agreement(self, event: AgreementGranted) -> None:
        if event.agreement_id in self.agreements:
            raise Conflict(f"agreement {event.agreement_id} exists; revoke it and grant a new one")
        self._require_project(event.project)
        cluster = self._require_cluster(event.cluster)
        if event.gpus > cluster.gpus:
            raise InvalidChange(
                f"agreement {event.agreement_id} guarantees {event.gpus} GPUs; "
                f"{cluster.cluster} has {cluster.gpus}"
            )
        try:
            candidate = agreement_of(event)
        except AgreementInvalid as exc:
            raise InvalidChange(f"agreement {event.agreement_id}: {exc}") from None
        found = first_overbooking(self.active_agreements(), candidate, cluster.gpus)
        if found is not None:
            at, total, conflicting = found
            raise Overbooked(
                f"agreement {event.agreement_id} would overbook {cluster.cluster}: at {at} the guarantees "
                f"add up to {total} of its {cluster.gpus} GPUs, with {', '.join(conflicting)}",
                conflicting,
            )

    def _check_cluster_shrink(self, event: ClusterDeclared) -> None:
        held = self.clusters.get(event.cluster)
        if held is None or event.gpus >= held.gpus:
            return
        active = [a for a in self.active_agreements() if a.cluster == event.cluster]
        for agreement in active:
            found = first_overbooking(active, agreement, event.gpus)
            if found is not None:
                at, total, conflicting = found
                ids = tuple(sorted({agreement.agreement_id, *conflicting}))
                raise Overbooked(
                    f"cluster {event.cluster} with {event.gpus} GPUs would be overbooked: at {at} its "
                    f"agreements guarantee {total} GPUs ({', '.join(ids)})",
                    ids,
                )

    def copy(self) -> AdminState:
        """A state to try events on: every container copied (their values are immutable)."""
        return replace(self, **{f.name: copy.copy(getattr(self, f.name)) for f in fields(self)})
