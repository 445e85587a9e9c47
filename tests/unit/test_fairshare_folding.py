"""Folding fair-share hours past the horizon: exact integers, bounded memory, replay-identical bits."""

from __future__ import annotations

import random

import pytest

from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND, PolicyTimeline, flat_policy
from allmende.domain.fairshare.usage import BUCKET_S, FOLD_HALF_LIVES, UsageLedger, decayed_usage
from allmende.schemas.ledger import LedgerEntry, new_entry

FLAT = PolicyTimeline([flat_policy()])
HOUR = BUCKET_S
UNIT = CHARGE_UNITS_PER_GPU_SECOND
START = 1_700_000_000 // HOUR * HOUR  # on the hour: entries of whole hours fill one hour each
HL = 2 * HOUR  # small half-life and horizon, so a test crosses them many times
K = 3  # fold after 3 half-lives: a 6-hour horizon
NEVER = 10**9  # fold_half_lives that folds nothing: the plain per-hour decay


def entry(
    entry_id: str, start: int, end: int, gpus: int, version: int = 1, project: str = "olmo"
) -> LedgerEntry:
    return new_entry(
        entry_id=entry_id, job_id=f"job-{entry_id}", version=version, interval_start=start,
        interval_end=end, gpus=gpus, project=project, user="alice", cluster="c1", gpu_type="A100",
        priority_class="standard", interactive=False, source_event_id=f"{entry_id}-{version}",
        pred_event_id="", utilization_bp=10_000,
    )  # fmt: skip


def ledger_of(entries: list[LedgerEntry]) -> UsageLedger:
    ledger = UsageLedger()
    for e in entries:
        ledger.apply(e, FLAT)
    return ledger


def assert_exact(folded: UsageLedger, plain: UsageLedger) -> None:
    """Same slots and jobs; each project's hours and figures still sum to its charge units."""
    assert folded.hours == plain.hours and folded.jobs == plain.jobs and folded.clock == plain.clock
    hours = folded.project_hours()
    assert {p: sum(h.values()) for p, h in hours.items()} == {p: plain.charge_units(p) for p in plain.hours}


def test_a_late_revision_of_a_folded_hour_is_subtracted_and_added_exactly() -> None:
    old = entry("e1", START, START + 3 * HOUR + 600, 4)
    later = entry("e2", START + 30 * HOUR, START + 30 * HOUR + 1800, 2, project="pythia")
    folded = ledger_of([old, later])
    assert folded.fold(HL, half_lives=K) == 4  # e1's four hours are far past the horizon
    assert folded.fold(HL, half_lives=K) == 0  # nothing more until the clock moves an hour
    assert len(folded.project_hours()["olmo"]) == 1  # one figure

    revised = entry("e1", START + 1200, START + 5 * HOUR, 8, version=2)  # longer and wider, late
    assert folded.apply(revised, FLAT)
    plain = ledger_of([old, later, revised])
    assert_exact(folded, plain)
    assert plain.charge_units("olmo") == 8 * (5 * HOUR - 1200) * UNIT

    at = folded.clock
    folded_usage = decayed_usage(folded.project_hours(), at, HL, fold_half_lives=K)
    # Identical bits to the ledger that never folded: both lump the same integers at the horizon.
    assert folded_usage == decayed_usage(plain.project_hours(), at, HL, fold_half_lives=K)
    # Against the plain per-hour decay, too high by less than 2^-K of the folded units.
    exact = decayed_usage(plain.project_hours(), at, HL, fold_half_lives=NEVER)
    bound = 2.0**-K * plain.charge_units("olmo") / UNIT
    assert exact["olmo"] <= folded_usage["olmo"] <= exact["olmo"] + bound
    assert folded_usage["pythia"] == exact["pythia"]  # nothing of it folded: the same bits


def test_a_revision_that_takes_back_all_folded_use_leaves_no_project() -> None:
    old = entry("e1", START, START + 2 * HOUR, 4)
    folded = ledger_of([old, entry("e2", START + 40 * HOUR, START + 41 * HOUR, 1, project="pythia")])
    folded.fold(HL, half_lives=K)
    folded.apply(entry("e1", START, START, 4, version=2), FLAT)  # the span turned out empty
    assert "olmo" not in folded.project_hours()  # as in a ledger that never saw it: no 0-usage leaf
    assert set(decayed_usage(folded.project_hours(), folded.clock, HL, fold_half_lives=K)) == {"pythia"}


def test_hours_before_a_reset_are_dropped_and_revisions_of_them_stay_exact() -> None:
    reset = START + 10 * HOUR + 1800  # not on the hour: hour 10 ends after it and stays
    entries = [entry("e1", START, START + 12 * HOUR, 2), entry("e2", START + 11 * HOUR, START + 13 * HOUR, 1)]
    folded = ledger_of(entries)
    half_life = 1000 * HOUR  # the horizon is far: only the reset folds
    assert folded.fold(half_life, [reset], half_lives=K) == 10  # hours 0..9 end before the reset
    revised = entry("e1", START + 600, START + 14 * HOUR, 3, version=2)
    folded.apply(revised, FLAT)
    plain = ledger_of([*entries, revised])
    assert_exact(folded, plain)
    at = folded.clock
    for resets in ([reset], [reset, START - HOUR], [reset, at + HOUR]):  # marks after `at` wait
        assert decayed_usage(folded.project_hours(), at, half_life, resets, K) == decayed_usage(
            plain.project_hours(), at, half_life, resets, K
        )


def test_no_decay_folds_nothing_but_what_a_reset_drops() -> None:
    folded = ledger_of([entry(f"e{h}", START + h * HOUR, START + (h + 1) * HOUR, 1) for h in range(50)])
    assert folded.fold(0, half_lives=K) == 0  # half-life 0: nothing ever becomes negligible
    assert folded.fold(0, [START + 20 * HOUR], half_lives=K) == 20
    assert len(folded.project_hours()["olmo"]) == 30 + 1  # the live hours and the dropped figure
    usage = decayed_usage(folded.project_hours(), folded.clock, 0, [START + 20 * HOUR])
    assert usage == {"olmo": 30.0 * HOUR}


@pytest.mark.parametrize(
    ("half_life", "half_lives", "resets"), [(HL, K, False), (86_400, 10, False), (0, K, True)]
)
def test_years_of_hourly_use_keep_the_horizon(half_life: int, half_lives: int, resets: bool) -> None:
    years = 2
    horizon_hours = -(-half_lives * half_life // HOUR)
    ledger = UsageLedger()
    most = 0
    for h in range(years * 365 * 24):
        ledger.apply(entry(f"a{h}", START + h * HOUR, START + (h + 1) * HOUR, 1 + h % 7), FLAT)
        if h % 3 == 0:
            ledger.apply(entry(f"b{h}", START + h * HOUR, START + h * HOUR + 1800, 2, project="pythia"), FLAT)
        if h % 5 == 0:  # any cadence: folding depends on the clock, not on when it is called
            marks = [START + h // 2000 * 2000 * HOUR] if resets else []  # a reset every 2000 hours
            ledger.fold(half_life, marks, half_lives)
            hours = ledger.project_hours()
            most = max(most, *(len(per_hour) for per_hour in hours.values()))
            limit = (h % 2000 + 2) if resets else horizon_hours + 1
            assert all(len(per_hour) <= limit for per_hour in hours.values())
    if not resets:
        assert most == horizon_hours + 1  # the live hours and one figure, reached and never passed
    charged = sum(1 + h % 7 for h in range(years * 365 * 24)) * HOUR * UNIT
    assert ledger.charge_units("olmo") == charged  # budgets' slots are never folded
    assert len(ledger.hours["olmo"]) == years * 365 * 24


def _revisions(rng: random.Random, count: int, span_hours: int) -> list[LedgerEntry]:
    """Entries over `span_hours`, each with a few revisions changing its start, width and project
    (an entry's end is the boundary that closes it: fixed, as the meter's)."""
    out = []
    for i in range(count):
        end = START + rng.randrange(span_hours * HOUR)
        for version in range(1, rng.randint(2, 4)):
            begin = end - rng.randrange(0, 5 * HOUR)
            out.append(entry(f"e{i}", begin, end, rng.randint(0, 8), version, f"p{rng.randrange(3)}"))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_folding_while_live_and_once_in_a_replay_give_the_same_bits(seed: int) -> None:
    rng = random.Random(seed)
    revisions = _revisions(rng, 150, 24 * 40)
    # Live: revisions arrive roughly in time (late ones included); fold after every few.
    live_order = sorted(revisions, key=lambda e: e.interval_end + rng.randrange(-20 * HOUR, 20 * HOUR))
    with_resets = seed % 2 == 1
    live = UsageLedger()

    def marks(clock: int) -> list[int]:
        return [START + (clock - START) // (300 * HOUR) * 300 * HOUR] if with_resets else []

    for i, e in enumerate(live_order):
        live.apply(e, FLAT)
        if i % rng.randint(1, 10) == 0:
            live.fold(HL, marks(live.clock), K)
    replay_order = list(revisions)
    rng.shuffle(replay_order)
    replay = ledger_of(replay_order)
    plain = ledger_of(replay_order)  # never folds
    replay.fold(HL, marks(replay.clock), K)
    live.fold(HL, marks(live.clock), K)
    assert_exact(live, plain)
    assert_exact(replay, plain)
    at, resets = plain.clock, marks(plain.clock)
    expected = decayed_usage(plain.project_hours(), at, HL, resets, K)
    assert decayed_usage(live.project_hours(), at, HL, resets, K) == expected
    assert decayed_usage(replay.project_hours(), at, HL, resets, K) == expected
    exact = decayed_usage(plain.project_hours(), at, HL, resets, NEVER)
    for project, usage in exact.items():
        assert usage <= expected[project] <= usage + 2.0**-K * plain.charge_units(project) / UNIT


def test_the_default_horizon_changes_nothing_within_it_and_next_to_nothing_past_it() -> None:
    hours = {"olmo": {START // HOUR + h: 10 * HOUR * UNIT for h in range(24)}}
    at = START + (FOLD_HALF_LIVES - 1) * 86_400
    assert decayed_usage(hours, at, 86_400) == decayed_usage(hours, at, 86_400, fold_half_lives=NEVER)
    later = at + 10 * 86_400  # every hour past the horizon: lumped, too high by < 2^-40 of them
    lumped, exact = (
        decayed_usage(hours, later, 86_400),
        decayed_usage(hours, later, 86_400, fold_half_lives=NEVER),
    )
    assert exact["olmo"] < lumped["olmo"] <= exact["olmo"] + 2.0**-FOLD_HALF_LIVES * 24 * 10 * HOUR
