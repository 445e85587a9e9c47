"""Fair share: the tree with every factor and its inputs, as the calculator last published it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from schemas.fairshare import FairShareRecord
from services.api.models import ErrorBody
from services.fairshare_calculator import FairShareCalculator

router = APIRouter(prefix="/v1", tags=["fair share"])


class FairShareTree(BaseModel):
    as_of: int = Field(description="the stream's clock: usage up to this instant is included")
    algorithm: str
    half_life_s: int
    caught_up: bool = Field(description="whether the calculator has read the ledger stream to its end")
    nodes: list[FairShareRecord] = Field(description="depth first from the root, like `sshare -l`")


@router.get(
    "/fairshare",
    response_model=FairShareTree,
    responses={503: {"model": ErrorBody}},
    summary="The fair-share tree: shares, usage, effective usage, level fair share and factor per node",
)
async def fairshare(request: Request) -> FairShareTree:
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
        caught_up=calculator.caught_up.is_set(),
        nodes=list(snapshot.records),
    )
