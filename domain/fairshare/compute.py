"""Either algorithm by name: what the fair-share calculator calls."""

from __future__ import annotations

from collections.abc import Mapping

from allmende.domain.fairshare.classic import classic_fairshare
from allmende.domain.fairshare.fair_tree import fair_tree_fairshare
from allmende.domain.fairshare.options import Algorithm, ZeroShares
from allmende.domain.fairshare.result import FairShareResult
from allmende.domain.fairshare.tree import ShareTree


def compute_fairshare(
    tree: ShareTree,
    leaf_usage: Mapping[str, float],
    algorithm: Algorithm = Algorithm.FAIR_TREE,
    *,
    zero_shares: ZeroShares = ZeroShares.RANKED,
) -> FairShareResult:
    """Either algorithm by name: Fair Tree is Slurm's default since 19.05."""
    if Algorithm(algorithm) is Algorithm.CLASSIC:
        return classic_fairshare(tree, leaf_usage)
    return fair_tree_fairshare(tree, leaf_usage, zero_shares=zero_shares)
