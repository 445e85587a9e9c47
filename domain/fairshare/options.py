"""The choices a fair-share computation takes: the algorithm, and Fair Tree's rule for 0 shares."""

from __future__ import annotations

from enum import StrEnum


class Algorithm(StrEnum):
    CLASSIC = "classic"
    FAIR_TREE = "fair_tree"


class ZeroShares(StrEnum):
    """How Fair Tree ranks a leaf without effective shares (its own or an ancestor's are 0).

    RANKED is Slurm's rule and the default: LF 0 sorts the node after its siblings with shares,
    and it is ranked like any other leaf. UNRANKED is the former rule of this package: factor 0
    and no rank number, so the leaves Slurm ranks after it each move up one rank. Classic ignores it.
    """

    RANKED = "ranked"
    UNRANKED = "unranked"
