"""Burn rate of a project's budget over a period: how fast it is spent and when it runs out.

Pure arithmetic on integers (charge units, Unix seconds); shares are exact Fractions. Holds
(charges the admission service has promised to running jobs) count as spent for the forecast.
INTERFACE FIXED (other modules use these names); implementation: see the functions' docstrings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

SECONDS_PER_DAY = 86_400
TRAILING_DAYS = 7

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
    raise NotImplementedError


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
    ran up to then). The period-to-date rate is charged / (as_of - start); the trailing rate is what
    was charged on the last 7 days (as_of - 7 d .. as_of, clipped to the period) over that window."""
    raise NotImplementedError
