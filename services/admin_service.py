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

from allmende.core.ledger_store import DayUsage, LedgerStore
from allmende.domain.admin_state import AdminRejected, AdminState, Conflict
from allmende.domain.allocations import Allocation, next_period, period_label
from allmende.domain.balances import ProjectBalance, project_balance, segments
from allmende.domain.capacity import Found, usage_disputes
from allmende.domain.plan import Change, PlanConflict, diff
from allmende.domain.plan_file import PlanInvalid, locate, parse_plan
from allmende.schemas.admin_events import AdminEvent, AllocationExpired, PolicyChanged
from allmende.streams.admin_log import AdminLog, NotRecorded
from allmende.streams.ledger_writer import LedgerWriter

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
        """For reads: the state caught up, or as last caught up when Kafka is away."""
        return self.log.read_state()

    def _current(self) -> AdminState:
        """For commands: the state caught up to the end of the log, or NotRecorded (Kafka away)."""
        try:
            return self.log.catch_up(self.log.settings.write_timeout_ms / 1000)
        except Exception as exc:
            raise NotRecorded(f"the admin log cannot be read ({exc!r})") from exc

    # -- commands -----------------------------------------------------------------------------
    def submit(self, events: Sequence[AdminEvent]) -> Outcome:
        """Check every event against the state the ones before it leave, then publish them all.

        An event whose id is on the log already is a retry: it is answered with what the log
        holds, not appended again; the same id with other content is a conflict.
        """
        with self._lock:
            return self._submit(events)

    def _submit(self, events: Sequence[AdminEvent]) -> Outcome:
        with self._posting_paused(events):
            state = self._current()
            trial = state.copy()
            # One clock for the log: never behind its last event, so an as-of replay by time
            # folds every event after the ones it depends on.
            at = max([self.now(), *(e.occurred_at for e in state.history[-1:])])
            horizon = self._charge_horizon()
            fresh: list[AdminEvent] = []
            seen: list[AdminEvent] = []
            for event in events:
                held = trial.by_id.get(event.event_id)
                if held is not None:
                    if _content(held) != _content(event):
                        raise Conflict(
                            f"event id {event.event_id} (an idempotency key) was used for another request"
                        )
                    seen.append(held)
                    continue
                event = event.model_copy(update={"occurred_at": at})
                trial.check(event, now=at, charged=self._charged_by(trial), charge_horizon=horizon)
                trial.apply(event)
                fresh.append(event)
            if fresh:
                self.log.publish(fresh)
                log.info("admin_events_published", events=[f"{e.type}:{e.event_id}" for e in fresh])
            return Outcome(tuple(fresh), tuple(seen))

    def dispute_over_capacity(self, found: Sequence[Found]) -> Outcome:
        """Hold as disputed the runs that pushed a cluster over (admin events: the audit trail)."""
        events = usage_disputes(found, self.state().disputes, self.now())
        return self.submit(events) if events else Outcome((), ())

    def _charge_horizon(self) -> int | None:
        """The latest charged instant, when the writer's posting lock makes it exact; else None."""
        if self.writer is None:
            return None
        return self.store.charge_horizon()  # the ledger_horizon view: every posting made

    def _posting_paused(self, events: Sequence[AdminEvent]) -> AbstractContextManager[object]:
        # A policy is checked against the charge horizon and published while no batch is being
        # priced, so the next batch reads it before it charges anything after the policy's start.
        if self.writer is not None and any(isinstance(e, PolicyChanged) for e in events):
            return self.writer.posting_lock
        return nullcontext()

    def plan(self, text: str, actor: str) -> list[Change]:
        """The changes a plan file would make now, without making them.

        Each change is checked by the same rules an apply meets, on a trial state, so a preview
        shows every refusal, with the line of the file it comes from.
        """
        plan = parse_plan(text)
        state = self.state()
        now = self.now()
        try:
            changes = diff(plan, state, actor=actor, now=now, charged=self._charged_by(state))
        except PlanConflict as exc:
            raise PlanInvalid([(locate(text, exc.where), _field(exc.where, "<file>"), str(exc))]) from None
        trial = state.copy()
        horizon = self._charge_horizon()
        problems: list[tuple[int | None, str, str]] = []
        for change in changes:
            try:
                trial.check(change.event, now=now, charged=self._charged_by(trial), charge_horizon=horizon)
                trial.apply(change.event)
            except AdminRejected as exc:
                problems.append((locate(text, change.where), _field(change.where, change.target), str(exc)))
        if problems:
            raise PlanInvalid(problems)
        return changes

    def apply_plan(self, text: str, actor: str) -> tuple[list[Change], Outcome]:
        # Diff and submit under one lock: two applies of one plan cannot interleave.
        with self._lock:
            changes = self.plan(text, actor)
            return changes, self._submit([c.event for c in changes])

    def expire_due(self, actor: str = "allmende-expiry") -> Outcome:
        """Expire every allocation whose period has ended, once the ledger has reached its end.

        Expiry follows the ledger's clock (the latest charged instant), not only the wall clock:
        a backfill of last year's usage must not expire its periods before their usage is in.
        Each allocation expires on its own, so one refusal does not hold the others back.
        """
        now = self.now()
        if self.writer is not None and not self.writer.caught_up.is_set():
            return Outcome((), ())  # usage of the ended period may still be on its way
        horizon = self.store.charge_horizon()
        state = self.state()
        applied: list[AdminEvent] = []
        for a in sorted(state.allocations.values(), key=lambda x: x.allocation_id):
            if a.expired or a.end + self.expiry_grace_s > now or horizon < a.end:
                continue
            unused = max(0, a.allocated_units - self._charged_by(state)(a))
            successor = f"{a.allocation_id.split('+')[0]}+{period_label(*next_period(a.start, a.end))}"
            event = AllocationExpired(
                event_id=f"expire:{a.allocation_id}", occurred_at=now, actor=actor, source="expiry",
                reason=f"period {a.period} ended", allocation_id=a.allocation_id, unused_units=unused,
                rollover_allocation_id=successor if a.rollover and unused else None,
            )  # fmt: skip
            try:
                applied.extend(self.submit([event]).applied)
            except AdminRejected as exc:
                log.error("expiry_refused", allocation=a.allocation_id, reason=str(exc))
        return Outcome(tuple(applied), ())

    # -- reads --------------------------------------------------------------------------------
    def balance(
        self, project: str, as_of: int | None = None, state: AdminState | None = None
    ) -> ProjectBalance:
        """Allocated, charged, held and remaining per allocation of `project`, as of an instant.

        As of a past instant both sides are what a replay up to then gives: the admin events that
        had occurred, and the ledger entries whose closing event had occurred.
        """
        return self.balances([project], as_of, state)[project]

    def balances(
        self,
        projects: Sequence[str],
        as_of: int | None = None,
        state: AdminState | None = None,
        days: Sequence[DayUsage] | None = None,
    ) -> dict[str, ProjectBalance]:
        """`balance` of several projects, read from the ledger together (the dashboards' overview);
        `days`: their `LedgerStore.daily_usage`, when the caller has read it already."""
        at = self.now() if as_of is None else as_of
        full = state or self.state()
        known = full if as_of is None else full.as_of(at)
        allocations = {p: known.allocations_of(p) for p in projects}
        charges = self.store.charges_of({p: segments(a) for p, a in allocations.items()}, at, days=days)
        # Holds are live state: a past instant shows none (what a replay of the admin and job
        # events up to then gives, too: holds live on the admission log).
        return {
            p: project_balance(
                p,
                at,
                allocations[p],
                charges[p].rows,
                charges[p].charge_units,
                charges[p].gpu_seconds,
                self.held(p) if as_of is None else {},
            )
            for p in projects
        }

    def _charged_by(self, state: AdminState) -> Callable[[Allocation], int]:
        def charged(allocation: Allocation) -> int:
            found = self.balance(allocation.project, state=state)
            line = next(
                b for b in found.allocations if b.allocation.allocation_id == allocation.allocation_id
            )
            return line.charged_units + line.held_units

        return charged


def _field(where: tuple[str | int, ...], default: str) -> str:
    return ".".join(str(part) for part in where) or default


def _content(event: AdminEvent) -> dict[str, object]:
    """What a retry must repeat: everything but the instant, which the log sets."""
    return event.model_dump(exclude={"occurred_at"})
