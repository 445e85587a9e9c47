"""Squatting: jobs that keep GPUs while barely using them (idle placeholders held for debugging).

A job is squatting when its GPU utilisation stays under a threshold for longer than a grace
period. Utilisation comes from usage samples, in basis points (10,000 = fully busy), and is
recorded on every ledger piece; a piece without a reading counts as busy (nobody is flagged
without evidence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

FULL_BP = 10_000  # utilisation 1.0 in basis points
IDLE_UNITS_PER_GPU_SECOND = FULL_BP  # idle units = GPU-seconds x (10,000 - utilisation in bp)


@dataclass(frozen=True, slots=True)
class SquatRule:
    max_utilization_bp: int = 500  # under 5 %: idle
    grace_s: int = 1800  # for longer than 30 minutes

    @classmethod
    def of(cls, max_utilization: float, grace_s: int) -> SquatRule:
        return cls(round(max_utilization * FULL_BP), grace_s)

    def idle(self, utilization_bp: int) -> bool:
        """A reading (or a piece) this low counts towards squatting."""
        return utilization_bp < self.max_utilization_bp


class UsagePiece(NamedTuple):
    """A piece of a job's GPU time as the ledger holds it (current revision). A named tuple: a
    page builds thousands of them per request."""

    start: int
    end: int
    gpus: int
    utilization_bp: int
    charge_units: int


@dataclass(frozen=True, slots=True)
class Squatting:
    job_id: str
    idle_since: int  # start of the first low-utilisation stretch longer than the grace period
    idle_until: int  # end of the latest such stretch
    idle_seconds: int  # wall seconds in stretches longer than the grace period
    idle_gpu_seconds: int  # GPU-seconds in those stretches
    idle_charge_units: int  # what those stretches were charged
    gpu_seconds: int  # the job's GPU-seconds so far
    charge_units: int  # the job's charge so far
    ongoing: bool  # the job's latest piece is inside such a stretch
    # The start of the latest such stretch: what tells one idle stretch from the next (alerts).
    latest_since: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class JobTotals:
    """A job's GPU-seconds and charge so far, and the end of its latest piece."""

    gpu_seconds: int
    charge_units: int
    last_end: int


def find_squatting(
    job_id: str, pieces: Sequence[UsagePiece], rule: SquatRule, totals: JobTotals | None = None
) -> Squatting | None:
    """The job's squatting, or None. Pieces in any order; a stretch is a run of consecutive
    pieces (each starting where the previous ended) all under the threshold; a gap or a busy
    piece ends it. Flagged when a stretch lasts longer than `rule.grace_s` (strictly): each
    stretch is judged alone, so a dip that recovers inside the grace period is never flagged.

    `pieces` may be the job's low pieces alone (any subset holding every piece under the
    threshold: a missing piece breaks a stretch as a busy one does), with the job's `totals`
    given; without them, the totals are the pieces'.
    """
    valid = sorted((p for p in pieces if p.gpus > 0 and p.end > p.start), key=lambda p: (p.start, p.end))
    if not valid:
        return None
    if totals is None:
        totals = JobTotals(
            sum(p.gpus * (p.end - p.start) for p in valid), sum(p.charge_units for p in valid), valid[-1].end
        )
    stretches: list[list[UsagePiece]] = []
    current: list[UsagePiece] = []
    for piece in valid:
        idle = rule.idle(piece.utilization_bp)
        if idle and current and current[-1].end == piece.start:
            current.append(piece)
            continue
        if current:
            stretches.append(current)
        current = [piece] if idle else []
    if current:
        stretches.append(current)
    qualifying = [s for s in stretches if s[-1].end - s[0].start > rule.grace_s]
    if not qualifying:
        return None
    flagged = [p for s in qualifying for p in s]
    return Squatting(
        job_id=job_id,
        idle_since=qualifying[0][0].start,
        idle_until=qualifying[-1][-1].end,
        idle_seconds=sum(s[-1].end - s[0].start for s in qualifying),
        idle_gpu_seconds=sum(p.gpus * (p.end - p.start) for p in flagged),
        idle_charge_units=sum(p.charge_units for p in flagged),
        gpu_seconds=totals.gpu_seconds,
        charge_units=totals.charge_units,
        # Pieces never overlap: the stretch holds the latest piece when it ends where the job does.
        ongoing=qualifying[-1][-1].end >= totals.last_end,
        latest_since=qualifying[-1][0].start,
    )


def idle_since(run_start: int, last_busy_reading: int, last_low_reading: int, rule: SquatRule) -> int | None:
    """Where a running job's current idle stretch began, if it is squatting now; else None.

    The same rule as `find_squatting`, on what a follower of the job's readings can keep order-free
    (two maxima): a reading closes the span before it, so the latest idle stretch runs from the
    run's start or the latest busy reading, whichever is later, to the latest idle reading, and
    is squatting once that is longer than the grace period (strictly). Readings of an earlier run
    are all before `run_start`, so they never count.
    """
    begin = max(run_start, last_busy_reading)
    return begin if last_low_reading - begin > rule.grace_s else None
