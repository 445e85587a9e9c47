"""The admin application service: commands become checked admin events; balances are read.

Thin by design: load (catch up the admin log), call the domain (`AdminState.check`,
`domain.plan.diff`, `domain.balances`), save (publish). One command at a time: the admin log is
one ordered stream, and the rules judge each event against the state it will follow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import structlog

from domain.admin_state import AdminState
from domain.allocations import Allocation
from domain.balances import ProjectBalance, project_balance, segments
from domain.plan import Change, diff
from domain.plan_file import parse_plan
from schemas.admin_events import AdminEvent, AllocationExpired, PolicyChanged
from services.admin_log import AdminLog
from services.ledger_store import LedgerStore
from services.ledger_writer import LedgerWriter

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What a command did: the events it appended, or the ones already there (a retry)."""

    applied: tuple[AdminEvent, ...]
    unchanged: tuple[AdminEvent, ...]


class AdminService:
    def __init__(
        self,
        admin_log: AdminLog,
        store: LedgerStore,
        writer: LedgerWriter | None = None,
        clock: Callable[[], float] = time.time,
        expiry_grace_s: int = 86_400,
        held: Callable[[str], dict[str, int]] | None = None,
    ) -> None:
        self.log = admin_log
        self.store = store
        self.writer = writer  # in-process writer: policies may start anywhere not yet charged
        self.clock = clock
        self.expiry_grace_s = expiry_grace_s
        # Units held by admitted jobs, per allocation of a project (the admission service's).
        self.held = held or (lambda _: {})
        self._lock = threading.Lock()

    def now(self) -> int:
        return int(self.clock())

    def state(self) -> AdminState:
        return self.log.catch_up()

    # -- commands -----------------------------------------------------------------------------
    def submit(self, events: Sequence[AdminEvent]) -> Outcome:
        """Check every event against the state the ones before it leave, then publish them all.

        An event whose id is on the log already is a retry: it is answered, not appended again.
        """
        with self._lock, self._posting_paused(events):
            state = self.state()
            trial = state.copy()
            fresh: list[AdminEvent] = []
            seen: list[AdminEvent] = []
            horizon = self.writer.horizon if self.writer is not None else None
            for event in events:
                if event.event_id in trial._seen:
                    seen.append(event)
                    continue
                trial.check(event, now=self.now(), charged=self._charged_by(trial), charge_horizon=horizon)
                trial.apply(event)
                fresh.append(event)
            if fresh:
                self.log.publish(fresh)
                log.info("admin_events_published", events=[f"{e.type}:{e.event_id}" for e in fresh])
            return Outcome(tuple(fresh), tuple(seen))

    def _posting_paused(self, events: Sequence[AdminEvent]) -> AbstractContextManager[object]:
        # A policy is checked against the charge horizon and published while no batch is being
        # priced, so the next batch reads it before it charges anything after the policy's start.
        if self.writer is not None and any(isinstance(e, PolicyChanged) for e in events):
            return self.writer.posting_lock
        return nullcontext()

    def plan(self, text: str, actor: str) -> list[Change]:
        """The changes a plan file would make now, without making them."""
        return diff(parse_plan(text), self.state(), actor=actor, now=self.now())

    def apply_plan(self, text: str, actor: str) -> tuple[list[Change], Outcome]:
        with self._lock:
            changes = self.plan(text, actor)
        return changes, self.submit([c.event for c in changes])

    def expire_due(self, actor: str = "allmende-expiry") -> Outcome:
        """Expire every allocation whose period has ended: unused units are forfeited or rolled over."""
        now = self.now()
        if self.writer is not None and not self.writer.caught_up.is_set():
            return Outcome((), ())  # usage of the ended period may still be on its way
        state = self.state()
        events: list[AdminEvent] = []
        for a in sorted(state.allocations.values(), key=lambda x: x.allocation_id):
            if a.expired or a.end + self.expiry_grace_s > now:
                continue
            unused = max(0, a.allocated_units - self._charged_by(state)(a))
            events.append(
                AllocationExpired(
                    event_id=f"expire:{a.allocation_id}",
                    occurred_at=now,
                    actor=actor,
                    source="expiry",
                    reason=f"period {a.period} ended",
                    allocation_id=a.allocation_id,
                    unused_units=unused,
                    rollover_allocation_id=f"{a.allocation_id}+rollover" if a.rollover and unused else None,
                )
            )
        return self.submit(events) if events else Outcome((), ())

    # -- reads --------------------------------------------------------------------------------
    def balance(
        self, project: str, as_of: int | None = None, state: AdminState | None = None
    ) -> ProjectBalance:
        """Allocated, charged, held and remaining per allocation of `project`, as of an instant.

        As of a past instant both sides are what a replay up to then gives: the admin events that
        had occurred, and the ledger entries whose closing event had occurred.
        """
        at = self.now() if as_of is None else as_of
        full = state or self.state()
        known = full if as_of is None else full.as_of(at)
        allocations = known.allocations_of(project)
        rows = self.store.charge_rows(project, segments(allocations), at)
        units, seconds = self.store.project_charges(project, at)
        # Holds are live state: a past instant shows none (what a replay of the admin and job
        # events up to then gives, too: holds live on the admission log).
        held = self.held(project) if as_of is None else {}
        return project_balance(project, at, allocations, rows, units, seconds, held)

    def _charged_by(self, state: AdminState) -> Callable[[Allocation], int]:
        def charged(allocation: Allocation) -> int:
            found = self.balance(allocation.project, state=state)
            line = next(
                b for b in found.allocations if b.allocation.allocation_id == allocation.allocation_id
            )
            return line.charged_units + line.held_units

        return charged
