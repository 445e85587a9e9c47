"""Squatting: a job flagged when its utilisation stays under the threshold for longer than the grace.

Pieces are hand-made in minutes from the job's start; the default rule is under 5 % for over 30 min.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.squatting import FULL_BP, JobTotals, SquatRule, Squatting, UsagePiece, find_squatting

MIN = 60
T0 = 1_800_000_000
RULE = SquatRule()  # under 500 bp for longer than 1800 s
IDLE, BUSY = 100, 9000  # basis points
PROPERTY = settings(max_examples=300, deadline=None, database=None)


def piece(start_min: int, end_min: int, utilization_bp: int, gpus: int = 1) -> UsagePiece:
    """A piece charged 3 units per GPU-second (any rate would do: the charge is summed, not derived)."""
    start, end = T0 + start_min * MIN, T0 + end_min * MIN
    return UsagePiece(start, end, gpus, utilization_bp, charge_units=3 * gpus * (end - start))


def at(minute: int) -> int:
    return T0 + minute * MIN


def test_the_default_rule_is_under_five_percent_for_over_thirty_minutes() -> None:
    assert RULE == SquatRule(500, 1800) == SquatRule.of(0.05, 1800)


@pytest.mark.parametrize(
    "pieces",
    [
        [],
        [piece(0, 30, IDLE)],
        [piece(0, 60, BUSY), piece(60, 80, IDLE), piece(80, 140, BUSY)],
        [piece(0, 60, 500)],
        [piece(0, 60, FULL_BP)],
        [piece(0, 20, IDLE), piece(21, 41, IDLE)],
        [piece(0, 20, IDLE), piece(20, 30, BUSY), piece(30, 50, IDLE)],
        [
            piece(0, 25, IDLE),
            piece(25, 40, BUSY),
            piece(40, 65, IDLE),
            piece(65, 70, BUSY),
            piece(70, 99, IDLE),
        ],
        [piece(0, 60, IDLE, gpus=0), piece(60, 60, IDLE), piece(70, 60, IDLE)],
    ],
    ids=[
        "a job without pieces is not squatting",
        "idle for exactly the grace period is not flagged",
        "a dip under the threshold that recovers inside the grace period is not flagged",
        "utilisation exactly at the threshold is not idle",
        "a fully busy job is not flagged",
        "a gap between runs breaks the stretch",
        "a busy piece between idle ones breaks the stretch",
        "each stretch is judged alone: short dips never add up",
        "pieces without GPUs or without time are ignored",
    ],
)
def test_not_squatting(pieces: list[UsagePiece]) -> None:
    assert find_squatting("job", pieces, RULE) is None


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (
            [piece(0, 31, IDLE)],
            Squatting("job", at(0), at(31), 31 * MIN, 31 * MIN, 3 * 31 * MIN, 31 * MIN, 3 * 31 * MIN, True),
        ),
        (
            [piece(0, 60, 499)],
            Squatting("job", at(0), at(60), 60 * MIN, 60 * MIN, 3 * 60 * MIN, 60 * MIN, 3 * 60 * MIN, True),
        ),
        (
            [piece(0, 20, IDLE, gpus=2), piece(20, 40, 0, gpus=2)],
            Squatting(
                "job", at(0), at(40), 40 * MIN, 2 * 40 * MIN, 6 * 40 * MIN, 2 * 40 * MIN, 6 * 40 * MIN, True
            ),
        ),
        (
            # Busy first, idle for 40 min, busy again: the job is no longer squatting, but it did.
            [piece(0, 10, BUSY, gpus=4), piece(10, 50, IDLE, gpus=4), piece(50, 60, BUSY, gpus=4)],
            Squatting(
                "job",
                at(10),
                at(50),
                40 * MIN,
                4 * 40 * MIN,
                12 * 40 * MIN,
                4 * 60 * MIN,
                12 * 60 * MIN,
                False,
            ),
        ),
        (
            # Two qualifying stretches are summed; idle_since/until span both, the busy hour between
            # is in the costs so far but not in the idle figures.
            [
                piece(0, 40, IDLE, 2),
                piece(40, 100, BUSY, 2),
                piece(100, 135, IDLE, 2),
                piece(135, 170, IDLE, 1),
            ],
            Squatting(
                "job",
                at(0),
                at(170),
                110 * MIN,
                (2 * 40 + 2 * 35 + 35) * MIN,
                3 * (80 + 70 + 35) * MIN,
                (80 + 120 + 70 + 35) * MIN,
                3 * (80 + 120 + 70 + 35) * MIN,
                True,
            ),
        ),
        (
            # A short dip before the long stretch is not part of it.
            [piece(0, 10, IDLE), piece(10, 20, BUSY), piece(20, 60, IDLE), piece(60, 61, BUSY)],
            Squatting("job", at(20), at(60), 40 * MIN, 40 * MIN, 3 * 40 * MIN, 61 * MIN, 3 * 61 * MIN, False),
        ),
        (
            # The latest piece is idle but in a short stretch of its own: not ongoing.
            [piece(0, 40, IDLE), piece(40, 50, BUSY), piece(50, 55, IDLE)],
            Squatting("job", at(0), at(40), 40 * MIN, 40 * MIN, 3 * 40 * MIN, 55 * MIN, 3 * 55 * MIN, False),
        ),
        (
            # A zero-GPU piece after the stretch is ignored: the job's latest real piece is idle.
            [piece(0, 40, IDLE), piece(40, 50, BUSY, gpus=0)],
            Squatting("job", at(0), at(40), 40 * MIN, 40 * MIN, 3 * 40 * MIN, 40 * MIN, 3 * 40 * MIN, True),
        ),
    ],
    ids=[
        "idle for 31 minutes is flagged",
        "just under the threshold is idle",
        "consecutive idle pieces make one stretch, GPU-seconds count every GPU",
        "a stretch that ended is flagged but not ongoing; the costs so far include busy pieces",
        "two qualifying stretches are summed",
        "a stretch too short to qualify is not counted with a later one",
        "ongoing is false when the latest piece is not in a qualifying stretch",
        "pieces without GPUs do not count for ongoing or for the costs",
    ],
)
def test_squatting(pieces: list[UsagePiece], expected: Squatting) -> None:
    assert find_squatting("job", pieces, RULE) == expected


def test_pieces_out_of_order_are_sorted_first() -> None:
    pieces = [piece(40, 60, BUSY), piece(20, 40, IDLE), piece(0, 20, IDLE)]
    found = find_squatting("job", pieces, RULE)
    assert found == find_squatting("job", sorted(pieces, key=lambda p: p.start), RULE)
    assert found is not None
    assert (found.idle_since, found.idle_until, found.ongoing) == (at(0), at(40), False)


def test_the_rule_decides_the_threshold_and_the_grace() -> None:
    pieces = [piece(0, 20, 1500)]
    assert find_squatting("job", pieces, RULE) is None
    assert find_squatting("job", pieces, SquatRule(max_utilization_bp=2000, grace_s=10 * MIN)) is not None
    assert find_squatting("job", pieces, SquatRule(max_utilization_bp=2000, grace_s=20 * MIN)) is None


# -- properties ---------------------------------------------------------------------------------

runs = st.lists(
    st.tuples(
        st.integers(0, 30), st.integers(1, 40), st.sampled_from([0, 499, 500, 9000]), st.integers(0, 4)
    ),
    max_size=12,
)


def job(spec: list[tuple[int, int, int, int]]) -> list[UsagePiece]:
    """Pieces one after another, each `gap` minutes after the previous one ends."""
    pieces, t = [], 0
    for gap, length, utilization, gpus in spec:
        pieces.append(piece(t + gap, t + gap + length, utilization, gpus))
        t += gap + length
    return pieces


@PROPERTY
@given(runs, st.randoms(use_true_random=False))
def test_properties_of_any_job(spec: list[tuple[int, int, int, int]], rng: random.Random) -> None:
    pieces = job(spec)
    found = find_squatting("job", pieces, RULE)
    shuffled = list(pieces)
    rng.shuffle(shuffled)
    assert find_squatting("job", shuffled, RULE) == found
    if found is None:
        return
    assert RULE.grace_s < found.idle_seconds <= found.idle_until - found.idle_since
    assert 0 < found.idle_gpu_seconds <= found.gpu_seconds
    assert 0 < found.idle_charge_units <= found.charge_units
    assert found.gpu_seconds == sum(p.gpus * (p.end - p.start) for p in pieces)


@PROPERTY
@given(runs, st.sampled_from([2_500, 1_000, 501]))
def test_the_low_pieces_and_the_jobs_totals_give_what_every_piece_gives(
    spec: list[tuple[int, int, int, int]], cap: int
) -> None:
    """What the dashboards read (the pieces under a cap at or over the threshold, and the job's
    totals) decides exactly as the whole job does: a piece left out breaks a stretch as a busy
    piece would."""
    pieces = job(spec)
    valid = [p for p in pieces if p.gpus > 0 and p.end > p.start]
    totals = JobTotals(
        sum(p.gpus * (p.end - p.start) for p in valid),
        sum(p.charge_units for p in valid),
        max((p.end for p in valid), default=0),
    )
    low = [p for p in pieces if p.utilization_bp < cap]
    assert find_squatting("job", low, RULE, totals) == find_squatting("job", pieces, RULE)


def test_a_stretch_is_ongoing_only_up_to_the_jobs_last_piece() -> None:
    idle = [piece(0, 60, IDLE)]
    assert find_squatting("job", idle, RULE).ongoing  # type: ignore[union-attr]
    later = JobTotals(gpu_seconds=2 * 3600, charge_units=6 * 3600, last_end=at(120))
    found = find_squatting("job", idle, RULE, later)
    assert found is not None and not found.ongoing
    assert (found.gpu_seconds, found.charge_units) == (2 * 3600, 6 * 3600)
