"""The organisation: a tree of organisations, groups and projects, and the clusters they share.

Projects are the leaves that hold budgets and run jobs; inner nodes carry fair-share shares. A
node's `shares` is an integer or "parent" (Slurm's `Fairshare=parent`: the node stands in its
parent's place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NodeKind = Literal["organisation", "group", "project"]
ROOT = "root"


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    parent: str | None  # None: directly under the root
    kind: NodeKind
    shares: int | Literal["parent"]
    leads: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Cluster:
    cluster: str
    gpu_type: str
    gpus: int


class TreeInvalid(ValueError):
    """A node change that would break the tree (unknown parent, a cycle, a project with children)."""


def check_node(nodes: dict[str, Node], node: Node) -> None:
    """Raise TreeInvalid unless `node` can be declared (or changed) in the tree `nodes`."""
    if node.node_id == ROOT:
        raise TreeInvalid(f"{ROOT!r} is the implicit root; choose another node id")
    if node.kind == "project" and any(n.parent == node.node_id for n in nodes.values()):
        raise TreeInvalid(f"node {node.node_id!r} has children and cannot become a project")
    if node.parent is None:
        return
    parent = nodes.get(node.parent)
    if parent is None:
        raise TreeInvalid(f"node {node.node_id!r}: parent {node.parent!r} is not declared")
    if parent.kind == "project":
        raise TreeInvalid(f"node {node.node_id!r}: parent {node.parent!r} is a project; projects are leaves")
    ancestor: str | None = node.parent
    seen = 0
    while ancestor is not None:
        if ancestor == node.node_id:
            raise TreeInvalid(f"node {node.node_id!r} under {node.parent!r} would make a cycle")
        ancestor = nodes[ancestor].parent if ancestor in nodes else None
        seen += 1
        if seen > len(nodes):  # a cycle already on the log: refuse rather than loop
            raise TreeInvalid("the tree has a cycle")


def path_to_root(nodes: dict[str, Node], node_id: str) -> list[str]:
    """`node_id` and its ancestors, nearest first (the implicit root excluded)."""
    path: list[str] = []
    current: str | None = node_id
    while current is not None and current in nodes and len(path) <= len(nodes):
        path.append(current)
        current = nodes[current].parent
    return path
