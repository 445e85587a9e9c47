"""Admin event builders shared by the budget unit tests (times are UTC Unix seconds).

Every builder has defaults for what a test does not care about. Event ids are deterministic: a
given id, or one derived from the event's content, so the same call always builds the same event
and two different events never share an id by accident.
"""

from __future__ import annotations

import calendar
import hashlib
from collections.abc import Iterable, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel

from allmende.domain.admin_state import AdminState
from allmende.schemas.admin_events import (
    AdminEvent,
    AgreementGranted,
    AgreementRevoked,
    AllocationAdjusted,
    AllocationExpired,
    AllocationGranted,
    AllocationTransferred,
    ClusterDeclared,
    FixedWindowSpec,
    NodeDeclared,
    PolicyChanged,
    WeeklyWindowSpec,
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """A UTC wall-clock time as Unix seconds (independent of the modules under test)."""
    return calendar.timegm((year, month, day, hour, minute, 0))


DAY = 86_400
HOUR = 3600
T0 = utc(2027, 1, 1)  # a Friday, the start of 2027-Q1
Q1 = (T0, utc(2027, 4, 1))
BEFORE = T0 - 30 * DAY  # when an admin event occurs unless a test says otherwise
ACTOR = "dana"
MON, TUE, WED, THU, FRI, SAT, SUN = range(7)

E = TypeVar("E", bound=BaseModel)


def _with_id(event: E, event_id: str | None, key: str) -> E:
    if event_id is None:
        content = event.model_dump_json(exclude={"event_id"}).encode()
        event_id = f"{key}:{hashlib.sha256(content).hexdigest()[:10]}"
    return event.model_copy(update={"event_id": event_id})


# -- organisation -------------------------------------------------------------------------------


def node(
    node_id: str, parent: str | None = None, *, kind: Literal["organisation", "group", "project"] = "project",
    shares: int | Literal["parent"] = 1, leads: Sequence[str] = (), at: int = BEFORE,
    event_id: str | None = None,
) -> NodeDeclared:  # fmt: skip
    event = NodeDeclared(
        event_id="-", occurred_at=at, actor=ACTOR, node_id=node_id, parent=parent, kind=kind,
        shares=shares, leads=tuple(leads),
    )  # fmt: skip
    return _with_id(event, event_id, f"node:{node_id}")


def cluster(
    name: str = "c1", gpu_type: str = "H100", gpus: int = 8, *, at: int = BEFORE, event_id: str | None = None
) -> ClusterDeclared:
    event = ClusterDeclared(
        event_id="-", occurred_at=at, actor=ACTOR, cluster=name, gpu_type=gpu_type, gpus=gpus
    )
    return _with_id(event, event_id, f"cluster:{name}")


def organisation() -> list[AdminEvent]:
    """Two clusters and a small tree: inst > nlp > proj, inst > other, and solo under the root.

    c1 has 8 H100 GPUs, c2 has 4 B300 GPUs. Leads: dana (inst), gina (nlp), alice (proj),
    bob (other), sam (solo).
    """
    return [
        cluster("c1", "H100", 8),
        cluster("c2", "B300", 4),
        node("inst", kind="organisation", shares=100, leads=["dana"]),
        node("nlp", "inst", kind="group", shares=60, leads=["gina"]),
        node("proj", "nlp", leads=["alice"]),
        node("other", "inst", leads=["bob"]),
        node("solo", leads=["sam"]),
    ]


# -- charge policy ------------------------------------------------------------------------------


def policy(
    policy_id: str = "prices", effective_from: int = T0, *, weights: dict[str, int] | None = None,
    default_weight: int = 100, multipliers: dict[str, int] | None = None, interactive_rate: int = 100,
    at: int = BEFORE, event_id: str | None = None,
) -> PolicyChanged:  # fmt: skip
    event = PolicyChanged(
        event_id="-", occurred_at=at, actor=ACTOR, policy_id=policy_id, effective_from=effective_from,
        gpu_type_weights={"H100": 100, "B300": 250} if weights is None else weights,
        default_gpu_type_weight=default_weight,
        priority_multipliers=multipliers or {"preemptible": 50, "standard": 100, "non-preemptible": 200},
        interactive_rate=interactive_rate,
    )  # fmt: skip
    return _with_id(event, event_id, f"policy:{policy_id}")


# -- allocations --------------------------------------------------------------------------------


def grant(
    allocation_id: str = "a1", project: str = "proj", units: int = 1000, *, start: int = Q1[0],
    end: int = Q1[1], period: str = "2027-Q1", cluster: str | None = None, gpu_type: str | None = None,
    rollover: bool = False, at: int = BEFORE, source: str = "api", event_id: str | None = None,
) -> AllocationGranted:  # fmt: skip
    event = AllocationGranted(
        event_id="-", occurred_at=at, actor=ACTOR, source=source, allocation_id=allocation_id,
        project=project, period=period, period_start=start, period_end=end, amount_units=units,
        cluster=cluster, gpu_type=gpu_type, rollover=rollover,
    )  # fmt: skip
    return _with_id(event, event_id, f"grant:{allocation_id}")


def adjust(
    allocation_id: str, delta: int, *, reason: str = "correction", at: int = BEFORE,
    event_id: str | None = None,
) -> AllocationAdjusted:  # fmt: skip
    event = AllocationAdjusted(
        event_id="-", occurred_at=at, actor=ACTOR, reason=reason, allocation_id=allocation_id,
        delta_units=delta,
    )  # fmt: skip
    return _with_id(event, event_id, f"adjust:{allocation_id}")


def transfer(
    from_allocation: str, to_allocation: str, units: int, *, transfer_id: str | None = None,
    at: int = BEFORE, event_id: str | None = None,
) -> AllocationTransferred:  # fmt: skip
    event = AllocationTransferred(
        event_id="-", occurred_at=at, actor=ACTOR, reason="moving budget",
        transfer_id=transfer_id or f"{from_allocation}:{to_allocation}:{units}",
        from_allocation=from_allocation, to_allocation=to_allocation, amount_units=units,
    )  # fmt: skip
    return _with_id(event, event_id, f"transfer:{event.transfer_id}")


def expire(
    allocation_id: str, unused: int, *, rollover_to: str | None = None, at: int = Q1[1],
    event_id: str | None = None,
) -> AllocationExpired:  # fmt: skip
    event = AllocationExpired(
        event_id="-", occurred_at=at, actor="allmende-expiry", source="expiry", allocation_id=allocation_id,
        unused_units=unused, rollover_allocation_id=rollover_to,
    )  # fmt: skip
    return _with_id(event, event_id, f"expire:{allocation_id}")


# -- time-slice agreements ----------------------------------------------------------------------


def fixed(start: int, end: int) -> FixedWindowSpec:
    return FixedWindowSpec(start=start, end=end)


def weekly(
    days: Iterable[int], hour: int, *, minute: int = 0, hours: int = 8, time_zone: str = "Europe/Berlin",
    valid_from: int = Q1[0], valid_until: int = Q1[1],
) -> WeeklyWindowSpec:  # fmt: skip
    return WeeklyWindowSpec(
        weekdays=tuple(days), hour=hour, minute=minute, duration_s=hours * HOUR, time_zone=time_zone,
        valid_from=valid_from, valid_until=valid_until,
    )  # fmt: skip


def agreement(
    agreement_id: str = "g1", gpus: int = 4, window: FixedWindowSpec | WeeklyWindowSpec | None = None, *,
    project: str = "proj", cluster: str = "c1", at: int = BEFORE, source: str = "api",
    event_id: str | None = None,
) -> AgreementGranted:  # fmt: skip
    """`gpus` GPUs of `cluster` for `project`; the window defaults to the first day of Q1."""
    event = AgreementGranted(
        event_id="-", occurred_at=at, actor=ACTOR, source=source, agreement_id=agreement_id,
        project=project, cluster=cluster, gpus=gpus, window=window or fixed(T0, T0 + DAY),
    )  # fmt: skip
    return _with_id(event, event_id, f"agreement:{agreement_id}")


def revoke(agreement_id: str, *, at: int = BEFORE, event_id: str | None = None) -> AgreementRevoked:
    event = AgreementRevoked(event_id="-", occurred_at=at, actor=ACTOR, agreement_id=agreement_id)
    return _with_id(event, event_id, f"revoke:{agreement_id}")


# -- state --------------------------------------------------------------------------------------


def state_of(*events: AdminEvent) -> AdminState:
    """The fold of `events` in the order given (no rules applied: the log is taken as it is)."""
    return AdminState.of(events)


def world(*events: AdminEvent) -> AdminState:
    """The fold of `organisation()` followed by `events`."""
    return state_of(*organisation(), *events)
