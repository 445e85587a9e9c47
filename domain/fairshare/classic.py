"""Slurm's classic fair share (classic_fair_share.html).

Normalised shares S are the product of share ratios down the tree; usage U is normalised by the
root's; effective usage is U for children of the root and `U + (U_E_parent - U) * raw /
siblings_raw` below them; the factor is 2^(-U_E/S), 0 when S is 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.result import FairShareResult
from allmende.domain.fairshare.sums import leaf_units, normalised, units_to_seconds
from allmende.domain.fairshare.tree import PARENT_RAW, ShareTree


def _effective_usage(tree: ShareTree, i: int, own: float, parent_effective: float) -> float:
    """Classic U_E of fs node i from its normalised usage and its fs parent's U_E."""
    p = tree._fs_parent[i]
    if p == 0:
        return own
    if tree._level_shares[p] == 0:  # nobody here has shares: Slurm takes the parent's
        return parent_effective
    return own + (parent_effective - own) * tree._ratio[i]


def _classic_factor(effective_usage: float, norm_shares: float) -> float:
    return 0.0 if norm_shares == 0 else math.exp2(-effective_usage / norm_shares)


def classic_fairshare(tree: ShareTree, leaf_usage: Mapping[str, float]) -> FairShareResult:
    """Slurm's classic fair share for every node; `leaf_usage` maps leaf ids to GPU-seconds."""
    units = leaf_units(tree, leaf_usage)
    norm_usage = normalised(units)
    effective = [norm_usage[0]] * len(units)
    fs_parent, raw = tree._fs_parent, tree._raw
    for i in range(1, len(units)):
        if raw[i] == PARENT_RAW:
            effective[i] = effective[fs_parent[i]]
        else:
            effective[i] = _effective_usage(tree, i, norm_usage[i], effective[fs_parent[i]])
    factors = tuple(map(_classic_factor, effective, tree._norm_shares))
    return FairShareResult(
        algorithm=Algorithm.CLASSIC,
        tree=tree,
        norm_shares=tuple(tree._norm_shares),
        raw_usage=tuple(map(units_to_seconds, units)),
        norm_usage=tuple(norm_usage),
        effective_usage=tuple(effective),
        level_fs=(None,) * len(units),
        factors=factors,
    )
