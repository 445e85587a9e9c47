"""Fair share: the tree with every factor and its inputs, as the calculator last published it.

What a caller sees of it is the rule of `access.py` (docs/security.md): admins every figure of
every node; a lead the nodes they lead and their subtrees (own usage and factor), with the path
up to the root for context (ids and shares only); the scheduler the factor of every project.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from allmende.domain.admin_state import AdminState
from allmende.schemas.fairshare import FairShareRecord
from allmende.services.api.access import led_nodes
from allmende.services.api.auth import Caller, Principal
from allmende.services.api.models import ErrorBody
from allmende.streams.fairshare_calculator import FairShareCalculator

router = APIRouter(prefix="/v1", tags=["fair share"])

Detail = Literal["full", "own", "path", "factor"]


class FairShareNode(BaseModel):
    """One node of the tree (`sshare -l`'s columns); a figure the caller may not see is null."""

    as_of: int
    algorithm: Literal["classic", "fair_tree"]
    node_id: str
    parent_id: str | None
    depth: int
    is_leaf: bool
    detail: Detail = Field(
        description="full: every figure (admins); own: a node the lead leads or one below it, with "
        "its own usage and factor (figures relative to usage outside the subtree are null); path: "
        "an ancestor of the lead's nodes, ids and shares only; factor: the scheduler's view of a "
        "project, its factor only"
    )
    raw_shares: int | Literal["parent"]
    norm_shares: float
    raw_usage: float | None = Field(description="decayed charged GPU-seconds of the node's subtree")
    norm_usage: float | None
    effective_usage: float | None
    level_fs: float | Literal["inf"] | None
    factor: float | None

    @classmethod
    def of(cls, record: FairShareRecord, detail: Detail) -> FairShareNode:
        node = cls(**record.model_dump(), detail=detail)
        if detail == "full":
            return node
        hidden = {"raw_usage", "norm_usage", "effective_usage", "level_fs"}
        if detail == "own":
            hidden -= {"raw_usage"}  # own usage; its share of everyone's, or of the parent's, is not
        if detail == "path":
            hidden |= {"factor"}  # an ancestor's factor and usage add up other branches'
        return node.model_copy(update=dict.fromkeys(hidden))


class FairShareTree(BaseModel):
    as_of: int = Field(description="the stream's clock: usage up to this instant is included")
    algorithm: str
    half_life_s: int
    caught_up: bool = Field(
        description="whether the snapshot was taken with the ledger stream read to its end"
    )
    nodes: list[FairShareNode] = Field(description="depth first from the root, like `sshare -l`")


@router.get(
    "/fairshare",
    response_model=FairShareTree,
    responses={code: {"model": ErrorBody} for code in (401, 403, 503)},
    summary="The fair-share tree: shares, usage, effective usage, level fair share and factor per node",
    description="Admins read the whole tree. A project lead reads the nodes they lead and the "
    "subtrees below them (their own usage and factors), and the path from the root to them with ids "
    "and shares only: no other branch's usage. The scheduler reads every project's factor (the "
    "order of its queue), no usage. See docs/security.md.",
)
async def fairshare(request: Request, caller: Caller) -> FairShareTree:
    if caller.role == "submitter":
        raise HTTPException(403, f"{caller.name} may only ask for admission")
    calculator: FairShareCalculator | None = request.app.state.fairshare
    if calculator is None:
        raise HTTPException(503, "the fair-share calculator is not enabled here (ALLMENDE_FAIRSHARE_ENABLED)")
    snapshot = calculator.latest
    if snapshot is None:
        raise HTTPException(
            503, "no fair-share snapshot yet: the calculator is still reading the ledger stream"
        )
    return FairShareTree(
        as_of=snapshot.as_of,
        algorithm=snapshot.algorithm,
        half_life_s=calculator.settings.fairshare_half_life_s,
        caught_up=snapshot.caught_up,
        nodes=visible_nodes(request.app.state.admin.state(), caller, snapshot.records),
    )


def visible_nodes(
    state: AdminState, caller: Principal, records: Sequence[FairShareRecord]
) -> list[FairShareNode]:
    """What `caller` may see of the tree, depth-first order kept (the rule in the module's doc).

    A lead's own nodes are found on the tree's own parent links, so the leaves the calculator
    adds (`<group>:own`, usage booked on a group) belong to whoever leads the group.
    """
    if caller.role == "admin":
        return [FairShareNode.of(r, "full") for r in records]
    if caller.role == "scheduler":
        return [FairShareNode.of(r, "factor") for r in records if r.is_leaf]
    if caller.role != "lead":
        return []
    parents = {r.node_id: r.parent_id for r in records}
    led = led_nodes(state, caller)

    def path(node: str) -> list[str]:
        found: list[str] = []
        current: str | None = node
        while current is not None and current in parents and len(found) <= len(parents):  # no cycles
            found.append(current)
            current = parents[current]
        return found

    own = {r.node_id for r in records if led.intersection(path(r.node_id))}
    above = {a for node in own for a in path(node)[1:]} - own
    return [
        FairShareNode.of(r, "own" if r.node_id in own else "path")
        for r in records
        if r.node_id in own or r.node_id in above
    ]
