"""Leaf usage as exact integer sums up the tree, which both algorithms divide into ratios.

Usage is held as integers in units of 2^-FRACTION_BITS GPU-seconds, so a node's usage is, bit for
bit, the sum of its leaves' usage whatever the order they are added in; ratios are correctly
rounded int/int divisions. Amounts below 2^-64 GPU-seconds count as nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from allmende.domain.fairshare.tree import ShareTree

FRACTION_BITS: Final = 64
MAX_AMOUNT: Final = 2.0**80  # GPU-seconds; far beyond any cluster, small enough to stay exact

_UNIT = 1 << FRACTION_BITS


class UsageInvalid(ValueError):
    """Usage that cannot be counted (negative or not finite, on an account or an unknown node)."""


def _check_amount(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_AMOUNT:
        raise UsageInvalid(f"{name} is a number of GPU-seconds from 0 to {MAX_AMOUNT:g}, got {value!r}")
    return float(value)


def _units(amount: float) -> int:
    """GPU-seconds as an integer count of 2^-64 GPU-seconds (truncated; exact above 2^-11)."""
    return int(math.ldexp(amount, FRACTION_BITS))


def _leaf_at(tree: ShareTree, node_id: str) -> int:
    i = tree._index.get(node_id)
    if i is None:
        raise UsageInvalid(f"no node {node_id!r} in the tree")
    if not tree._leaf[i]:
        raise UsageInvalid(f"{node_id!r} has children; usage is charged to leaves")
    return i


def leaf_units(tree: ShareTree, leaf_usage: Mapping[str, float]) -> list[int]:
    """Every node's usage in units: the leaves' given, the others' summed below them."""
    units = [0] * len(tree)
    index, leaf = tree._index, tree._leaf
    for node_id, amount in leaf_usage.items():
        i = index.get(node_id, 0)
        if not leaf[i]:  # unknown (0 is the root) or an account: let _leaf_at say which
            i = _leaf_at(tree, node_id)
        if type(amount) is not float or not 0.0 <= amount <= MAX_AMOUNT:  # the common case, fast
            amount = _check_amount(f"usage of {node_id!r}", amount)
        units[i] = _units(amount)
    parent = tree._parent
    for i in range(len(units) - 1, 0, -1):
        units[parent[i]] += units[i]
    return units


def units_to_seconds(units: int) -> float:
    return units / _UNIT


def normalised(units: Sequence[int]) -> list[float]:
    """Every node's usage as a fraction of the root's (all 0 when nothing was used)."""
    total = units[0]
    return [u / total for u in units] if total else [0.0] * len(units)


def aggregate_usage(tree: ShareTree, leaf_usage: Mapping[str, float]) -> dict[str, float]:
    """Every node's usage: a leaf's as given (0 if absent), an account's the exact sum below it."""
    units = leaf_units(tree, leaf_usage)
    return {node_id: units_to_seconds(u) for node_id, u in zip(tree._ids, units, strict=True)}
