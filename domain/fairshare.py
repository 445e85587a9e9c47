"""Hierarchical fair share as Slurm computes it (classic and Fair Tree), over decayed GPU usage.

A fair-share factor says how far an association (a project, a user) is below or above its share of
the machine, so that a scheduler can favour the under-served. This module is the maths only: a
tree of shares, a number per leaf, and the factors. No I/O, so a live consumer, a replay and a test
all run the same code.

Tree. Every node has raw shares among its siblings: an integer >= 0, or "parent" (Slurm's
`Fairshare=parent`). A "parent" account is transparent: its children compete as if they hung
directly under its nearest ancestor with shares of its own (Slurm's fs_assoc_ptr). A "parent" leaf
takes its parent's place: classic reports the parent's normalised shares, effective usage and
factor for it; Fair Tree gives it an infinite level fair share, as Slurm does, so it ranks at the
top of its parent's block, and that is what Fair Tree reports as the parent's factor (below). A
"parent" node adds nothing to its siblings' share sum. Usage sits on leaves (nodes without
children); a node's usage is the sum of the usage below it.

Exact sums. Usage is held as integers in units of 2^-FRACTION_BITS GPU-seconds. Updating every sum
on the path to the root by the same integer delta then gives, bit for bit, what a recompute from
the leaves gives, in O(depth), whatever the order of the additions; ratios are correctly rounded
int/int divisions. Amounts below 2^-64 GPU-seconds count as nothing.

Classic (classic_fair_share.html): normalised shares S are the product of share ratios down the
tree; usage U is normalised by the root's; effective usage is U for children of the root and
`U + (U_E_parent - U) * raw / siblings_raw` below them; the factor is 2^(-U_E/S), 0 when S is 0.

Fair Tree (fair_tree.html, fair_tree.c): among siblings, LF = S/U with S = raw / siblings' raw and
U = usage / parent's usage (infinite when U is 0, 0 when S is 0). Siblings are sorted by LF,
highest first, and walked depth first; each leaf met gets a rank counting down from the number of
leaves, and its factor is rank / leaves, so the top leaf gets 1.0. Slurm's tie rules hold: sibling
leaves with equal LF share a rank; sibling accounts with equal LF are merged (their children sorted
together as one account); a leaf with the same LF as a following sibling account shares its rank
with that account's first leaf. Shares of 0 only make LF 0, as in Slurm (ZeroShares.RANKED, the
default): such a node sorts after its siblings with shares, but it is walked and ranked like any
other, since Slurm ranks every user association; the leaves below a 0-share account are sorted
among themselves by their own LF, and every leaf gets at least 1 / leaves, never 0.
ZeroShares.UNRANKED keeps this module's former rule instead: a leaf with no effective shares (its
own or an ancestor's shares are 0) gets factor 0 and takes no rank number, so every leaf that
Slurm ranks after it moves up one rank. An account's Fair Tree factor, which Slurm does not define,
is the factor of the first leaf ranked inside it (inside its merged group when it is tied), so
tied accounts share it the way tied leaves share a rank. With UNRANKED, an account tied with a
sibling account gets the group's factor even when it has no ranked leaf of its own (say its only
leaf has 0 shares), and an account whose group has no ranked leaf gets 0.

Decay. Usage decays by 2^(-dt/half_life), computed as whole half-lives (an exact power of two) times
2^(-rest/half_life), so it halves exactly at every half-life and the same events in the same order
give the same bits. Optional reset instants (Slurm's PriorityUsageResetPeriod) zero it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import chain
from typing import Final, Literal, TypeAlias

ROOT: Final = "root"
PARENT: Final = "parent"
DEFAULT_HALF_LIFE: Final = 7 * 86_400  # Slurm's PriorityDecayHalfLife default
FRACTION_BITS: Final = 64
MAX_AMOUNT: Final = 2.0**80  # GPU-seconds; far beyond any cluster, small enough to stay exact
MAX_SHARES: Final = 2**32 - 1  # Slurm stores raw shares in a uint32
REBASE_HALF_LIVES: Final = 256  # see FairShareState: keeps the scaled integers short

Shares: TypeAlias = int | Literal["parent"]

_PARENT_RAW = -1  # internal code for "parent" shares
_UNIT = 1 << FRACTION_BITS
_NO_LEVEL = math.nan  # root and "parent" accounts have no level fair share; never compared


class ShareTreeInvalid(ValueError):
    """A tree that cannot be evaluated (empty or duplicate ids, unknown parent, cycle, bad shares)."""


class UsageInvalid(ValueError):
    """Usage that cannot be counted (negative or not finite, on an account, a time going backwards)."""


class Algorithm(StrEnum):
    CLASSIC = "classic"
    FAIR_TREE = "fair_tree"


class ZeroShares(StrEnum):
    """How Fair Tree ranks a leaf without effective shares (its own or an ancestor's are 0).

    RANKED is Slurm's rule and the default: LF 0 sorts the node after its siblings with shares,
    and it is ranked like any other leaf. UNRANKED is the former rule of this module: factor 0 and
    no rank number, so the leaves Slurm ranks after it each move up one rank. Classic ignores it.
    """

    RANKED = "ranked"
    UNRANKED = "unranked"


# -- checks and decay ----------------------------------------------------------------------------


def _check_time(name: str, value: object) -> int:
    # bool is an int subclass; True as a timestamp is a bug, not one second past the epoch.
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageInvalid(f"{name} must be an integer (UTC Unix seconds), got {value!r}")
    return value


def _check_half_life(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageInvalid(f"half-life is a whole number of seconds >= 0 (0: no decay), got {value!r}")
    return value


def _check_amount(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_AMOUNT:
        raise UsageInvalid(f"{name} is a number of GPU-seconds from 0 to {MAX_AMOUNT:g}, got {value!r}")
    return float(value)


def _check_resets(resets: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({_check_time("reset instant", r) for r in resets}))


def _reset_between(resets: Sequence[int], after: int, upto: int) -> bool:
    """Whether a reset falls in (after, upto]: usage from before it is gone by `upto`."""
    index = bisect.bisect_right(resets, after)
    return index < len(resets) and resets[index] <= upto


def _period_start(resets: Sequence[int], at: int) -> int | None:
    index = bisect.bisect_right(resets, at)
    return resets[index - 1] if index else None


def decay_factor(elapsed: int, half_life: int) -> float:
    """2^(-elapsed / half_life); 1.0 for half_life 0 (no decay).

    Whole half-lives are applied with ldexp, an exact power of two, so usage halves exactly at
    every half-life instead of drifting by a rounding of exp2 over a long interval.
    """
    if half_life == 0 or elapsed == 0:
        return 1.0
    whole, rest = divmod(elapsed, half_life)
    return math.ldexp(math.exp2(-rest / half_life), -whole)


def _units(amount: float) -> int:
    """GPU-seconds as an integer count of 2^-64 GPU-seconds (truncated; exact above 2^-11)."""
    return int(math.ldexp(amount, FRACTION_BITS))


class DecayedUsage:
    """One association's usage, decayed with a half-life and zeroed at reset instants.

    Keeps a value and the time it was last brought forward to; each add decays the value to the
    add's time, then adds. Replaying the same adds in the same order gives the same bits.

    A late add (earlier than the last update) is decayed forward from its own time to the last
    update, amount * 2^(-(last - at) / half_life), and added: it counts as much as it would have
    had it arrived in order (for two events the result is bit for bit the in-order one). A late
    add from before a reset that the accumulator has already passed is dropped (`add` returns
    False): that period's usage is gone.
    """

    __slots__ = ("_half_life", "_last", "_resets", "_value")

    def __init__(self, half_life: int = DEFAULT_HALF_LIFE, resets: Iterable[int] = ()) -> None:
        self._half_life = _check_half_life(half_life)
        self._resets = _check_resets(resets)
        self._value = 0.0
        self._last: int | None = None

    @property
    def half_life(self) -> int:
        return self._half_life

    @property
    def resets(self) -> tuple[int, ...]:
        return self._resets

    @property
    def last_update(self) -> int | None:
        return self._last

    def add(self, amount: float, at: int) -> bool:
        """Count `amount` GPU-seconds used at `at`; False if a reset since then dropped it."""
        value = _check_amount("usage amount", amount)
        at = _check_time("usage time", at)
        last = self._last
        if last is None:
            self._value, self._last = value, at
        elif at >= last:
            carried = 0.0 if _reset_between(self._resets, last, at) else self._value
            self._value = carried * decay_factor(at - last, self._half_life) + value
            self._last = at
        elif _reset_between(self._resets, at, last):
            return False
        else:
            self._value += value * decay_factor(last - at, self._half_life)
        return True

    def value_at(self, at: int) -> float:
        """The decayed usage at `at`, which must not be before the last update (the past is gone)."""
        at = _check_time("query time", at)
        last = self._last
        if last is None:
            return 0.0
        if at < last:
            raise UsageInvalid(f"usage was last updated at {last}; it cannot be read at {at}")
        if _reset_between(self._resets, last, at):
            return 0.0
        return self._value * decay_factor(at - last, self._half_life)


# -- the tree ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareNode:
    """An association: its id, its parent's id (None only for the root) and its raw shares."""

    node_id: str
    parent_id: str | None = ROOT
    shares: Shares = 1

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ShareTreeInvalid(f"a node id is a non-empty string, got {self.node_id!r}")
        if self.node_id == ROOT:
            if self.parent_id is not None:
                raise ShareTreeInvalid(f"the root has no parent, got {self.parent_id!r}")
        elif not isinstance(self.parent_id, str) or not self.parent_id:
            raise ShareTreeInvalid(f"node {self.node_id!r} needs a parent id, got {self.parent_id!r}")
        elif self.parent_id == self.node_id:
            raise ShareTreeInvalid(f"node {self.node_id!r} is its own parent")
        shares = self.shares
        if shares != PARENT and (
            not isinstance(shares, int) or isinstance(shares, bool) or not 0 <= shares <= MAX_SHARES
        ):
            raise ShareTreeInvalid(
                f"node {self.node_id!r}: shares are an integer from 0 to {MAX_SHARES} or 'parent', "
                f"got {shares!r}"
            )


class ShareTree:
    """An association tree, validated once and indexed for the fair-share passes.

    Nodes are numbered in pre-order with siblings sorted by id, the root ("root", explicit or
    implied) being 0: a parent comes before its children, so top-down passes run forward over the
    numbers and sums run backward. The *fair-share* parent of a node (fs parent) is its nearest
    ancestor that is not a "parent" account; shares are compared among fs siblings.
    """

    def __init__(self, nodes: Iterable[ShareNode]) -> None:
        given: dict[str, ShareNode] = {}
        for node in nodes:
            if not isinstance(node, ShareNode):
                raise ShareTreeInvalid(f"expected ShareNode, got {node!r}")
            if node.node_id in given:
                raise ShareTreeInvalid(f"node {node.node_id!r} appears twice")
            given[node.node_id] = node
        given.pop(ROOT, None)  # an explicit root says nothing an implicit one does not
        below: dict[str, list[str]] = {}
        for node in given.values():
            parent_id = node.parent_id or ROOT
            if parent_id != ROOT and parent_id not in given:
                raise ShareTreeInvalid(f"node {node.node_id!r} has an unknown parent {parent_id!r}")
            below.setdefault(parent_id, []).append(node.node_id)
        order: list[str] = []
        stack = [ROOT]
        while stack:
            node_id = stack.pop()
            order.append(node_id)
            stack.extend(sorted(below.get(node_id, ()), reverse=True))
        if len(order) != len(given) + 1:
            stranded = sorted(set(given) - set(order))
            raise ShareTreeInvalid(f"nodes {stranded} do not lead to the root (a cycle)")

        n = len(order)
        self._ids: tuple[str, ...] = tuple(order)
        self._index: dict[str, int] = {node_id: i for i, node_id in enumerate(order)}
        parent = [-1] * n
        raw = [1] * n  # the root owns everything
        children: list[list[int]] = [[] for _ in range(n)]
        depth = [0] * n
        for i in range(1, n):
            node = given[order[i]]
            p = self._index[node.parent_id or ROOT]
            parent[i] = p
            children[p].append(i)
            depth[i] = depth[p] + 1
            raw[i] = node.shares if isinstance(node.shares, int) else _PARENT_RAW
        leaf = [i > 0 and not children[i] for i in range(n)]

        fs_parent = [-1] * n
        fs_children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            p = parent[i]
            fs_parent[i] = p if p == 0 or raw[p] != _PARENT_RAW else fs_parent[p]
            if not (raw[i] == _PARENT_RAW and not leaf[i]):  # "parent" accounts are transparent
                fs_children[fs_parent[i]].append(i)
        for kids in fs_children:
            kids.sort(key=lambda c: (not leaf[c], c))  # the base order of the Fair Tree section
        level_shares = [sum(raw[c] for c in kids if raw[c] != _PARENT_RAW) for kids in fs_children]
        ratio = [1.0] * n  # raw / siblings' raw: Fair Tree's S, one factor of classic's S
        norm_shares = [1.0] * n
        positive = [True] * n
        for i in range(1, n):
            p = fs_parent[i]
            if raw[i] == _PARENT_RAW:
                ratio[i], norm_shares[i], positive[i] = ratio[p], norm_shares[p], positive[p]
            else:
                ratio[i] = raw[i] / level_shares[p] if level_shares[p] else 0.0
                norm_shares[i] = norm_shares[p] * ratio[i]
                positive[i] = positive[p] and raw[i] > 0
        # The leaves that take a rank in each fs subtree (1 or 0 for a leaf itself): all of them
        # (Slurm), or only those with effective shares (ZeroShares.UNRANKED).
        ranked_leaves = {
            ZeroShares.RANKED: [int(leaf[i]) for i in range(n)],
            ZeroShares.UNRANKED: [int(leaf[i] and positive[i]) for i in range(n)],
        }
        for counts in ranked_leaves.values():
            for i in range(n - 1, 0, -1):
                if not (raw[i] == _PARENT_RAW and not leaf[i]):
                    counts[fs_parent[i]] += counts[i]

        self._parent = parent
        self._children = [tuple(kids) for kids in children]
        self._depth = depth
        self._raw = raw
        self._leaf = leaf
        self._fs_parent = fs_parent
        self._fs_children = [tuple(kids) for kids in fs_children]
        self._base_rank = [i + n * (not leaf[i]) for i in range(n)]  # the same base order, as a number
        self._level_shares = level_shares
        self._ratio = ratio
        self._norm_shares = norm_shares
        self._positive = positive
        self._ranked_leaves = ranked_leaves
        self._leaf_count = sum(leaf)
        self._accounts = [i for i in range(n) if fs_children[i]]
        self._parent_accounts = [i for i in range(1, n) if raw[i] == _PARENT_RAW and not leaf[i]]

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    @property
    def ids(self) -> tuple[str, ...]:
        """Every node id, the root first, in pre-order with siblings sorted by id."""
        return self._ids

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(node_id for node_id, is_leaf in zip(self._ids, self._leaf, strict=True) if is_leaf)

    def index(self, node_id: str) -> int:
        """The node's position in `ids` (and in a result's columns)."""
        found = self._index.get(node_id)
        if found is None:
            raise ShareTreeInvalid(f"no node {node_id!r} in the tree")
        return found

    def parent(self, node_id: str) -> str | None:
        p = self._parent[self.index(node_id)]
        return self._ids[p] if p >= 0 else None

    def children(self, node_id: str) -> tuple[str, ...]:
        return tuple(self._ids[c] for c in self._children[self.index(node_id)])

    def depth(self, node_id: str) -> int:
        return self._depth[self.index(node_id)]

    def shares(self, node_id: str) -> Shares:
        return self._shares_at(self.index(node_id))

    def is_leaf(self, node_id: str) -> bool:
        return self._leaf[self.index(node_id)]

    def _shares_at(self, i: int) -> Shares:
        raw = self._raw[i]
        return PARENT if raw == _PARENT_RAW else raw

    def _leaf_at(self, node_id: str) -> int:
        i = self._index.get(node_id)
        if i is None:
            raise UsageInvalid(f"no node {node_id!r} in the tree")
        if not self._leaf[i]:
            raise UsageInvalid(f"{node_id!r} has children; usage is charged to leaves")
        return i


def _leaf_units(tree: ShareTree, leaf_usage: Mapping[str, float]) -> list[int]:
    """Every node's usage in units: the leaves' given, the others' summed below them."""
    units = [0] * len(tree)
    index, leaf = tree._index, tree._leaf
    for node_id, amount in leaf_usage.items():
        i = index.get(node_id, 0)
        if not leaf[i]:  # unknown (0 is the root) or an account: let _leaf_at say which
            i = tree._leaf_at(node_id)
        if type(amount) is not float or not 0.0 <= amount <= MAX_AMOUNT:  # the common case, fast
            amount = _check_amount(f"usage of {node_id!r}", amount)
        units[i] = _units(amount)
    parent = tree._parent
    for i in range(len(units) - 1, 0, -1):
        units[parent[i]] += units[i]
    return units


def _units_to_seconds(units: int) -> float:
    return units / _UNIT


def aggregate_usage(tree: ShareTree, leaf_usage: Mapping[str, float]) -> dict[str, float]:
    """Every node's usage: a leaf's as given (0 if absent), an account's the exact sum below it."""
    units = _leaf_units(tree, leaf_usage)
    return {node_id: _units_to_seconds(u) for node_id, u in zip(tree._ids, units, strict=True)}


# -- results -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One line of `sshare -l` for a node.

    `norm_shares` is S: the product of share ratios in classic, the ratio among siblings in Fair
    Tree (as Slurm reports them). `effective_usage` is classic's U_E, or in Fair Tree the usage
    as a fraction of the parent's (Slurm's usage_efctv there). `level_fs` is Fair Tree's LF (None
    in classic, for the root and for "parent" accounts). The root owns everything: raw shares 1.
    """

    node_id: str
    parent_id: str | None
    depth: int
    is_leaf: bool
    raw_shares: Shares
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    level_fs: float | None
    factor: float


@dataclass(frozen=True)
class FairShareResult:
    """Every node's figures as columns aligned with `tree.ids` (pre-order, siblings by id).

    Columns keep a full recompute cheap (11,000 row objects would cost more than the maths);
    `rows()` builds the `sshare -l` lines when they are published.
    """

    algorithm: Algorithm
    tree: ShareTree
    norm_shares: tuple[float, ...]
    raw_usage: tuple[float, ...]
    norm_usage: tuple[float, ...]
    effective_usage: tuple[float, ...]
    level_fs: tuple[float | None, ...]
    factors: tuple[float, ...]

    def factor(self, node_id: str) -> float:
        return self.factors[self.tree.index(node_id)]

    def factor_map(self) -> dict[str, float]:
        return dict(zip(self.tree.ids, self.factors, strict=True))

    def row(self, node_id: str) -> ShareRow:
        return self._row(self.tree.index(node_id))

    def rows(self) -> tuple[ShareRow, ...]:
        """All nodes in `sshare` order: depth first from the root, siblings by id."""
        return tuple(self._row(i) for i in range(len(self.tree)))

    def ranked(self) -> tuple[ShareRow, ...]:
        """The leaves by factor, highest first (ties by id): the order jobs are favoured in."""
        leaves = [i for i in range(len(self.tree)) if self.tree._leaf[i]]
        leaves.sort(key=lambda i: (-self.factors[i], self.tree._ids[i]))
        return tuple(self._row(i) for i in leaves)

    def _row(self, i: int) -> ShareRow:
        tree = self.tree
        p = tree._parent[i]
        return ShareRow(
            node_id=tree._ids[i],
            parent_id=tree._ids[p] if p >= 0 else None,
            depth=tree._depth[i],
            is_leaf=tree._leaf[i],
            raw_shares=tree._shares_at(i),
            norm_shares=self.norm_shares[i],
            raw_usage=self.raw_usage[i],
            norm_usage=self.norm_usage[i],
            effective_usage=self.effective_usage[i],
            level_fs=self.level_fs[i],
            factor=self.factors[i],
        )


# -- classic -------------------------------------------------------------------------------------


def _normalised(units: Sequence[int]) -> list[float]:
    total = units[0]
    return [u / total for u in units] if total else [0.0] * len(units)


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


def _classic(tree: ShareTree, units: Sequence[int], to_seconds: Callable[[int], float]) -> FairShareResult:
    norm_usage = _normalised(units)
    effective = [norm_usage[0]] * len(units)
    fs_parent, raw = tree._fs_parent, tree._raw
    for i in range(1, len(units)):
        if raw[i] == _PARENT_RAW:
            effective[i] = effective[fs_parent[i]]
        else:
            effective[i] = _effective_usage(tree, i, norm_usage[i], effective[fs_parent[i]])
    factors = tuple(map(_classic_factor, effective, tree._norm_shares))
    return FairShareResult(
        algorithm=Algorithm.CLASSIC,
        tree=tree,
        norm_shares=tuple(tree._norm_shares),
        raw_usage=tuple(map(to_seconds, units)),
        norm_usage=tuple(norm_usage),
        effective_usage=tuple(effective),
        level_fs=(None,) * len(units),
        factors=factors,
    )


def classic_fairshare(tree: ShareTree, leaf_usage: Mapping[str, float]) -> FairShareResult:
    """Slurm's classic fair share for every node; `leaf_usage` maps leaf ids to GPU-seconds."""
    return _classic(tree, _leaf_units(tree, leaf_usage), _units_to_seconds)


# -- Fair Tree -----------------------------------------------------------------------------------
#
# Sibling lists are sorted by LF, highest first; on equal LF leaves come before accounts (Slurm's
# rule, which its tie handling relies on), then lower node numbers, only so that the order is
# reproducible. ShareTree keeps every fs child list in that base order (leaves, then accounts, each
# by number), so a stable sort on LF alone gives the full order without building a key per node.


def _relevel(tree: ShareTree, units: Sequence[int], account: int, level_fs: list[float]) -> list[int]:
    """The LF of every fs child of `account`, stored in `level_fs`; returns them sorted.

    LF = S / U with S = raw / siblings' raw and U = usage / the parent's usage: infinite for no
    usage (and for "parent" leaves, as Slurm has it), 0 for no shares. The full and the
    incremental pass both level through here, so they agree bit for bit.
    """
    raw, ratio = tree._raw, tree._ratio
    parent_units = units[account]
    children = tree._fs_children[account]
    for child in children:
        share = ratio[child]
        if raw[child] == _PARENT_RAW:
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


def _run_start(tree: ShareTree, level_fs: Sequence[float], entries: Sequence[int], index: int) -> int:
    level, start = level_fs[entries[index]], index
    while start > 0 and not tree._leaf[entries[start - 1]] and level_fs[entries[start - 1]] == level:
        start -= 1
    return start


def _tied(level_fs: Sequence[float], entries: Sequence[int], index: int, tied_in: bool) -> bool:
    """Slurm's `tied` for entries[index]: equal LF with the sibling before, or inherited at 0."""
    return tied_in if index == 0 else level_fs[entries[index - 1]] == level_fs[entries[index]]


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


def _fair_tree(
    tree: ShareTree, units: Sequence[int], to_seconds: Callable[[int], float], zero_shares: ZeroShares
) -> FairShareResult:
    level_fs, ordered = _fair_tree_levels(tree, units)
    factors = _rank_all(tree, level_fs, ordered, tree._ranked_leaves[zero_shares])
    fs_parent = tree._fs_parent
    norm_usage = _normalised(units)
    level_usage = norm_usage[:1] + [
        units[i] / units[fs_parent[i]] if units[fs_parent[i]] else 0.0 for i in range(1, len(units))
    ]
    return FairShareResult(
        algorithm=Algorithm.FAIR_TREE,
        tree=tree,
        norm_shares=tuple(tree._ratio),
        raw_usage=tuple(map(to_seconds, units)),
        norm_usage=tuple(norm_usage),
        effective_usage=tuple(level_usage),
        level_fs=tuple(None if math.isnan(level) else level for level in level_fs),
        factors=tuple(factors),
    )


def fair_tree_fairshare(
    tree: ShareTree, leaf_usage: Mapping[str, float], *, zero_shares: ZeroShares = ZeroShares.RANKED
) -> FairShareResult:
    """Slurm's Fair Tree fair share for every node; `leaf_usage` maps leaf ids to GPU-seconds."""
    return _fair_tree(tree, _leaf_units(tree, leaf_usage), _units_to_seconds, ZeroShares(zero_shares))


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


# -- incremental ---------------------------------------------------------------------------------

_Frame: TypeAlias = tuple[Sequence[int], int, bool]  # a sorted group, a position in it, tied_in


def _fs_path(tree: ShareTree, i: int) -> list[int]:
    """The fs ancestors of fs node i below the root, top down, ending with i (empty for the root)."""
    path = []
    while i > 0:
        path.append(i)
        i = tree._fs_parent[i]
    path.reverse()
    return path


class FairShareState:
    """A tree with live decayed usage that answers factors after each event without a full pass.

    Decay without touching every node: all usage decays by the same factor between events, and
    both algorithms only use ratios of usage, so the state keeps usage scaled to a time origin,
    amount * 2^((at - origin) / half_life), and decays only when a value in GPU-seconds is read.
    Late events therefore count exactly as DecayedUsage counts them. Sums are exact integers (see
    the module docstring), so after `add_usage` only the path to the root changes, in O(depth).
    The scale grows by one bit per half-life; after REBASE_HALF_LIVES the origin moves forward
    and every leaf is rescaled (an O(n) pass, once every 256 half-lives: five years at 7 days).
    A reset instant zeroes everything and restarts the origin there.

    Classic: `factor(node)` walks the fs path from the root, computing U_E level by level in
    O(depth) from the cached sums and the cached sibling share sums: every factor is available
    lazily after an event, and nothing else is recomputed.

    Fair Tree: an event changes the LF of every fs sibling of every node on its path (their
    parent's usage changed), so those sibling lists, and only those, are re-levelled and
    re-sorted: O(depth * siblings * log siblings). `factor(node)` then derives the rank from the
    sorted lists: the ranked leaves sorted before the node at each level (subtree counts are
    static), with Slurm's tie chain followed back to its head. That is O(depth * siblings) as
    long as accounts are not tied; tied accounts merge their children, so a tree where whole
    levels tie (no usage anywhere) degrades towards O(n) per read, never to a wrong answer.

    `result()` is the full recompute from the same sums, independent of these caches; tests hold
    the two equal bit for bit.
    """

    def __init__(
        self,
        tree: ShareTree,
        algorithm: Algorithm = Algorithm.FAIR_TREE,
        half_life: int = DEFAULT_HALF_LIFE,
        resets: Iterable[int] = (),
        *,
        zero_shares: ZeroShares = ZeroShares.RANKED,
    ) -> None:
        self._tree = tree
        self._algorithm = Algorithm(algorithm)
        self._zero_shares = ZeroShares(zero_shares)
        self._ranked = tree._ranked_leaves[self._zero_shares]  # Fair Tree: leaves taking a rank
        self._half_life = _check_half_life(half_life)
        self._resets = _check_resets(resets)
        self._units = [0] * len(tree)
        self._clock: int | None = None
        self._period: int | None = None  # the latest reset at or before the clock
        self._origin: int | None = None
        self._relevel_all()

    @property
    def tree(self) -> ShareTree:
        return self._tree

    @property
    def algorithm(self) -> Algorithm:
        return self._algorithm

    @property
    def zero_shares(self) -> ZeroShares:
        return self._zero_shares

    @property
    def clock(self) -> int | None:
        """The latest time seen (an add or `advance`); late adds do not move it."""
        return self._clock

    def add_usage(self, leaf: str, amount: float, at: int) -> bool:
        """Charge `amount` GPU-seconds used at `at` to `leaf`; False if a passed reset dropped it."""
        i = self._tree._leaf_at(leaf)
        value = _check_amount("usage amount", amount)
        at = _check_time("usage time", at)
        if self._clock is None or at > self._clock:
            self._advance(at)
        if self._period is not None and at < self._period:
            return False
        contribution = self._contribution(value, at)
        if contribution:
            units, parent = self._units, self._tree._parent
            node = i
            while node >= 0:
                units[node] += contribution
                node = parent[node]
            if self._algorithm is Algorithm.FAIR_TREE:
                self._relevel_path(i)
        return True

    def advance(self, at: int) -> None:
        """Move the clock to `at` without usage, so that a reset in between takes effect."""
        at = _check_time("time", at)
        if self._clock is not None and at < self._clock:
            raise UsageInvalid(f"the state is at {self._clock}; it cannot go back to {at}")
        self._advance(at)

    def factor(self, node_id: str) -> float:
        """The node's factor now (as of the clock), computed lazily from the cached sums."""
        i = self._tree.index(node_id)
        if self._algorithm is Algorithm.CLASSIC:
            return self._classic_factor(i)
        return self._fair_tree_factor(i)

    def usage_at(self, node_id: str, at: int | None = None) -> float:
        """The node's decayed usage in GPU-seconds at `at` (default: the clock)."""
        return self._seconds_at(at)(self._units_at(at)[self._tree.index(node_id)])

    def result(self, at: int | None = None) -> FairShareResult:
        """A full recompute at `at` (default: the clock) from the sums alone, ignoring the caches."""
        units, to_seconds = self._units_at(at), self._seconds_at(at)
        if self._algorithm is Algorithm.CLASSIC:
            return _classic(self._tree, units, to_seconds)
        return _fair_tree(self._tree, units, to_seconds, self._zero_shares)

    # time and scale

    def _check_read_time(self, at: int | None) -> int | None:
        if at is None:
            return self._clock
        at = _check_time("query time", at)
        if self._clock is not None and at < self._clock:
            raise UsageInvalid(f"the state is at {self._clock}; it cannot be read at {at}")
        return at

    def _units_at(self, at: int | None) -> Sequence[int]:
        at = self._check_read_time(at)
        if at is not None and _period_start(self._resets, at) != self._period:
            return [0] * len(self._units)  # a reset since the clock: nothing is left
        return self._units

    def _seconds_at(self, at: int | None) -> Callable[[int], float]:
        at = self._check_read_time(at)
        if self._half_life == 0 or self._origin is None or at is None:
            return _units_to_seconds
        whole, rest = divmod(at - self._origin, self._half_life)
        denominator = 1 << (FRACTION_BITS + whole)
        tail = math.exp2(-rest / self._half_life)
        return lambda units: units / denominator * tail

    def _advance(self, at: int) -> None:
        period = _period_start(self._resets, at)
        if period != self._period:
            self._period = period
            if self._units[0]:
                self._units = [0] * len(self._units)
                self._relevel_all()
            self._origin = None
        self._clock = at

    def _contribution(self, amount: float, at: int) -> int:
        """`amount` at `at` in units scaled to the origin: amount * 2^((at - origin) / half_life)."""
        if self._half_life == 0:
            return _units(amount)
        if self._origin is None:
            self._origin = self._period if self._period is not None else at
        whole, rest = divmod(at - self._origin, self._half_life)
        if whole > REBASE_HALF_LIVES:
            self._rebase(whole)
            whole = 0
        units = _units(amount * math.exp2(rest / self._half_life))
        return units << whole if whole >= 0 else units >> -whole

    def _rebase(self, half_lives: int) -> None:
        # Usage older than 256 half-lives is below 2^-256 of today's: shifting it out costs
        # nothing measurable and keeps the integers short.
        if self._origin is not None:
            self._origin += half_lives * self._half_life
        tree, units = self._tree, self._units
        for i in range(len(units)):
            units[i] = units[i] >> half_lives if tree._leaf[i] else 0
        for i in range(len(units) - 1, 0, -1):
            units[tree._parent[i]] += units[i]
        self._relevel_all()

    # Fair Tree caches

    def _relevel_all(self) -> None:
        if self._algorithm is Algorithm.FAIR_TREE:
            self._level_fs, self._ordered = _fair_tree_levels(self._tree, self._units)

    def _relevel_path(self, leaf: int) -> None:
        tree, units, level_fs, ordered = self._tree, self._units, self._level_fs, self._ordered
        account = tree._fs_parent[leaf]
        while account >= 0:
            ordered[account] = _relevel(tree, units, account, level_fs)
            account = tree._fs_parent[account]

    # lazy factors

    def _classic_factor(self, i: int) -> float:
        tree, units = self._tree, self._units
        if tree._raw[i] == _PARENT_RAW:
            i = tree._fs_parent[i]
        total = units[0]
        effective = units[0] / total if total else 0.0
        for j in _fs_path(tree, i):
            own = units[j] / total if total else 0.0
            effective = _effective_usage(tree, j, own, effective)
        return _classic_factor(effective, tree._norm_shares[i])

    def _fair_tree_factor(self, i: int) -> float:
        tree = self._tree
        if tree._raw[i] == _PARENT_RAW and not tree._leaf[i]:
            i = tree._fs_parent[i]
        ranked = self._ranked
        if i == 0:  # the first ranked leaf always has the top rank
            return 1.0 if ranked[0] else 0.0
        # Only ZeroShares.UNRANKED leaves anything unranked. There a leaf without effective shares
        # takes no rank, and neither does an account without them: its LF is 0 (or an ancestor's
        # is), and every account tied with it at 0 has no shares either. An account with shares
        # but no ranked leaf of its own may still be tied with a sibling account that has one,
        # and then shares that group's factor: only the walk can tell.
        if not ranked[i] and (tree._leaf[i] or not tree._positive[i]):
            return 0.0
        frames = self._frames_to(i)
        if not tree._leaf[i] and not self._descend_to_first_leaf(frames):
            return 0.0
        return self._rank(frames) / tree._leaf_count

    def _frames_to(self, target: int) -> list[_Frame]:
        """The sorted groups from the root down to `target`, with its (run's) position in each."""
        tree, level_fs = self._tree, self._level_fs
        frames: list[_Frame] = []
        entries: Sequence[int] = self._ordered[0]
        tied_in = False
        for node in _fs_path(tree, target):
            index = entries.index(node)
            if tree._leaf[node]:
                frames.append((entries, index, tied_in))
                break
            start = _run_start(tree, level_fs, entries, index)
            frames.append((entries, start, tied_in))
            if node == target:
                break
            end = _run_end(tree, level_fs, entries, start)
            tied_in = _tied(level_fs, entries, start, tied_in)
            entries = _group(tree, level_fs, self._ordered, entries, start, end)
        return frames

    def _descend_to_first_leaf(self, frames: list[_Frame]) -> bool:
        """Extend frames ending at an account run down to the first ranked leaf inside it (inside
        the run's merged group); False, frames unchanged, if the run has no ranked leaf at all."""
        tree, level_fs, ranked = self._tree, self._level_fs, self._ranked
        entries, start, tied_in = frames[-1]
        end = _run_end(tree, level_fs, entries, start)
        if not any(ranked[node] for node in entries[start:end]):
            return False
        while True:
            tied_in = _tied(level_fs, entries, start, tied_in)
            entries = _group(tree, level_fs, self._ordered, entries, start, end)
            index = next(k for k, node in enumerate(entries) if ranked[node])
            if tree._leaf[entries[index]]:
                frames.append((entries, index, tied_in))
                return True
            start = _run_start(tree, level_fs, entries, index)
            frames.append((entries, start, tied_in))
            end = _run_end(tree, level_fs, entries, start)

    def _rank(self, frames: list[_Frame]) -> int:
        """Slurm's rank for the leaf the frames end at: that of the head of its tie chain."""
        level_fs, ranked = self._level_fs, self._ranked
        depth = len(frames) - 1
        entries, index, tied_in = frames[depth]
        while True:
            if index > 0:
                if level_fs[entries[index - 1]] != level_fs[entries[index]]:
                    break
                index -= 1  # tied with the sibling before, which is a leaf (leaves sort first)
            elif tied_in:
                depth -= 1  # first in a tied account run: tied with what precedes the run
                entries, index, tied_in = frames[depth]
            else:
                break
        before = sum(ranked[node] for node in entries[:index])
        for group, position, _ in frames[:depth]:
            before += sum(ranked[node] for node in group[:position])
        return self._tree._leaf_count - before
