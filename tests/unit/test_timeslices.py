"""Time-slice agreements: windows in UTC and local time, guarantees and overbooking checks."""

from __future__ import annotations

import calendar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.timeslices import (
    Agreement,
    AgreementInvalid,
    FixedWindow,
    Overbooking,
    Weekday,
    WeeklyWindow,
    Window,
    active_at,
    find_overbooking,
    guaranteed_gpus,
    occurrences,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None)
DAY = 86_400
HOUR = 3600


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """A UTC wall-clock time as Unix seconds (independent of the module under test)."""
    return calendar.timegm((year, month, day, hour, minute, 0))


# 2027-01-01 is a Friday, so 2027-01-04 is a Monday; 2027-07-05 is 26 weeks later.
JAN_MON = utc(2027, 1, 4)
JUL_MON = utc(2027, 7, 5)
YEAR_2027 = (utc(2027, 1, 1), utc(2028, 1, 1))


def weekly(
    days: set[Weekday],
    hour: int,
    minute: int,
    duration: int,
    zone: str = "Europe/Berlin",
    valid: tuple[int, int] = YEAR_2027,
) -> WeeklyWindow:
    return WeeklyWindow(frozenset(days), hour, minute, duration, zone, valid[0], valid[1])


MON_WED_BERLIN = weekly({Weekday.MON, Weekday.WED}, 9, 0, 8 * HOUR)


def agreement(
    agreement_id: str, gpus: int, window: Window, project: str = "p", cluster: str = "c"
) -> Agreement:
    return Agreement(agreement_id, project, cluster, gpus, window)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: FixedWindow(100, 100), "not after its start"),
        (lambda: FixedWindow(100, 50), "not after its start"),
        (lambda: weekly(set(), 9, 0, HOUR), "no weekdays"),
        (lambda: weekly({Weekday.MON}, 9, 0, HOUR, zone="Mars/Olympus_Mons"), "unknown time zone"),
        (lambda: weekly({Weekday.MON}, 9, 0, HOUR, zone=""), "unknown time zone"),
        (lambda: weekly({Weekday.MON}, 9, 0, 0), "duration is 1 to"),
        (lambda: weekly({Weekday.MON}, 9, 0, 7 * DAY + 1), "duration is 1 to"),
        (lambda: weekly({Weekday.MON}, 24, 0, HOUR), "hour is 0 to 23"),
        (lambda: weekly({Weekday.MON}, 9, 60, HOUR), "minute is 0 to 59"),
        (lambda: weekly({Weekday.MON}, 9, 0, HOUR, valid=(JAN_MON, JAN_MON)), "not after valid_from"),
        (lambda: agreement("a", 0, FixedWindow(0, 1)), "at least 1"),
        (lambda: agreement("", 1, FixedWindow(0, 1)), "must not be empty"),
    ],
    ids=[
        "a fixed window that ends when it starts is refused",
        "a fixed window that ends before it starts is refused",
        "a weekly window without weekdays is refused",
        "an unknown time zone is refused",
        "an empty time zone name is refused",
        "a zero-second duration is refused",
        "a duration longer than a week is refused",
        "hour 24 is refused",
        "minute 60 is refused",
        "a validity that ends when it starts is refused",
        "an agreement for zero GPUs is refused",
        "an agreement without an id is refused",
    ],
)
def test_invalid_windows_and_agreements_are_refused_with_a_reason(build: object, message: str) -> None:
    with pytest.raises(AgreementInvalid, match=message):
        build()  # type: ignore[operator]


def test_a_window_at_most_a_week_long_is_accepted_and_weekdays_become_weekday_members() -> None:
    window = WeeklyWindow(frozenset({0, 6}), 0, 0, 7 * DAY, "UTC", 0, DAY)  # type: ignore[arg-type]
    assert window.weekdays == frozenset({Weekday.MON, Weekday.SUN})


def test_a_query_longer_than_400_days_is_refused() -> None:
    with pytest.raises(AgreementInvalid, match="longer than 400 days"):
        occurrences(MON_WED_BERLIN, JAN_MON, JAN_MON + 400 * DAY + 1)


def test_a_query_of_exactly_400_days_is_answered() -> None:
    assert len(occurrences(FixedWindow(JAN_MON, JAN_MON + 1), JAN_MON, JAN_MON + 400 * DAY)) == 1


# -- fixed windows ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "covered"),
    [(999, False), (1000, True), (1500, True), (1999, True), (2000, False)],
    ids=[
        "the second before the start is outside",
        "the start is inside",
        "the middle is inside",
        "the last second is inside",
        "the end is outside",
    ],
)
def test_a_fixed_window_covers_its_start_but_not_its_end(at: int, covered: bool) -> None:
    a = agreement("a", 8, FixedWindow(1000, 2000))
    assert active_at([a], "c", at) == ([a] if covered else [])


def test_a_fixed_window_is_returned_whole_when_it_overlaps_the_query() -> None:
    assert occurrences(FixedWindow(1000, 2000), 1500, 1600) == [(1000, 2000)]
    assert occurrences(FixedWindow(1000, 2000), 2000, 3000) == []
    assert occurrences(FixedWindow(1000, 2000), 0, 1000) == []


# -- weekly windows -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "start", "end", "expected"),
    [
        (
            MON_WED_BERLIN,
            JAN_MON,
            JAN_MON + 7 * DAY,
            [(utc(2027, 1, 4, 8), utc(2027, 1, 4, 16)), (utc(2027, 1, 6, 8), utc(2027, 1, 6, 16))],
        ),
        (
            MON_WED_BERLIN,
            JUL_MON,
            JUL_MON + 7 * DAY,
            [(utc(2027, 7, 5, 7), utc(2027, 7, 5, 15)), (utc(2027, 7, 7, 7), utc(2027, 7, 7, 15))],
        ),
        (
            # 2027-03-28 is the last Sunday of March: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
            weekly({Weekday.SUN}, 2, 30, HOUR),
            utc(2027, 3, 27),
            utc(2027, 3, 29),
            [(utc(2027, 3, 28, 1), utc(2027, 3, 28, 2))],
        ),
        (
            # A week before and after the change, 02:30 exists: 01:30 UTC in CET, 00:30 UTC in CEST.
            weekly({Weekday.SUN}, 2, 30, HOUR),
            utc(2027, 3, 21),
            utc(2027, 4, 5),
            [
                (utc(2027, 3, 21, 1, 30), utc(2027, 3, 21, 2, 30)),
                (utc(2027, 3, 28, 1), utc(2027, 3, 28, 2)),
                (utc(2027, 4, 4, 0, 30), utc(2027, 4, 4, 1, 30)),
            ],
        ),
        (
            # 2027-10-31 is the last Sunday of October: 02:30 happens twice; the first is CEST.
            weekly({Weekday.SUN}, 2, 30, HOUR),
            utc(2027, 10, 30),
            utc(2027, 11, 1),
            [(utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30))],
        ),
        (
            # Saturday 22:00 CET for 8 elapsed hours spans the change: it ends at 07:00 CEST.
            weekly({Weekday.SAT}, 22, 0, 8 * HOUR),
            utc(2027, 3, 27),
            utc(2027, 3, 29),
            [(utc(2027, 3, 27, 21), utc(2027, 3, 28, 5))],
        ),
        (
            # Sunday 22:00 for 4 hours runs into Monday; a query on Monday still finds it.
            weekly({Weekday.SUN}, 22, 0, 4 * HOUR, zone="UTC"),
            utc(2027, 1, 11),
            utc(2027, 1, 11, 1),
            [(utc(2027, 1, 10, 22), utc(2027, 1, 11, 2))],
        ),
        (
            weekly(
                {Weekday.MON, Weekday.WED}, 9, 0, 8 * HOUR, valid=(utc(2027, 1, 4, 12), utc(2027, 1, 6, 10))
            ),
            JAN_MON - 7 * DAY,
            JAN_MON + 14 * DAY,
            [(utc(2027, 1, 4, 12), utc(2027, 1, 4, 16)), (utc(2027, 1, 6, 8), utc(2027, 1, 6, 10))],
        ),
        (
            MON_WED_BERLIN,
            utc(2027, 1, 4, 16),
            utc(2027, 1, 6, 8),
            [],
        ),
        (
            # Daily windows of a full day touch each other and read as one continuous guarantee.
            weekly({Weekday.MON, Weekday.TUE}, 0, 0, DAY, zone="UTC"),
            JAN_MON,
            JAN_MON + 7 * DAY,
            [(utc(2027, 1, 4), utc(2027, 1, 6))],
        ),
    ],
    ids=[
        "Mon/Wed 09:00 Berlin in January is 08:00 to 16:00 UTC",
        "Mon/Wed 09:00 Berlin in July is 07:00 to 15:00 UTC",
        "a start in the spring-forward gap starts when the gap ends",
        "the UTC start shifts by an hour across the spring change, the local time does not",
        "an ambiguous fall-back start takes the first occurrence",
        "a duration across the spring change is elapsed seconds",
        "a window crossing midnight and the end of the week is found from the next week",
        "occurrences are clipped to the window's validity",
        "a query between occurrences finds none",
        "touching occurrences of one window are merged",
    ],
)
def test_weekly_occurrences(
    window: WeeklyWindow, start: int, end: int, expected: list[tuple[int, int]]
) -> None:
    assert occurrences(window, start, end) == expected


@pytest.mark.parametrize(
    ("at", "covered"),
    [
        (utc(2027, 1, 10, 21, 59), False),
        (utc(2027, 1, 10, 22), True),
        (utc(2027, 1, 11, 0), True),
        (utc(2027, 1, 11, 2) - 1, True),
        (utc(2027, 1, 11, 2), False),
    ],
    ids=[
        "Sunday 21:59 is before the window",
        "Sunday 22:00 opens it",
        "Monday midnight is inside",
        "Monday 01:59:59 is inside",
        "Monday 02:00 closes it",
    ],
)
def test_a_window_across_the_end_of_the_week_covers_both_sides(at: int, covered: bool) -> None:
    a = agreement("night", 4, weekly({Weekday.SUN}, 22, 0, 4 * HOUR, zone="UTC"))
    assert bool(active_at([a], "c", at)) is covered


def test_guaranteed_gpus_sums_the_projects_active_agreements_on_the_cluster() -> None:
    at = utc(2027, 1, 4, 10)  # Monday 11:00 Berlin
    agreements = [
        agreement("weekly", 16, MON_WED_BERLIN),
        agreement("fixed", 8, FixedWindow(at, at + HOUR)),
        agreement("later", 4, FixedWindow(at + 1, at + HOUR)),
        agreement("other-project", 32, MON_WED_BERLIN, project="q"),
        agreement("other-cluster", 64, MON_WED_BERLIN, cluster="d"),
    ]
    assert guaranteed_gpus(agreements, "p", "c", at) == 24
    assert guaranteed_gpus(agreements, "q", "c", at) == 32
    assert guaranteed_gpus(agreements, "p", "d", at) == 64
    assert guaranteed_gpus(agreements, "p", "c", utc(2027, 1, 5, 10)) == 0  # Tuesday


# -- overbooking --------------------------------------------------------------------------------

T = utc(2027, 1, 4, 8)  # Monday 09:00 Berlin


@pytest.mark.parametrize(
    ("existing", "candidate", "horizon", "expected"),
    [
        (
            [agreement("a", 60, FixedWindow(T, T + 2 * HOUR))],
            agreement("b", 50, FixedWindow(T + HOUR, T + 3 * HOUR)),
            (T + HOUR, T + 3 * HOUR),
            Overbooking(at=T + HOUR, total_gpus=110, cluster_gpus=100, conflicting=("a",)),
        ),
        (
            [agreement("a", 60, FixedWindow(T, T + HOUR))],
            agreement("b", 50, FixedWindow(T + HOUR, T + 2 * HOUR)),
            (T + HOUR, T + 2 * HOUR),
            None,
        ),
        (
            [agreement("a", 60, FixedWindow(T + HOUR, T + 2 * HOUR))],
            agreement("b", 50, FixedWindow(T, T + HOUR)),
            (T, T + HOUR),
            None,
        ),
        (
            [agreement("a", 60, FixedWindow(T, T + 2 * HOUR))],
            agreement("b", 40, FixedWindow(T + HOUR, T + 3 * HOUR)),
            (T + HOUR, T + 3 * HOUR),
            None,
        ),
        (
            # The weekly window is open 08:00-16:00 UTC on Monday 2027-01-04.
            [agreement("weekly", 60, MON_WED_BERLIN)],
            agreement("b", 50, FixedWindow(utc(2027, 1, 4, 15), utc(2027, 1, 4, 18))),
            (utc(2027, 1, 4, 15), utc(2027, 1, 4, 18)),
            Overbooking(at=utc(2027, 1, 4, 15), total_gpus=110, cluster_gpus=100, conflicting=("weekly",)),
        ),
        (
            # The first Wednesday of the weekly candidate is 2027-01-06, open from 08:00 UTC.
            [agreement("fixed", 60, FixedWindow(utc(2027, 1, 6, 14), utc(2027, 1, 6, 20)))],
            agreement("weekly", 50, MON_WED_BERLIN),
            (utc(2027, 1, 1), utc(2027, 12, 31)),
            Overbooking(at=utc(2027, 1, 6, 14), total_gpus=110, cluster_gpus=100, conflicting=("fixed",)),
        ),
        (
            # Evening of the Monday: the weekly window closed at 16:00 UTC.
            [agreement("weekly", 60, MON_WED_BERLIN)],
            agreement("b", 50, FixedWindow(utc(2027, 1, 4, 16), utc(2027, 1, 4, 20))),
            (utc(2027, 1, 4, 16), utc(2027, 1, 4, 20)),
            None,
        ),
        (
            [
                agreement("z", 30, FixedWindow(T, T + 4 * HOUR)),
                agreement("a", 30, FixedWindow(T + HOUR, T + 3 * HOUR)),
                agreement("later", 30, FixedWindow(T + 3 * HOUR, T + 4 * HOUR)),
                agreement("elsewhere", 90, FixedWindow(T, T + 4 * HOUR), cluster="d"),
            ],
            agreement("b", 50, FixedWindow(T, T + 4 * HOUR)),
            (T, T + 4 * HOUR),
            Overbooking(at=T + HOUR, total_gpus=110, cluster_gpus=100, conflicting=("a", "z")),
        ),
        (
            [agreement("a", 60, FixedWindow(T, T + 2 * HOUR))],
            agreement("b", 50, FixedWindow(T + HOUR, T + 3 * HOUR)),
            (T + 2 * HOUR, T + 3 * HOUR),
            None,
        ),
        (
            [],
            agreement("huge", 101, FixedWindow(T, T + HOUR)),
            (T, T + HOUR),
            Overbooking(at=T, total_gpus=101, cluster_gpus=100, conflicting=()),
        ),
    ],
    ids=[
        "60 and 50 GPUs overlapping for an hour on 100 GPUs are refused and name the existing one",
        "a candidate that starts when the existing one ends is not overlapping",
        "a candidate that ends when the existing one starts is not overlapping",
        "a cluster exactly full is allowed",
        "a fixed candidate against a weekly agreement is refused where they meet",
        "a weekly candidate against a fixed agreement is refused at its first clash",
        "a fixed candidate after the weekly window has closed is allowed",
        "only agreements on the candidate's cluster and active at the clash are named, sorted",
        "a clash outside the horizon is not reported",
        "a candidate larger than the cluster is refused on its own",
    ],
)
def test_find_overbooking(
    existing: list[Agreement], candidate: Agreement, horizon: tuple[int, int], expected: Overbooking | None
) -> None:
    assert find_overbooking(existing, candidate, 100, *horizon) == expected


def test_an_overbooking_horizon_longer_than_400_days_is_refused() -> None:
    with pytest.raises(AgreementInvalid, match="longer than 400 days"):
        find_overbooking([], agreement("b", 1, MON_WED_BERLIN), 100, T, T + 401 * DAY)


# -- property: the sweep agrees with checking every second ---------------------------------------

windows = st.tuples(st.integers(0, 40), st.integers(1, 15), st.integers(1, 10))


@PROPERTY
@given(
    existing=st.lists(windows, max_size=6),
    candidate=windows,
    cluster_gpus=st.integers(0, 30),
    horizon_start=st.integers(0, 30),
    horizon_length=st.integers(0, 40),
)
def test_find_overbooking_agrees_with_a_check_of_every_second(
    existing: list[tuple[int, int, int]],
    candidate: tuple[int, int, int],
    cluster_gpus: int,
    horizon_start: int,
    horizon_length: int,
) -> None:
    horizon_end = horizon_start + horizon_length
    others = [agreement(f"e{i}", gpus, FixedWindow(s, s + n)) for i, (s, n, gpus) in enumerate(existing)]
    cs, cn, cg = candidate
    new = agreement("new", cg, FixedWindow(cs, cs + cn))

    expected = None
    for t in range(horizon_start, horizon_end):
        if not cs <= t < cs + cn:
            continue
        active = [a for a in others if a.window.start <= t < a.window.end]  # type: ignore[union-attr]
        total = cg + sum(a.gpus for a in active)
        if total > cluster_gpus:
            ids = tuple(sorted(a.agreement_id for a in active))
            expected = Overbooking(at=t, total_gpus=total, cluster_gpus=cluster_gpus, conflicting=ids)
            break

    assert find_overbooking(others, new, cluster_gpus, horizon_start, horizon_end) == expected
