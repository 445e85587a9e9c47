"""The usage route's default range: always answerable, whatever one bad event recorded (issue 28)."""

from __future__ import annotations

import datetime as dt

from allmende.services.api.routes_usage import MAX_RANGE_DAYS, _default_range

D = dt.date
LONGEST = dt.timedelta(days=MAX_RANGE_DAYS)


def test_a_span_longer_than_the_bound_shows_its_newest_days() -> None:
    span = (D(2021, 3, 4), D(2100, 1, 1))  # one event stamped in 2100
    assert _default_range(span, None, None) == (D(2100, 1, 1) - LONGEST, D(2100, 1, 1))


def test_one_end_given_the_other_is_filled_in_within_the_bound() -> None:
    span = (D(2021, 3, 4), D(2100, 1, 1))
    assert _default_range(span, D(2021, 3, 4), None) == (D(2021, 3, 4), D(2021, 3, 4) + LONGEST)
    assert _default_range(span, None, D(2021, 5, 3)) == (D(2021, 3, 4), D(2021, 5, 3))


def test_a_short_span_is_shown_whole_and_a_range_given_whole_is_kept() -> None:
    span = (D(2021, 3, 4), D(2021, 5, 3))
    assert _default_range(span, None, None) == span
    assert _default_range(span, D(2000, 1, 1), D(2100, 1, 1)) == (D(2000, 1, 1), D(2100, 1, 1))
