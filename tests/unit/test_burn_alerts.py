"""Burn warnings: raised and cleared once per crossing, and the fold of the alerts log."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from fractions import Fraction

import orjson
import pytest

from allmende.domain.admission import UNITS_PER_GPU_HOUR
from allmende.domain.burn_alerts import (
    EARLY_EXHAUSTION,
    BurnAlertState,
    ProjectBurn,
    Thresholds,
    evaluate,
    fold,
    share_label,
)
from allmende.domain.burn_rate import SECONDS_PER_DAY, BurnRate, Forecast
from allmende.schemas.alert_events import (
    AlertEvent,
    BurnWarningCleared,
    BurnWarningRaised,
    encode_alert_event,
    parse_alert_event,
)
from allmende.schemas.events import ContractError

H = UNITS_PER_GPU_HOUR
DAY = SECONDS_PER_DAY
Q1_START = int(dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp())
Q1_END = int(dt.datetime(2027, 4, 1, tzinfo=dt.UTC).timestamp())
FEB_1 = int(dt.datetime(2027, 2, 1, tzinfo=dt.UTC).timestamp())
NOW = FEB_1 + 3600
THRESHOLDS = Thresholds(days_early=7, budget_shares=(Fraction(4, 5), Fraction(1)))
SHARE_80, SHARE_100 = "budget-share:0.8", "budget-share:1.0"


def burn_of(
    *,
    allocated_h: float = 10_000,
    charged_h: float = 0,
    held_h: float = 0,
    rate_h: float = 0,
    as_of: int = FEB_1,
    start: int = Q1_START,
    end: int = Q1_END,
) -> BurnRate:
    """A burn rate whose trailing-7-day forecast follows from the figures (GPU-hours, per day)."""
    allocated, charged, held, rate = (round(x * H) for x in (allocated_h, charged_h, held_h, rate_h))
    left = allocated - charged - held
    at: int | None
    if left <= 0:
        at = as_of
    elif rate == 0:
        at = None
    else:
        at = as_of - (-left * DAY // rate)
        at = None if at >= end else at
    forecast = Forecast(
        basis="trailing_7d", window_s=7 * DAY, window_units=7 * rate, units_per_day=rate, exhaustion_at=at,
        days_left=None if at is None else (at - as_of) // DAY, lasts_period=at is None,
        projected_units_at_end=charged + held + rate * (end - as_of) // DAY,
    )  # fmt: skip
    return BurnRate(
        period_start=start, period_end=end, as_of=as_of, allocated_units=allocated, charged_units=charged,
        held_units=held, elapsed_share=Fraction(as_of - start, end - start),
        spent_share=Fraction(charged + held, allocated) if allocated else None, days=(),
        period_to_date=forecast, trailing_7d=forecast,
    )  # fmt: skip


def project(
    burn: BurnRate, name: str = "vision", period: str = "2027-Q1", idle_units: int = 0
) -> ProjectBurn:
    return ProjectBurn(name, period, burn, idle_units)


def round_of(
    state: BurnAlertState, *burns: ProjectBurn, thresholds: Thresholds = THRESHOLDS
) -> list[AlertEvent]:
    """One alerter round: evaluate, then fold what was emitted (as the service does once acked)."""
    events = evaluate(burns, thresholds, state, NOW)
    for event in events:
        state.apply(event)
    return events


def kinds(events: Sequence[AlertEvent]) -> list[tuple[str, str, int]]:
    return [(e.type, e.condition, e.crossing) for e in events]


QUIET = burn_of(charged_h=1_000, rate_h=10)  # lasts the period, 10 % spent
FAST = burn_of(charged_h=7_660, rate_h=120)  # 2,340 left at 120/day: runs out 2027-02-20 12:00


def test_the_lead_reads_when_and_how_early_the_budget_runs_out() -> None:
    [event] = round_of(BurnAlertState(), project(FAST))
    assert isinstance(event, BurnWarningRaised)
    assert event.message == (
        "Project vision will run out of budget on 2027-02-20, 39 days before 2027-Q1 ends "
        "(last 7 days' rate: 120 weighted GPU-hours/day)."
    )
    assert (event.project, event.period, event.condition, event.crossing) == (
        "vision", "2027-Q1", EARLY_EXHAUSTION, 1,
    )  # fmt: skip
    assert event.exhaustion_at == FEB_1 + 19 * DAY + DAY // 2
    assert event.trailing_units_per_day == 120 * H
    assert event.remaining_units == 2_340 * H
    assert event.key == "vision/2027-Q1/early-exhaustion"


def test_a_warning_is_raised_once_not_again_while_it_holds() -> None:
    state = BurnAlertState()
    assert len(round_of(state, project(FAST))) == 1
    assert round_of(state, project(FAST)) == []
    faster = burn_of(charged_h=8_000, rate_h=200, as_of=FEB_1 + DAY)  # 80 %: a new condition only
    assert kinds(round_of(state, project(faster))) == [("BurnWarningRaised", SHARE_80, 1)]
    assert round_of(state, project(faster)) == []


def test_a_warning_is_cleared_when_its_condition_ends_and_raised_again_with_a_new_id() -> None:
    state = BurnAlertState()
    [first] = round_of(state, project(FAST))
    slower = burn_of(charged_h=7_700, rate_h=30, as_of=FEB_1 + DAY)  # 2,300 at 30/day: lasts
    [cleared] = round_of(state, project(slower))
    assert isinstance(cleared, BurnWarningCleared) and cleared.why == "resolved"
    assert (cleared.condition, cleared.crossing) == (EARLY_EXHAUSTION, 1)
    assert cleared.message == (
        "Project vision's budget now lasts 2027-Q1 (last 7 days' rate: 30 weighted GPU-hours/day)."
    )
    assert state.active == {}
    assert round_of(state, project(slower)) == []
    [again] = round_of(state, project(burn_of(charged_h=7_700, rate_h=150, as_of=FEB_1 + 2 * DAY)))
    assert isinstance(again, BurnWarningRaised) and again.crossing == 2
    assert len({first.event_id, cleared.event_id, again.event_id}) == 3
    assert state.active == {("vision", "2027-Q1", EARLY_EXHAUSTION): 2}


def test_the_clearing_sentence_names_the_new_date_when_it_still_runs_out_but_not_as_early() -> None:
    state = BurnAlertState()
    round_of(state, project(FAST))
    # 2,340 left at 45/day: 52 days, 2027-03-25, 7 days before the end: not more than 7 early
    [cleared] = round_of(state, project(burn_of(charged_h=7_660, rate_h=45)))
    assert cleared.message == (
        "Project vision is now forecast to run out of budget on 2027-03-25, 7 days before 2027-Q1 "
        "ends (last 7 days' rate: 45 weighted GPU-hours/day)."
    )


def test_every_share_passed_in_one_jump_is_raised() -> None:
    state = BurnAlertState()
    over = burn_of(charged_h=10_050, held_h=450, rate_h=100)  # 105 %, used up
    events = round_of(state, project(over))
    assert kinds(events) == [
        ("BurnWarningRaised", EARLY_EXHAUSTION, 1),
        ("BurnWarningRaised", SHARE_80, 1),
        ("BurnWarningRaised", SHARE_100, 1),
    ]
    early, eighty, whole = (e.message for e in events)
    assert early == (
        "Project vision has run out of budget, 59 days before 2027-Q1 ends "
        "(last 7 days' rate: 100 weighted GPU-hours/day)."
    )
    assert eighty == (
        "Project vision has spent 80% of its 2027-Q1 budget: 10,500 of 10,000 weighted GPU-hours "
        "charged or held, 500 over."
    )
    assert whole.startswith("Project vision has spent its whole 2027-Q1 budget: 10,500 of 10,000")
    assert round_of(state, project(over)) == []


def test_a_share_is_passed_on_reaching_it_and_held_units_count_as_spent() -> None:
    state = BurnAlertState()
    assert round_of(state, project(burn_of(charged_h=7_000, held_h=999))) == []
    [event] = round_of(state, project(burn_of(charged_h=7_000, held_h=1_000)))
    assert (event.condition, event.held_units) == (SHARE_80, 1_000 * H)
    # the hold released: back under 80 %
    [cleared] = round_of(state, project(burn_of(charged_h=7_500)))
    assert cleared.message == (
        "Project vision is back under 80% of its 2027-Q1 budget: 7,500 of 10,000 weighted GPU-hours "
        "charged or held, 2,500 left."
    )


def test_nothing_allocated_raises_no_warning() -> None:
    nothing = burn_of(allocated_h=0, charged_h=500, rate_h=100)
    assert nothing.spent_share is None and nothing.trailing_7d.exhaustion_at == FEB_1
    assert round_of(BurnAlertState(), project(nothing)) == []


def test_an_allocation_taken_away_clears_its_warnings() -> None:
    state = BurnAlertState()
    round_of(state, project(burn_of(charged_h=9_000, rate_h=10)))
    events = round_of(state, project(burn_of(allocated_h=0, charged_h=9_000, rate_h=10)))
    assert kinds(events) == [("BurnWarningCleared", SHARE_80, 1)]
    assert (
        events[0].message == "Project vision has nothing allocated in 2027-Q1 any more: the 80% warning ends."
    )


def test_a_budget_that_lasts_the_period_raises_no_early_warning() -> None:
    assert QUIET.trailing_7d.lasts_period
    assert round_of(BurnAlertState(), project(QUIET)) == []
    idle = burn_of(charged_h=5_000, rate_h=0)  # nothing in the last 7 days
    assert round_of(BurnAlertState(), project(idle)) == []


def test_early_means_more_than_the_days_early_whole_days() -> None:
    # 1,000 left at 25/day: 40 days after 2027-02-01, i.e. 2027-03-13, 19 days before the end
    b = burn_of(charged_h=7_000, held_h=2_000, rate_h=25)
    assert (
        round_of(BurnAlertState(), project(b), thresholds=Thresholds(days_early=19, budget_shares=())) == []
    )
    [event] = round_of(BurnAlertState(), project(b), thresholds=Thresholds(days_early=18, budget_shares=()))
    assert event.condition == EARLY_EXHAUSTION and "19 days before" in event.message


def test_a_share_no_longer_configured_is_cleared() -> None:
    state = BurnAlertState()
    round_of(state, project(burn_of(charged_h=9_000)))
    only_whole = Thresholds(days_early=7, budget_shares=(Fraction(1),))
    [cleared] = round_of(state, project(burn_of(charged_h=9_000)), thresholds=only_whole)
    assert isinstance(cleared, BurnWarningCleared) and cleared.why == "unconfigured"
    assert cleared.condition == SHARE_80
    assert round_of(state, project(burn_of(charged_h=9_000)), thresholds=only_whole) == []


def test_projects_and_periods_are_judged_apart_and_a_project_listed_twice_once() -> None:
    state = BurnAlertState()
    events = round_of(
        state, project(FAST), project(FAST), project(FAST, name="nlp"), project(QUIET, period="2027-Q2")
    )
    assert [(e.project, e.period) for e in events] == [("vision", "2027-Q1"), ("nlp", "2027-Q1")]
    # a project the source no longer reports keeps its warnings
    [cleared] = round_of(state, project(QUIET, name="nlp"))
    assert (cleared.type, cleared.project, cleared.condition) == (
        "BurnWarningCleared",
        "nlp",
        EARLY_EXHAUSTION,
    )
    assert ("vision", "2027-Q1", EARLY_EXHAUSTION) in state.active


def test_event_ids_derive_from_the_condition_and_the_crossing() -> None:
    one = evaluate([project(FAST)], THRESHOLDS, BurnAlertState(), NOW)
    later = evaluate([project(FAST)], THRESHOLDS, BurnAlertState(), NOW + 999)
    assert [e.event_id for e in one] == [e.event_id for e in later]
    assert one[0].event_id == "burn:vision/2027-Q1/early-exhaustion/1:raised"


def _history() -> list[AlertEvent]:
    """Rounds of a project's quarter: fast, slower, a hold pushing it over 80 %, released, fast."""
    state = BurnAlertState()
    rounds = [
        burn_of(charged_h=7_660, rate_h=120),
        burn_of(charged_h=7_700, rate_h=30, as_of=FEB_1 + DAY),
        burn_of(charged_h=7_700, held_h=600, rate_h=30, as_of=FEB_1 + 2 * DAY),
        burn_of(charged_h=7_750, rate_h=30, as_of=FEB_1 + 3 * DAY),
        burn_of(charged_h=8_900, held_h=1_200, rate_h=300, as_of=FEB_1 + 4 * DAY),
    ]
    events: list[AlertEvent] = []
    for b in rounds:
        events += round_of(state, project(b), project(b, name="nlp"))
    assert fold(events).active == state.active
    return events


def test_replaying_the_log_rebuilds_the_active_set_exactly() -> None:
    events = _history()
    assert [(e.type, e.condition, e.crossing) for e in events if e.project == "vision"] == [
        ("BurnWarningRaised", EARLY_EXHAUSTION, 1),
        ("BurnWarningCleared", EARLY_EXHAUSTION, 1),
        ("BurnWarningRaised", SHARE_80, 1),
        ("BurnWarningCleared", SHARE_80, 1),
        ("BurnWarningRaised", EARLY_EXHAUSTION, 2),
        ("BurnWarningRaised", SHARE_80, 2),
        ("BurnWarningRaised", SHARE_100, 1),
    ]
    expected = {
        (p, "2027-Q1", c): n
        for p in ("vision", "nlp")
        for c, n in ((EARLY_EXHAUSTION, 2), (SHARE_80, 2), (SHARE_100, 1))
    }
    assert fold(events).active == expected
    # what was read off the topic: the same after encoding, with duplicates, in any order
    decoded = [parse_alert_event(encode_alert_event(e)) for e in events]
    assert decoded == events
    rng = random.Random(7)
    for _ in range(20):
        shuffled = decoded + rng.sample(decoded, 5)
        rng.shuffle(shuffled)
        assert fold(shuffled).active == expected
    # and the rebuilt state emits nothing for the same burn
    last = burn_of(charged_h=8_900, held_h=1_200, rate_h=300, as_of=FEB_1 + 4 * DAY)
    assert evaluate([project(last)], THRESHOLDS, fold(decoded), NOW) == []


def test_a_retried_publication_folds_once() -> None:
    state = BurnAlertState()
    [event] = round_of(state, project(FAST))
    assert not state.apply(event)
    assert state.active == {("vision", "2027-Q1", EARLY_EXHAUSTION): 1}


def test_thresholds_from_the_settings() -> None:
    t = Thresholds.parse(7, " 1.0, 0.8 ,0.80,")
    assert t.budget_shares == (Fraction(4, 5), Fraction(1))
    assert t.conditions() == (EARLY_EXHAUSTION, SHARE_80, SHARE_100)
    assert Thresholds.parse(3, "").conditions() == (EARLY_EXHAUSTION,)
    assert [share_label(Fraction(s)) for s in ("0.95", "1", "1.25", "0.05")] == [
        "0.95",
        "1.0",
        "1.25",
        "0.05",
    ]
    for bad in ("0.8;1.0", "eighty", "0", "-0.5", "1/3"):
        with pytest.raises(ValueError):
            Thresholds.parse(7, bad)


def test_the_contract_refuses_floats_and_unknown_conditions() -> None:
    [event] = evaluate([project(FAST)], THRESHOLDS, BurnAlertState(), NOW)
    raw = event.model_dump(mode="json")
    for change in ({"allocated_units": 1.5}, {"condition": "budget-share:lots"}, {"crossing": 0}):
        with pytest.raises(ContractError):
            parse_alert_event(orjson.dumps({**raw, **change}))


def test_a_reminder_comes_once_when_the_period_ends_within_its_days_and_an_extension_ends_it() -> None:
    reminders = Thresholds(days_early=7, budget_shares=(), expiry_days=(14, 3))
    state = BurnAlertState()
    far = burn_of(as_of=Q1_END - 20 * DAY, charged_h=1_000, rate_h=10)
    assert round_of(state, project(far), thresholds=reminders) == []
    near = burn_of(as_of=Q1_END - 13 * DAY - 3600, charged_h=1_000, rate_h=10)
    [raised] = round_of(state, project(near), thresholds=reminders)
    assert kinds([raised]) == [("BurnWarningRaised", "expires-in:14d", 1)]
    assert raised.message.startswith("Project vision's 2027-Q1 allocations end on 2027-04-01, in 14 days: ")
    assert round_of(state, project(near), thresholds=reminders) == []  # once per crossing
    last = burn_of(as_of=Q1_END - 2 * DAY, charged_h=1_000, rate_h=10)
    assert kinds(round_of(state, project(last), thresholds=reminders)) == [
        ("BurnWarningRaised", "expires-in:3d", 1)
    ]
    # another project's extension (the period's end moves on) does not end vision's reminders
    wider = burn_of(as_of=Q1_END - 2 * DAY, end=Q1_END + 30 * DAY, charged_h=1_000, rate_h=10)
    own_end = ProjectBurn("vision", "2027-Q1", wider, 0, (), Q1_END)
    assert round_of(state, own_end, thresholds=reminders) == []
    # vision's own allocations extended by a month: both reminders end
    extended = ProjectBurn("vision", "2027-Q1", wider, 0, (), Q1_END + 30 * DAY)
    assert sorted(kinds(round_of(state, extended, thresholds=reminders))) == [
        ("BurnWarningCleared", "expires-in:14d", 1),
        ("BurnWarningCleared", "expires-in:3d", 1),
    ]
    # the period over: nothing more to remind of
    assert not any(e.type == "BurnWarningRaised" for e in evaluate(
        [project(burn_of(as_of=Q1_END, charged_h=1_000))], reminders, BurnAlertState(), NOW
    ))  # fmt: skip


def test_expiry_reminders_from_the_settings() -> None:
    t = Thresholds.parse(7, "0.5", " 3, 14,14")
    assert t.conditions() == (EARLY_EXHAUSTION, "budget-share:0.5", "expires-in:14d", "expires-in:3d")
    for bad in ("two weeks", "0", "10000"):
        with pytest.raises(ValueError):
            Thresholds.parse(7, "", bad)
