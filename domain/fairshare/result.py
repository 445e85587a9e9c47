"""What a fair-share computation returns: every node's figures, as `sshare -l` shows them."""

from __future__ import annotations

from dataclasses import dataclass

from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.tree import Shares, ShareTree


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
