"""Slurm's Fair Tree fair share (fair_tree.html, fair_tree.c).

Among siblings, LF = S/U with S = raw / siblings' raw and U = usage / parent's usage (infinite when
U is 0, 0 when S is 0). Siblings are sorted by LF, highest first, and walked depth first; each leaf
met gets a rank counting down from the number of leaves, and its factor is rank / leaves, so the
top leaf gets 1.0. Slurm's tie rules hold: sibling leaves with equal LF share a rank; sibling
accounts with equal LF are merged (their children sorted together as one account); a leaf with the
same LF as a following sibling account shares its rank with that account's first leaf. Shares of 0
only make LF 0, as in Slurm (ZeroShares.RANKED, the default): such a node sorts after its siblings
with shares, but it is walked and ranked like any other, since Slurm ranks every user association;
the leaves below a 0-share account are sorted among themselves by their own LF, and every leaf gets
at least 1 / leaves, never 0. ZeroShares.UNRANKED keeps this package's former rule instead: a leaf
with no effective shares (its own or an ancestor's shares are 0) gets factor 0 and takes no rank
number, so every leaf that Slurm ranks after it moves up one rank. An account's Fair Tree factor,
which Slurm does not define, is the factor of the first leaf ranked inside it (inside its merged
group when it is tied), so tied accounts share it the way tied leaves share a rank. With UNRANKED,
an account tied with a sibling account gets the group's factor even when it has no ranked leaf of
its own (say its only leaf has 0 shares), and an account whose group has no ranked leaf gets 0.

Sibling lists are sorted by LF, highest first; on equal LF leaves come before accounts (Slurm's
rule, which its tie handling relies on), then lower node numbers, only so that the order is
reproducible. ShareTree keeps every fs child list in that base order (leaves, then accounts, each
by number), so a stable sort on LF alone gives the full order without building a key per node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import chain

from allmende.domain.fairshare.options import Algorithm, ZeroShares
from allmende.domain.fairshare.result import FairShareResult
from allmende.domain.fairshare.sums import leaf_units, normalised, units_to_seconds
from allmende.domain.fairshare.tree import PARENT_RAW, ShareTree

_NO_LEVEL = math.nan  # root and "parent" accounts have no level fair share; never compared


def _relevel(tree: ShareTree, units: Sequence[int], account: int, level_fs: list[float]) -> list[int]:
    """The LF of every fs child of `account`, stored in `level_fs`; returns them sorted.

    LF = S / U with S = raw / siblings' raw and U = usage / the parent's usage: infinite for no
    usage (and for "parent" leaves, as Slurm has it), 0 for no shares.
    """
    raw, ratio = tree._raw, tree._ratio
    parent_units = units[account]
    children = tree._fs_children[account]
    for child in children:
        share = ratio[child]
        if raw[child] == PARENT_RAW:
            level_fs[child] = math.inf
        elif share == 0:
            level_fs[child] = 0.0
        else:
            usage = units[child] / parent_units if parent_units else 0.0
            level_fs[child] = math.inf if usage == 0 else share / usage
    return sorted(children, key=level_fs.__getitem__, reverse=True)  # stable, also reversed


def _group(
    tree: ShareTree,
    level_fs: Sequence[float],
    ordered: Sequence[Sequence[int]],
    entries: Sequence[int],
    start: int,
    end: int,
) -> Sequence[int]:
    """The sorted children of the tied accounts entries[start:end], merged into one list."""
    if end - start == 1:
        return ordered[entries[start]]
    merged = sorted(
        chain.from_iterable(ordered[a] for a in entries[start:end]), key=tree._base_rank.__getitem__
    )
    merged.sort(key=level_fs.__getitem__, reverse=True)
    return merged


def _run_end(tree: ShareTree, level_fs: Sequence[float], entries: Sequence[int], start: int) -> int:
    """End of the run of accounts tied with entries[start] (an account): Slurm merges them."""
    level, end = level_fs[entries[start]], start + 1
    while end < len(entries) and not tree._leaf[entries[end]] and level_fs[entries[end]] == level:
        end += 1
    return end


def _rank_all(
    tree: ShareTree, level_fs: Sequence[float], ordered: Sequence[Sequence[int]], ranked: Sequence[int]
) -> list[float]:
    """Slurm's _calc_tree_fs over the whole tree: every node's factor. `ranked[leaf]` says whether
    a leaf takes a rank (always, as in Slurm, unless ZeroShares.UNRANKED leaves it out)."""
    factors = [0.0] * len(tree)
    leaves = tree._leaf_count
    is_leaf = tree._leaf
    rank = rnt = leaves
    pending = [0]  # accounts (and the root) waiting for the first leaf ranked inside them

    def visit(entries: Sequence[int], account_tied: bool) -> None:
        nonlocal rank, rnt
        i, size = 0, len(entries)
        previous = _NO_LEVEL  # equal to nothing, as Slurm's NO_VAL in practice
        while i < size:
            node = entries[i]
            level = level_fs[node]
            tied = account_tied if i == 0 else previous == level
            previous = level
            if is_leaf[node]:
                if ranked[node]:
                    if not tied:
                        rank = rnt
                    factor = rank / leaves
                    factors[node] = factor
                    rnt -= 1
                    if pending:
                        for account in pending:
                            factors[account] = factor
                        pending.clear()
                i += 1
            else:
                end = _run_end(tree, level_fs, entries, i)
                mark = len(pending)
                pending.extend(entries[i:end])
                visit(_group(tree, level_fs, ordered, entries, i, end), tied)
                del pending[mark:]  # accounts without a ranked leaf keep factor 0
                i = end

    if leaves:
        visit(ordered[0], False)
    for i in tree._parent_accounts:
        factors[i] = factors[tree._fs_parent[i]]
    return factors


def _fair_tree_levels(tree: ShareTree, units: Sequence[int]) -> tuple[list[float], list[Sequence[int]]]:
    """Every LF, and every account's fs children sorted by them (leaves: an empty tuple)."""
    level_fs = [_NO_LEVEL] * len(tree)  # the root and "parent" accounts keep NaN: never compared
    ordered: list[Sequence[int]] = [()] * len(tree)
    for account in tree._accounts:
        ordered[account] = _relevel(tree, units, account, level_fs)
    return level_fs, ordered


def fair_tree_fairshare(
    tree: ShareTree, leaf_usage: Mapping[str, float], *, zero_shares: ZeroShares = ZeroShares.RANKED
) -> FairShareResult:
    """Slurm's Fair Tree fair share for every node; `leaf_usage` maps leaf ids to GPU-seconds."""
    units = leaf_units(tree, leaf_usage)
    level_fs, ordered = _fair_tree_levels(tree, units)
    factors = _rank_all(tree, level_fs, ordered, tree._ranked_leaves[ZeroShares(zero_shares)])
    fs_parent = tree._fs_parent
    norm_usage = normalised(units)
    level_usage = norm_usage[:1] + [
        units[i] / units[fs_parent[i]] if units[fs_parent[i]] else 0.0 for i in range(1, len(units))
    ]
    return FairShareResult(
        algorithm=Algorithm.FAIR_TREE,
        tree=tree,
        norm_shares=tuple(tree._ratio),
        raw_usage=tuple(map(units_to_seconds, units)),
        norm_usage=tuple(norm_usage),
        effective_usage=tuple(level_usage),
        level_fs=tuple(None if math.isnan(level) else level for level in level_fs),
        factors=tuple(factors),
    )
