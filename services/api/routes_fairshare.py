"""Fair share: the tree with every factor and its inputs, as the calculator last published it."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from allmende.domain.admin_state import AdminState
from allmende.schemas.fairshare import FairShareRecord
from allmende.services.api.access import readable_projects
from allmende.services.api.auth import Caller, Principal
from allmende.services.api.models import ErrorBody
from allmende.streams.fairshare_calculator import FairShareCalculator

router = APIRouter(prefix="/v1", tags=["fair share"])


class FairShareTree(BaseModel):
    as_of: int = Field(description="the stream's clock: usage up to this instant is included")
    algorithm: str
    half_life_s: int
    caught_up: bool = Field(
        description="whether the snapshot was taken with the ledger stream read to its end"
    )
    nodes: list[FairShareRecord] = Field(description="depth first from the root, like `sshare -l`")


@router.get(
    "/fairshare",
    response_model=FairShareTree,
    responses={code: {"model": ErrorBody} for code in (401, 403, 503)},
    summary="The fair-share tree: shares, usage, effective usage, level fair share and factor per node",
    description="Admins and the scheduler read the whole tree; a project lead the paths from the root "
    "to the projects they lead (other projects' usage stays private).",
)
async def fairshare(request: Request, caller: Caller) -> FairShareTree:
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
) -> list[FairShareRecord]:
    """The whole tree for admins and the scheduler; for a lead, the nodes on the paths from the root
    to the projects they may read (depth-first order kept)."""
    if caller.role in ("admin", "scheduler"):
        return list(records)
    parents = {r.node_id: r.parent_id for r in records}
    allowed: set[str] = set()
    for project in readable_projects(state, caller):
        node: str | None = project
        for _ in range(len(parents) + 1):  # a bound: the tree has no cycles, but never loop forever
            if not node or node in allowed or node not in parents:
                break
            allowed.add(node)
            node = parents[node]
    return [r for r in records if r.node_id in allowed]
