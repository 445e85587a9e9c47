"""Burn warnings: tell a project lead, once per crossing, that the budget is going fast.

Two kinds of condition, per project and period, each keyed `(project, period, condition)`:

- `early-exhaustion`: at the trailing-7-day rate the budget runs out more than `days_early` whole
  days before the period ends (`(period_end - exhaustion_at) // 86400 > days_early`; a budget
  already used up counts, with `exhaustion_at` = as_of). Never for a project with nothing
  allocated (there is no budget to run out of), nor when the forecast lasts the period.
- `budget-share:<share>` for each configured share (`0.5`, `0.8`, `1.0`): the spent share
  (charged + held) / allocated has reached it (`>=`). Never when nothing is allocated.
- `expires-in:<n>d` for each configured number of days (`14`): the period's allocations end
  within n days of the ledger's clock (and have not ended): a reminder to use or ask to extend
  them. Never when nothing is allocated; an extension past the n days clears it.

A crossing is a change of a condition's truth: false to true gives a `BurnWarningRaised`, true to
false a `BurnWarningCleared`, so a later crossing warns again and the lead sees the warning end.
A warning still active for a condition that is no longer configured (a share taken out of the
settings) is cleared with `why="unconfigured"`. Only the (project, period) pairs in the input are
looked at: a project the source no longer reports (its period ended) keeps its warnings as they
were.

The state is the fold of the alerts log (`BurnAlertState`): per condition, the highest crossing
raised and the highest crossing cleared; a condition is active when the former is larger. Event
ids derive from the condition and the crossing number only, and the fold takes maxima, so
duplicates (a retried or concurrent publication), and replaying the log, give the same state.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from allmende.domain.admission import gpu_hours
from allmende.domain.burn_rate import SECONDS_PER_DAY, BurnRate
from allmende.schemas.alert_events import (
    AlertEvent,
    BurnWarningCleared,
    BurnWarningRaised,
    CapacityExceeded,
    SquattingFlagged,
)

EARLY_EXHAUSTION = "early-exhaustion"
BUDGET_SHARE = "budget-share:"
EXPIRES_IN = "expires-in:"
MAX_SHARE_DECIMALS = 12

ConditionKey = tuple[str, str, str]  # (project, period, condition)


@dataclass(frozen=True, slots=True)
class ProjectBurn:
    """What the alerter (and the project gauges) need of one project in one period."""

    project: str
    period: str  # the allocation period's label, e.g. `2027-Q1`
    burn: BurnRate
    idle_units: int  # GPU-seconds x (1 - utilisation) x 10,000 (domain.squatting)
    leads: tuple[str, ...] = ()  # whom reminders by e-mail go to (the plan's leads of it and above)
    # When the project's own allocations of the period end (the latest; an extension moves it),
    # which expiry reminders count down to; None: the period's end.
    allocations_end: int | None = None

    @property
    def ends_at(self) -> int:
        return self.burn.period_end if self.allocations_end is None else self.allocations_end


def share_label(share: Fraction) -> str:
    """A share as the exact decimal of its condition key: `0.8`, `1.0`, `0.95`."""
    for decimals in range(1, MAX_SHARE_DECIMALS + 1):
        scaled = share * 10**decimals
        if scaled.denominator == 1:
            whole, rest = divmod(scaled.numerator, 10**decimals)
            return f"{whole}.{rest:0{decimals}d}"
    raise ValueError(f"share {share} is not a decimal of at most {MAX_SHARE_DECIMALS} places")


def share_condition(share: Fraction) -> str:
    return f"{BUDGET_SHARE}{share_label(share)}"


def expiry_condition(days: int) -> str:
    return f"{EXPIRES_IN}{days}d"


@dataclass(frozen=True, slots=True)
class Thresholds:
    days_early: int = 7
    budget_shares: tuple[Fraction, ...] = (Fraction(4, 5), Fraction(1))
    expiry_days: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.days_early < 0:
            raise ValueError("days_early must not be negative")
        for days in self.expiry_days:
            if not 1 <= days <= 9999:
                raise ValueError(f"an expiry reminder {days} days ahead: give 1 to 9999 days")
        for share in self.budget_shares:
            if share <= 0:
                raise ValueError(f"budget share {share} must be positive")
            share_label(share)  # a terminating decimal

    @classmethod
    def parse(cls, days_early: int, budget_shares: str, expiry_days: str = "") -> Thresholds:
        """From the settings: `budget_shares` is comma-separated decimals (`"0.8,1.0"`; empty: none),
        `expiry_days` comma-separated whole days (`"14,3"`; empty: none)."""
        try:
            shares = {Fraction(part.strip()) for part in budget_shares.split(",") if part.strip()}
        except ValueError:
            raise ValueError(f"budget shares {budget_shares!r} are not comma-separated decimals") from None
        try:
            days = {int(part.strip()) for part in expiry_days.split(",") if part.strip()}
        except ValueError:
            raise ValueError(f"expiry reminders {expiry_days!r} are not comma-separated days") from None
        return cls(days_early, tuple(sorted(shares)), tuple(sorted(days, reverse=True)))

    def conditions(self) -> tuple[str, ...]:
        return (
            EARLY_EXHAUSTION,
            *(share_condition(s) for s in self.budget_shares),
            *(expiry_condition(d) for d in self.expiry_days),
        )


@dataclass
class BurnAlertState:
    """The fold of the alerts log: per condition, the highest crossing raised and cleared."""

    raised: dict[ConditionKey, int] = field(default_factory=dict)
    cleared: dict[ConditionKey, int] = field(default_factory=dict)
    capacity: set[tuple[str, int]] = field(default_factory=set)  # (cluster, start) of episodes raised
    squats: set[tuple[str, int]] = field(default_factory=set)  # (job, stretch start) flagged, ongoing

    def apply(self, event: AlertEvent) -> bool:
        """Fold one event; True when it changed the state (a duplicate does not)."""
        if isinstance(event, SquattingFlagged):
            return _added(self.squats, (event.job_id, event.idle_since))
        if isinstance(event, CapacityExceeded):
            return _added(self.capacity, (event.cluster, event.start))
        key = (event.project, event.period, event.condition)
        seen = self.raised if isinstance(event, BurnWarningRaised) else self.cleared
        if seen.get(key, 0) >= event.crossing:
            return False
        seen[key] = event.crossing
        return True

    @property
    def active(self) -> dict[ConditionKey, int]:
        """The active warnings and their crossing numbers."""
        return {k: n for k, n in self.raised.items() if n > self.cleared.get(k, 0)}

    def is_active(self, key: ConditionKey) -> bool:
        return self.raised.get(key, 0) > self.cleared.get(key, 0)

    def copy(self) -> BurnAlertState:
        return BurnAlertState(dict(self.raised), dict(self.cleared), set(self.capacity), set(self.squats))


def _added(seen: set[tuple[str, int]], key: tuple[str, int]) -> bool:
    """Add `key`; True when it was not there yet."""
    if key in seen:
        return False
    seen.add(key)
    return True


def fold(events: Iterable[AlertEvent]) -> BurnAlertState:
    """The state a replay of the alerts log gives."""
    state = BurnAlertState()
    for event in events:
        state.apply(event)
    return state


def event_id(key: ConditionKey, crossing: int, kind: str) -> str:
    project, period, condition = key
    return f"burn:{project}/{period}/{condition}/{crossing}:{kind}"


def days_before_end(burn: BurnRate) -> int | None:
    """Whole days from the trailing forecast's exhaustion to the period's end; None: it lasts."""
    at = burn.trailing_7d.exhaustion_at
    return None if at is None else (burn.period_end - at) // SECONDS_PER_DAY


def holds(burn: BurnRate, condition: str, thresholds: Thresholds, ends_at: int | None = None) -> bool:
    """Whether the condition is true of the burn rate (`ends_at`: when the project's allocations end)."""
    if burn.allocated_units <= 0:
        return False
    if condition == EARLY_EXHAUSTION:
        days = days_before_end(burn)
        return days is not None and days > thresholds.days_early
    if condition.startswith(EXPIRES_IN):
        ahead = int(condition.removeprefix(EXPIRES_IN).removesuffix("d")) * SECONDS_PER_DAY
        end = burn.period_end if ends_at is None else ends_at
        return burn.as_of < end <= burn.as_of + ahead
    share = Fraction(condition.removeprefix(BUDGET_SHARE))
    return burn.spent_share is not None and burn.spent_share >= share


def evaluate(
    burns: Sequence[ProjectBurn], thresholds: Thresholds, state: BurnAlertState, now: int
) -> list[AlertEvent]:
    """The events a round emits: one per condition whose truth differs from the state's."""
    work = state.copy()  # a project listed twice is judged once
    events: list[AlertEvent] = []
    configured = thresholds.conditions()
    for pb in burns:
        for condition in configured:
            key = (pb.project, pb.period, condition)
            true, active = holds(pb.burn, condition, thresholds, pb.ends_at), work.is_active(key)
            if true and not active:
                crossing = work.raised.get(key, 0) + 1
                events.append(_event(BurnWarningRaised, pb, condition, crossing, now))
            elif active and not true:
                events.append(_event(BurnWarningCleared, pb, condition, work.raised[key], now))
            else:
                continue
            work.apply(events[-1])
        stale = sorted(k for k in work.active if k[:2] == (pb.project, pb.period) and k[2] not in configured)
        for _, _, condition in stale:
            crossing = work.raised[(pb.project, pb.period, condition)]
            events.append(_event(BurnWarningCleared, pb, condition, crossing, now, why="unconfigured"))
            work.apply(events[-1])
    return events


def _event(
    kind: type[BurnWarningRaised] | type[BurnWarningCleared],
    pb: ProjectBurn,
    condition: str,
    crossing: int,
    now: int,
    why: str = "resolved",
) -> AlertEvent:
    b = pb.burn
    raised = kind is BurnWarningRaised
    key = (pb.project, pb.period, condition)
    fields: dict[str, object] = {
        "event_id": event_id(key, crossing, "raised" if raised else "cleared"),
        "occurred_at": now,
        "project": pb.project,
        "period": pb.period,
        "condition": condition,
        "crossing": crossing,
        "message": message(pb, condition, raised=raised, why=why),
        "as_of": b.as_of,
        "period_end": b.period_end,
        "allocated_units": b.allocated_units,
        "charged_units": b.charged_units,
        "held_units": b.held_units,
        "remaining_units": b.remaining_units,
        "trailing_units_per_day": b.trailing_7d.units_per_day,
        "exhaustion_at": b.trailing_7d.exhaustion_at,
    }
    if not raised:
        fields["why"] = why
    return kind.model_validate(fields)


# -- the sentences ---------------------------------------------------------------------------------


def _day(at: int) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).date().isoformat()


def _days(n: int) -> str:
    return f"{n:,} day" if n == 1 else f"{n:,} days"


def _percent(share: Fraction) -> str:
    return share_label(share * 100).removesuffix(".0") + "%"


def _spent(b: BurnRate) -> str:
    left = b.remaining_units
    tail = f"{gpu_hours(left)} left" if left >= 0 else f"{gpu_hours(-left)} over"
    return (
        f"{gpu_hours(b.charged_units + b.held_units)} of {gpu_hours(b.allocated_units)} weighted "
        f"GPU-hours charged or held, {tail}"
    )


def message(pb: ProjectBurn, condition: str, *, raised: bool, why: str = "resolved") -> str:
    """The sentence a project lead reads, in the event and in the webhook's `text`."""
    b, p, period = pb.burn, pb.project, pb.period
    rate = f"last 7 days' rate: {gpu_hours(b.trailing_7d.units_per_day)} weighted GPU-hours/day"
    at = b.trailing_7d.exhaustion_at
    if condition == EARLY_EXHAUSTION:
        if not raised and b.allocated_units <= 0:
            return f"Project {p} has nothing allocated in {period} any more: the early warning ends."
        if at is None:
            return f"Project {p}'s budget now lasts {period} ({rate})."
        before = _days((b.period_end - at) // SECONDS_PER_DAY)
        if raised and at <= b.as_of:
            return f"Project {p} has run out of budget, {before} before {period} ends ({rate})."
        verb = "will run out" if raised else "is now forecast to run out"
        return f"Project {p} {verb} of budget on {_day(at)}, {before} before {period} ends ({rate})."
    if condition.startswith(EXPIRES_IN):
        end = pb.ends_at
        if not raised:
            return f"Project {p}'s {period} allocations now end on {_day(end)}: the reminder ends."
        left = _days(-(-(end - b.as_of) // SECONDS_PER_DAY))
        return (
            f"Project {p}'s {period} allocations end on {_day(end)}, in {left}: {_spent(b)}. "
            "What is unused then expires; ask for an extension on the project's page if you need one."
        )
    share = Fraction(condition.removeprefix(BUDGET_SHARE))
    what = "its whole" if share == 1 else f"{_percent(share)} of its"
    if raised:
        return f"Project {p} has spent {what} {period} budget: {_spent(b)}."
    if why == "unconfigured":
        return f"The {_percent(share)} budget warning of project {p} for {period} is no longer set: it ends."
    if b.spent_share is None or b.allocated_units <= 0:
        return f"Project {p} has nothing allocated in {period} any more: the {_percent(share)} warning ends."
    return f"Project {p} is back under {_percent(share)} of its {period} budget: {_spent(b)}."
