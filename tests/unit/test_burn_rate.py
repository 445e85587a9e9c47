"""Burn rate: the even-burn line, the daily chart, and when the budget runs out at either rate.

Times are Unix seconds from hand-made UTC dates; every expected number below is worked by hand.
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.burn_rate import BurnRate, DayCharge, burn_rate, even_burn_units

DAY = 86_400
HOUR = 3600
T0 = calendar.timegm((2027, 1, 1, 0, 0, 0))  # a Friday midnight UTC
D0 = dt.date(2027, 1, 1)
END = T0 + 30 * DAY  # a 30-day period: 100 units a day at 3000 allocated
PROPERTY = settings(max_examples=300, deadline=None, database=None)


def day(n: int) -> dt.date:
    return D0 + dt.timedelta(days=n)


def charges(*units: int, first: int = 0) -> list[DayCharge]:
    """One DayCharge per consecutive day from `first`, GPU-seconds = units x 2."""
    return [DayCharge(day(first + i), u, 2 * u) for i, u in enumerate(units)]


def burn(
    daily: list[DayCharge],
    *,
    as_of: int,
    allocated: int = 3000,
    held: int = 0,
    start: int = T0,
    end: int = END,
) -> BurnRate:
    return burn_rate(
        allocated_units=allocated,
        held_units=held,
        period_start=start,
        period_end=end,
        as_of=as_of,
        daily=daily,
    )


# -- the even-burn line -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocated", "at", "expected"),
    [
        (3000, T0, 0),
        (3000, T0 - DAY, 0),
        (3000, T0 + DAY, 100),
        (3000, T0 + DAY + 12 * HOUR, 150),
        (3000, END, 3000),
        (3000, END + DAY, 3000),
        (10, T0 + DAY, 0),  # 10/30 = 0.33: floor
        (10, T0 + 3 * DAY, 1),
        (0, T0 + DAY, 0),
    ],
    ids=[
        "nothing is planned at the period's start",
        "a time before the period is clamped to its start",
        "a thirtieth of the budget after one day of thirty",
        "the line is continuous inside a day",
        "the whole budget at the period's end",
        "a time after the period is clamped to its end",
        "the line is floored to whole units",
        "a third of a unit a day reaches one unit on the third day",
        "nothing allocated plans nothing",
    ],
)
def test_the_even_burn_line(allocated: int, at: int, expected: int) -> None:
    assert even_burn_units(allocated, T0, END, at) == expected


@pytest.mark.parametrize("end", [T0, T0 - 1], ids=["an empty period", "a period ending before it starts"])
def test_a_period_that_does_not_end_after_it_starts_is_an_error(end: int) -> None:
    with pytest.raises(ValueError, match="at or before it starts"):
        even_burn_units(100, T0, end, T0)
    with pytest.raises(ValueError, match="at or before it starts"):
        burn([], as_of=T0, end=end)


@pytest.mark.parametrize(
    ("allocated", "held", "daily"),
    [(-1, 0, []), (100, -1, []), (100, 0, [DayCharge(day(0), -5, 0)]), (100, 0, [DayCharge(day(0), 5, -1)])],
    ids=["negative allocated", "negative held", "a negative day's charge", "negative GPU-seconds"],
)
def test_negative_amounts_are_an_error(allocated: int, held: int, daily: list[DayCharge]) -> None:
    with pytest.raises(ValueError, match="negative"):
        burn(daily, as_of=T0 + 2 * DAY, allocated=allocated, held=held)


# -- the chart ----------------------------------------------------------------------------------


def test_the_days_run_from_the_period_start_to_the_day_of_as_of_with_the_plan_at_each_days_end() -> None:
    result = burn([DayCharge(day(0), 50, 7), DayCharge(day(2), 120, 9)], as_of=T0 + 2 * DAY + 6 * HOUR)
    assert [
        (d.day, d.charge_units, d.gpu_seconds, d.cumulative_units, d.even_burn_units) for d in result.days
    ] == [
        (day(0), 50, 7, 50, 100),
        (day(1), 0, 0, 50, 200),  # a day without charges is a day of zeros
        (day(2), 120, 9, 170, 300),  # the plan runs to the day's end, past as_of
    ]
    assert result.charged_units == 170


@pytest.mark.parametrize(
    ("as_of", "expected_days"),
    [
        (T0, 0),
        (T0 + 1, 1),
        (T0 + 3 * DAY, 3),
        (T0 + 3 * DAY + 1, 4),
        (END, 30),
    ],
    ids=[
        "as_of at the period's start has no days yet",
        "one second into the period is its first day",
        "as_of at midnight ends on the day before",
        "one second past midnight starts the next day",
        "as_of at the period's end has every day",
    ],
)
def test_the_number_of_days_on_the_chart(as_of: int, expected_days: int) -> None:
    assert len(burn([], as_of=as_of).days) == expected_days


def test_days_outside_the_period_or_not_begun_by_as_of_are_ignored_and_repeated_days_add_up() -> None:
    daily = [
        DayCharge(day(-1), 1000, 1000),  # before the period
        DayCharge(day(0), 10, 1),
        DayCharge(day(0), 5, 1),  # the same day twice (two clusters): both count
        DayCharge(day(1), 20, 2),
        DayCharge(day(4), 999, 999),  # after as_of
    ]
    result = burn(daily, as_of=T0 + 4 * DAY)
    assert result.charged_units == 35
    assert [d.charge_units for d in result.days] == [15, 20, 0, 0]
    assert [d.gpu_seconds for d in result.days] == [2, 2, 0, 0]


def test_the_last_day_of_a_period_ending_mid_day_plans_the_whole_budget() -> None:
    end = T0 + 2 * DAY + 12 * HOUR  # 2.5 days, 1000 units: 400 a day
    result = burn(charges(1, 1, 1), as_of=end, allocated=1000, end=end)
    assert [d.even_burn_units for d in result.days] == [400, 800, 1000]


# -- forecasts ----------------------------------------------------------------------------------


def test_a_case_worked_by_hand_with_both_rates() -> None:
    # Days 0-2 burn 300 a day, days 3-9 only 50: 1250 charged in 10 days, 250 held, 1500 left.
    result = burn(charges(300, 300, 300, 50, 50, 50, 50, 50, 50, 50), as_of=T0 + 10 * DAY, held=250)
    assert result.charged_units == 1250
    assert result.remaining_units == 1500
    assert result.elapsed_share == Fraction(1, 3)
    assert result.spent_share == Fraction(1500, 3000)
    assert result.days[-1].cumulative_units == 1250
    assert result.days[-1].even_burn_units == 1000

    ptd = result.period_to_date
    assert (ptd.basis, ptd.window_s, ptd.window_units, ptd.units_per_day) == (
        "period_to_date", 10 * DAY, 1250, 125,
    )  # fmt: skip
    # 1500 more at 125 a day: 12 days, inside the 20 left.
    assert (ptd.exhaustion_at, ptd.days_left, ptd.lasts_period) == (T0 + 22 * DAY, 12, False)
    assert ptd.projected_units_at_end == 1500 + 125 * 20

    trailing = result.trailing_7d
    assert (trailing.basis, trailing.window_s, trailing.window_units, trailing.units_per_day) == (
        "trailing_7d", 7 * DAY, 350, 50,
    )  # fmt: skip
    # 1500 more at 50 a day: 30 days, past the period's end.
    assert (trailing.exhaustion_at, trailing.days_left, trailing.lasts_period) == (None, None, True)
    assert trailing.projected_units_at_end == 1500 + 50 * 20


def test_exact_integers_ceiling_for_exhaustion_and_floors_elsewhere() -> None:
    # 3-day period, 10 allocated; 7 charged on day 0; as_of after one day: 3 left at 7 a day.
    result = burn([DayCharge(day(0), 7, 1)], as_of=T0 + DAY, allocated=10, end=T0 + 3 * DAY)
    ptd = result.period_to_date
    assert ptd.units_per_day == 7
    # 3 x 86400 / 7 = 37028.57...: the first whole second at which it is spent is 37029.
    assert ptd.exhaustion_at == T0 + DAY + 37_029
    assert ptd.days_left == 0
    assert ptd.projected_units_at_end == 7 + 7 * 2
    assert result.days[0].even_burn_units == 3  # 10/3 floored
    assert result.elapsed_share == Fraction(1, 3)
    assert result.spent_share == Fraction(7, 10)


def test_lasting_exactly_to_the_period_end_counts_as_lasting_the_period() -> None:
    # 20 allocated over 2 days, 10 charged on day 0: at 10 a day the last unit goes at the end.
    result = burn([DayCharge(day(0), 10, 1)], as_of=T0 + DAY, allocated=20, end=T0 + 2 * DAY)
    ptd = result.period_to_date
    assert (ptd.exhaustion_at, ptd.days_left, ptd.lasts_period, ptd.projected_units_at_end) == (
        None, None, True, 20,
    )  # fmt: skip
    one_more = burn([DayCharge(day(0), 11, 1)], as_of=T0 + DAY, allocated=20, end=T0 + 2 * DAY)
    assert one_more.period_to_date.exhaustion_at == T0 + DAY + 70_691  # ceil(9 x 86400 / 11)
    assert not one_more.period_to_date.lasts_period


def test_holds_count_as_spent() -> None:
    without = burn(charges(100, 100), as_of=T0 + 2 * DAY)
    held = burn(charges(100, 100), as_of=T0 + 2 * DAY, held=1000)
    assert without.remaining_units == 2800
    assert held.remaining_units == 1800
    assert held.spent_share == Fraction(1200, 3000)
    assert without.period_to_date.lasts_period  # 2800 at 100 a day: 28 days, exactly to the end
    assert held.period_to_date.exhaustion_at == T0 + 20 * DAY  # 1800 at 100 a day: 18 days
    assert held.period_to_date.projected_units_at_end == 1200 + 100 * 28


@pytest.mark.parametrize(
    ("daily", "held"),
    [(charges(1500, 1500), 0), (charges(1000, 1000), 1000), (charges(2000, 2000), 0)],
    ids=["charged the whole budget", "holds take the rest of it", "charged more than the budget"],
)
def test_an_exhausted_budget_runs_out_at_as_of(daily: list[DayCharge], held: int) -> None:
    result = burn(daily, as_of=T0 + 2 * DAY, held=held)
    assert result.remaining_units <= 0
    for forecast in (result.period_to_date, result.trailing_7d):
        assert (forecast.exhaustion_at, forecast.days_left, forecast.lasts_period) == (T0 + 2 * DAY, 0, False)


def test_nothing_allocated_has_no_spent_share_and_is_exhausted_from_the_start() -> None:
    result = burn(charges(5), as_of=T0 + DAY, allocated=0)
    assert result.spent_share is None
    assert result.remaining_units == -5
    assert result.period_to_date.exhaustion_at == T0 + DAY
    assert [d.even_burn_units for d in result.days] == [0]


@pytest.mark.parametrize(
    ("as_of", "window_s"),
    [(T0, 0), (T0 + 2 * DAY, 2 * DAY)],
    ids=["at the period's start", "two days in"],
)
def test_no_usage_yet_lasts_the_period_at_a_rate_of_nothing(as_of: int, window_s: int) -> None:
    result = burn([], as_of=as_of, held=40)
    for forecast in (result.period_to_date, result.trailing_7d):
        assert (forecast.window_s, forecast.window_units, forecast.units_per_day) == (window_s, 0, 0)
        assert (forecast.exhaustion_at, forecast.days_left, forecast.lasts_period) == (None, None, True)
        assert forecast.projected_units_at_end == 40  # only the holds


@pytest.mark.parametrize(
    ("as_of", "clamped", "days"),
    [(T0 - 5 * DAY, T0, 0), (END + 5 * DAY, END, 30)],
    ids=["as_of before the period is its start", "as_of after the period is its end"],
)
def test_as_of_is_clamped_into_the_period(as_of: int, clamped: int, days: int) -> None:
    result = burn(charges(*[10] * 40, first=-5), as_of=as_of)
    assert result.as_of == clamped
    assert len(result.days) == days
    assert result.charged_units == 10 * days
    assert result.elapsed_share == Fraction(clamped - T0, END - T0)
    assert result.trailing_7d.window_s == min(7 * DAY, clamped - T0)
    assert result.trailing_7d.projected_units_at_end == 10 * days  # nothing left to project


def test_the_trailing_window_at_the_period_start_is_as_long_as_the_period_so_far() -> None:
    result = burn(charges(30, 60, 90), as_of=T0 + 3 * DAY)
    assert result.trailing_7d.window_s == 3 * DAY
    assert result.trailing_7d.window_units == 180
    assert result.trailing_7d == replace(result.period_to_date, basis="trailing_7d")


def test_the_day_the_trailing_window_cuts_is_left_out_and_the_window_keeps_its_length() -> None:
    # as_of at noon of day 10: the window starts at noon of day 3; day 3 is left out, days 4-10 count.
    daily = charges(*[1000] * 4, 10, 10, 10, 10, 10, 10, 10)
    result = burn(daily, as_of=T0 + 10 * DAY + 12 * HOUR, allocated=100_000)
    assert result.trailing_7d.window_s == 7 * DAY
    assert result.trailing_7d.window_units == 70
    assert result.trailing_7d.units_per_day == 10
    assert result.period_to_date.window_units == 4070


def test_a_period_starting_mid_day_counts_its_first_day_in_both_windows() -> None:
    start = T0 + 12 * HOUR
    result = burn(charges(24, 48), as_of=start + DAY, start=start, end=start + 10 * DAY, allocated=1000)
    assert [d.day for d in result.days] == [day(0), day(1)]
    assert result.charged_units == 72
    assert result.trailing_7d.window_units == result.period_to_date.window_units == 72
    assert result.period_to_date.units_per_day == 72


# -- properties ---------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> BurnRate:
    start = T0 + draw(st.integers(0, DAY - 1)) * draw(st.sampled_from([0, 1]))  # midnight or mid-day
    end = start + draw(st.integers(1, 60 * DAY))
    as_of = draw(st.integers(start - 2 * DAY, end + 2 * DAY))
    daily = draw(
        st.lists(
            st.builds(DayCharge, st.integers(-3, 65).map(day), st.integers(0, 10**6), st.integers(0, 10**6)),
            max_size=40,
        )
    )
    return burn(
        daily,
        as_of=as_of,
        allocated=draw(st.integers(0, 10**7)),
        held=draw(st.integers(0, 10**6)),
        start=start,
        end=end,
    )


@PROPERTY
@given(scenarios())
def test_properties_of_any_burn_rate(result: BurnRate) -> None:
    spent = result.charged_units + result.held_units
    assert result.period_start <= result.as_of <= result.period_end
    assert result.charged_units == sum(d.charge_units for d in result.days)
    assert (
        result.days[-1].cumulative_units == result.charged_units if result.days else result.charged_units == 0
    )
    assert all(
        a.day + dt.timedelta(days=1) == b.day for a, b in zip(result.days, result.days[1:], strict=False)
    )
    assert [d.even_burn_units for d in result.days] == sorted(d.even_burn_units for d in result.days)
    assert all(0 <= d.even_burn_units <= result.allocated_units for d in result.days)
    for forecast in (result.period_to_date, result.trailing_7d):
        assert forecast.projected_units_at_end >= spent
        assert 0 <= forecast.window_s <= result.as_of - result.period_start
        assert 0 <= forecast.window_units <= result.charged_units
        assert forecast.lasts_period == (forecast.exhaustion_at is None) == (forecast.days_left is None)
        if forecast.exhaustion_at is not None:
            assert result.as_of <= forecast.exhaustion_at <= result.period_end
            assert forecast.days_left == (forecast.exhaustion_at - result.as_of) // DAY
        if result.remaining_units <= 0:
            assert forecast.exhaustion_at == result.as_of
        elif forecast.exhaustion_at is not None:  # the rate spends what remains by then, not before
            at, rate_s = forecast.exhaustion_at - result.as_of, forecast.window_s
            assert forecast.window_units * at >= result.remaining_units * rate_s
            assert forecast.window_units * (at - 1) < result.remaining_units * rate_s
    assert result.trailing_7d.window_s <= 7 * DAY
