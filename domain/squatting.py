"""Squatting: jobs that keep GPUs while barely using them (idle placeholders held for debugging).

A job is squatting when its GPU utilisation stays under a threshold for longer than a grace
period. Utilisation comes from usage samples, in basis points (10,000 = fully busy), and is
recorded on every ledger piece; a piece without a reading counts as busy (nobody is flagged
without evidence). INTERFACE FIXED (other modules use these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FULL_BP = 10_000  # utilisation 1.0 in basis points
IDLE_UNITS_PER_GPU_SECOND = FULL_BP  # idle units = GPU-seconds x (10,000 - utilisation in bp)


@dataclass(frozen=True, slots=True)
class SquatRule:
    max_utilization_bp: int = 500  # under 5 %: idle
    grace_s: int = 1800  # for longer than 30 minutes

    @classmethod
    def of(cls, max_utilization: float, grace_s: int) -> SquatRule:
        return cls(round(max_utilization * FULL_BP), grace_s)


@dataclass(frozen=True, slots=True)
class UsagePiece:
    """A piece of a job's GPU time as the ledger holds it (current revision)."""

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


def find_squatting(job_id: str, pieces: Sequence[UsagePiece], rule: SquatRule) -> Squatting | None:
    """The job's squatting, or None. Pieces in any order; a stretch is a run of consecutive
    pieces (each starting where the previous ended) all under the threshold; a gap or a busy
    piece ends it. Flagged when a stretch lasts longer than `rule.grace_s` (strictly)."""
    raise NotImplementedError
