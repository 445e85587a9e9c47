"""What the simulator takes from a plan file: its clusters, and its projects' shares."""

from __future__ import annotations

from allmende.domain.plan_file import Plan
from allmende.domain.simulation.model import ClusterSize


def clusters_from_plan(plan: Plan) -> tuple[ClusterSize, ...]:
    return tuple(
        sorted((ClusterSize(c.name, c.gpus, c.gpu_type) for c in plan.clusters), key=lambda c: c.name)
    )


def project_shares(plan: Plan) -> dict[str, int]:
    """Shares of the project nodes, as written (a project with `shares: parent` takes its parent's
    number; a parent that also says `parent`, or is missing, gives 1)."""
    nodes = {n.id: n for n in plan.organisation}
    shares: dict[str, int] = {}
    for node in plan.organisation:
        if node.kind != "project":
            continue
        value = node.shares
        if value == "parent":
            parent = nodes.get(node.parent) if node.parent else None
            value = parent.shares if parent is not None and isinstance(parent.shares, int) else 1
        shares[node.id] = value
    return shares
