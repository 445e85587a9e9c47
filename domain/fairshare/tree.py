"""The association tree fair share is computed over: nodes, raw shares, "parent" accounts.

Every node has raw shares among its siblings: an integer >= 0, or "parent" (Slurm's
`Fairshare=parent`). A "parent" account is transparent: its children compete as if they hung
directly under its nearest ancestor with shares of its own (Slurm's fs_assoc_ptr). A "parent" leaf
takes its parent's place: classic reports the parent's normalised shares, effective usage and
factor for it; Fair Tree gives it an infinite level fair share, as Slurm does, so it ranks at the
top of its parent's block, and that is what Fair Tree reports as the parent's factor. A "parent"
node adds nothing to its siblings' share sum. Usage sits on leaves (nodes without children); a
node's usage is the sum of the usage below it (`sums`).

`ShareTree` validates the nodes once and precomputes what both algorithms read (fs parents and
children, share ratios, normalised shares, the leaves that take a Fair Tree rank): its private
arrays are shared with the other modules of this package, and only with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from allmende.domain.fairshare.options import ZeroShares

ROOT: Final = "root"
PARENT: Final = "parent"
MAX_SHARES: Final = 2**32 - 1  # Slurm stores raw shares in a uint32
PARENT_RAW: Final = -1  # how ShareTree's raw shares code "parent"

Shares: TypeAlias = int | Literal["parent"]


class ShareTreeInvalid(ValueError):
    """A tree that cannot be evaluated (empty or duplicate ids, unknown parent, cycle, bad shares)."""


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
            raw[i] = node.shares if isinstance(node.shares, int) else PARENT_RAW
        leaf = [i > 0 and not children[i] for i in range(n)]

        fs_parent = [-1] * n
        fs_children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            p = parent[i]
            fs_parent[i] = p if p == 0 or raw[p] != PARENT_RAW else fs_parent[p]
            if not (raw[i] == PARENT_RAW and not leaf[i]):  # "parent" accounts are transparent
                fs_children[fs_parent[i]].append(i)
        for kids in fs_children:
            kids.sort(key=lambda c: (not leaf[c], c))  # the base order of the Fair Tree section
        level_shares = [sum(raw[c] for c in kids if raw[c] != PARENT_RAW) for kids in fs_children]
        ratio = [1.0] * n  # raw / siblings' raw: Fair Tree's S, one factor of classic's S
        norm_shares = [1.0] * n
        positive = [True] * n
        for i in range(1, n):
            p = fs_parent[i]
            if raw[i] == PARENT_RAW:
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
                if not (raw[i] == PARENT_RAW and not leaf[i]):
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
        self._ranked_leaves = ranked_leaves
        self._leaf_count = sum(leaf)
        self._accounts = [i for i in range(n) if fs_children[i]]
        self._parent_accounts = [i for i in range(1, n) if raw[i] == PARENT_RAW and not leaf[i]]

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
        return PARENT if raw == PARENT_RAW else raw
