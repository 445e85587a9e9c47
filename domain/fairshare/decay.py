"""Decay of usage with a half-life, as Slurm's PriorityDecayHalfLife.

Usage decays by 2^(-dt/half_life), computed as whole half-lives (an exact power of two) times
2^(-rest/half_life), so it halves exactly at every half-life and the same inputs give the same
bits. Reset instants (Slurm's PriorityUsageResetPeriod) are applied where the hours are decayed,
`usage.decayed_usage`: it drops the hours before the last reset.
"""

from __future__ import annotations

import math
from typing import Final

DEFAULT_HALF_LIFE: Final = 7 * 86_400  # Slurm's PriorityDecayHalfLife default


def decay_factor(elapsed: int, half_life: int) -> float:
    """2^(-elapsed / half_life); 1.0 for half_life 0 (no decay).

    Whole half-lives are applied with ldexp, an exact power of two, so usage halves exactly at
    every half-life instead of drifting by a rounding of exp2 over a long interval.
    """
    if half_life == 0 or elapsed == 0:
        return 1.0
    whole, rest = divmod(elapsed, half_life)
    return math.ldexp(math.exp2(-rest / half_life), -whole)
