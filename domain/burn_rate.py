"""Burn rate of a project's budget over a period: how fast it is spent and when it runs out.

Pure arithmetic on integers (charge units, Unix seconds); shares are exact Fractions. Holds
(charges the admission service has promised to running jobs) count as spent for the forecast.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

SECONDS_PER_DAY = 86_400
TRAILING_DAYS = 7
_EPOCH = dt.date(1970, 1, 1)

Basis = Literal["period_to_date", "trailing_7d"]


@dataclass(frozen=True, slots=True)
class DayCharge:
    """What the ledger charged the project on one UTC day."""

    day: dt.date
    charge_units: int
    gpu_seconds: int


@dataclass(frozen=True, slots=True)
class BurnDay:
    """One UTC day of the period up to `as_of`, for the burn chart."""

    day: dt.date
    charge_units: int  # charged that day
    gpu_seconds: int
    cumulative_units: int  # charged from the period's start to the day's end (or as_of)
    even_burn_units: int  # allocated x share of the period elapsed at the day's end (floor)


@dataclass(frozen=True, slots=True)
class Forecast:
    basis: Basis
    window_s: int  # the seconds the rate was measured over (0: no data yet)
    window_units: int  # charge units charged in that window
    units_per_day: int  # window_units * 86400 // window_s (0 when window_s is 0)
    exhaustion_at: int | None  # Unix s when charged + held reaches allocated at this rate;
    # as_of if it already has; None when it does not happen before the period's end
    days_left: int | None  # whole days from as_of to exhaustion_at (floor); None with it
    lasts_period: bool  # exhaustion_at is None
    projected_units_at_end: int  # charged + held + rate x (period_end - as_of) (floor)


@dataclass(frozen=True, slots=True)
class BurnRate:
    period_start: int
    period_end: int
    as_of: int  # clamped into [period_start, period_end]
    allocated_units: int
    charged_units: int  # in the period up to as_of
    held_units: int
    elapsed_share: Fraction  # (as_of - start) / (end - start)
    spent_share: Fraction | None  # (charged + held) / allocated; None when nothing is allocated
    days: tuple[BurnDay, ...]
    period_to_date: Forecast
    trailing_7d: Forecast

    @property
    def remaining_units(self) -> int:
        return self.allocated_units - self.charged_units - self.held_units


def even_burn_units(allocated_units: int, period_start: int, period_end: int, at: int) -> int:
    """The even-burn line: what would be spent by `at` if the budget were spent at a constant rate."""
    if period_end <= period_start:
        raise ValueError(f"the period ends ({period_end}) at or before it starts ({period_start})")
    clamped = min(max(at, period_start), period_end)
    return allocated_units * (clamped - period_start) // (period_end - period_start)


def _day_start(day: dt.date) -> int:
    return (day - _EPOCH).days * SECONDS_PER_DAY


def _day_of(at: int) -> dt.date:
    return _EPOCH + dt.timedelta(days=at // SECONDS_PER_DAY)


def _forecast(
    basis: Basis, window_s: int, window_units: int, remaining: int, spent: int, as_of: int, end: int
) -> Forecast:
    units_per_day = window_units * SECONDS_PER_DAY // window_s if window_s > 0 else 0
    exhaustion: int | None
    if remaining <= 0:
        exhaustion = as_of
    elif window_units <= 0 or window_s <= 0:
        exhaustion = None  # nothing burns: it lasts
    else:
        # Ceiling division: the first second at which the rate has spent what remains.
        at = as_of + -(-remaining * window_s // window_units)
        exhaustion = at if at < end else None  # lasting to the very end counts as lasting
    projected = spent + (window_units * (end - as_of) // window_s if window_s > 0 else 0)
    return Forecast(
        basis=basis,
        window_s=window_s,
        window_units=window_units,
        units_per_day=units_per_day,
        exhaustion_at=exhaustion,
        days_left=(exhaustion - as_of) // SECONDS_PER_DAY if exhaustion is not None else None,
        lasts_period=exhaustion is None,
        projected_units_at_end=projected,
    )


def burn_rate(
    *,
    allocated_units: int,
    held_units: int,
    period_start: int,
    period_end: int,
    as_of: int,
    daily: Sequence[DayCharge],
) -> BurnRate:
    """The burn rate as of `as_of` from the project's daily charges (days outside the period and
    after as_of are ignored; a day that as_of cuts counts whole: the ledger has charged only what
    ran up to then; so does a day that the period's start cuts, its charge cannot be split). The
    period-to-date rate is charged / (as_of - start); the trailing rate is what was charged on the
    last 7 days (as_of - 7 d .. as_of, clipped to the period) over that window.

    Granularity is the UTC day: a day counts in the trailing window only when its part in the
    period starts at or after the window's start, so the day that as_of - 7 d cuts is left out (its
    charge cannot be split) while the window keeps its full length; the rate errs low, never high.
    The even-burn line of a day is the plan at the day's end (clipped to the period), not to
    as_of: the plan does not stop with the usage."""
    if period_end <= period_start:
        raise ValueError(f"the period ends ({period_end}) at or before it starts ({period_start})")
    if allocated_units < 0 or held_units < 0:
        raise ValueError(f"allocated ({allocated_units}) and held ({held_units}) units cannot be negative")
    as_of = min(max(as_of, period_start), period_end)
    first = _day_of(period_start)
    by_day: dict[dt.date, tuple[int, int]] = {}
    for d in daily:
        if d.charge_units < 0 or d.gpu_seconds < 0:
            raise ValueError(f"the charges of {d.day} cannot be negative: {d}")
        if first <= d.day and _day_start(d.day) < as_of:
            units, secs = by_day.get(d.day, (0, 0))  # the same day twice: both count
            by_day[d.day] = (units + d.charge_units, secs + d.gpu_seconds)
    trailing_start = max(period_start, as_of - TRAILING_DAYS * SECONDS_PER_DAY)
    days: list[BurnDay] = []
    cumulative = trailing_units = 0
    day = first
    while _day_start(day) < as_of:  # as_of at midnight: that day has not begun
        units, secs = by_day.get(day, (0, 0))
        cumulative += units
        if max(_day_start(day), period_start) >= trailing_start:
            trailing_units += units
        day_end = min(_day_start(day) + SECONDS_PER_DAY, period_end)
        even = even_burn_units(allocated_units, period_start, period_end, day_end)
        days.append(BurnDay(day, units, secs, cumulative, even))
        day += dt.timedelta(days=1)
    charged = cumulative
    spent = charged + held_units  # holds are promised: spent for the forecast
    remaining = allocated_units - spent
    return BurnRate(
        period_start=period_start,
        period_end=period_end,
        as_of=as_of,
        allocated_units=allocated_units,
        charged_units=charged,
        held_units=held_units,
        elapsed_share=Fraction(as_of - period_start, period_end - period_start),
        spent_share=Fraction(spent, allocated_units) if allocated_units > 0 else None,
        days=tuple(days),
        period_to_date=_forecast(
            "period_to_date", as_of - period_start, charged, remaining, spent, as_of, period_end
        ),
        trailing_7d=_forecast(
            "trailing_7d", as_of - trailing_start, trailing_units, remaining, spent, as_of, period_end
        ),
    )
