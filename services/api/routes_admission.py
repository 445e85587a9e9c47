"""Admission and preemption: what the cluster scheduler asks, per job, with its own token."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from allmende.domain import admission_tickets
from allmende.domain.admission_model import JobRequest
from allmende.schemas.admission_events import AdmissionDecided, ReasonRecord, VictimRecord
from allmende.schemas.events import Identifier
from allmende.services.admission_service import AdmissionNotRecorded, AdmissionRefused, AdmissionService
from allmende.services.api.admin_models import RejectionBody, units_to_hours
from allmende.services.api.auth import Scheduler, Submitter
from allmende.services.api.deps import Store

router = APIRouter(prefix="/v1", tags=["admission"])
ERRORS: dict[int | str, dict[str, object]] = {
    c: {"model": RejectionBody} for c in (401, 403, 404, 409, 422, 503)
}
MAX_HOURS = 366 * 24


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: Identifier
    project: Identifier
    user: Identifier
    cluster: Identifier
    gpu_type: Identifier
    gpus: Annotated[int, Field(ge=1, le=1_000_000)]
    priority_class: Literal["preemptible", "standard", "non-preemptible"] = "standard"
    interactive: bool = False
    requested_hours: Annotated[Decimal, Field(gt=0, le=MAX_HOURS, description="the job's time limit")]

    def job(self) -> JobRequest:
        return JobRequest(
            job_id=self.job_id, project=self.project, user=self.user, cluster=self.cluster,
            gpu_type=self.gpu_type, gpus=self.gpus, priority_class=self.priority_class,
            interactive=self.interactive, requested_seconds=math.ceil(self.requested_hours * 3600),
        )  # fmt: skip


class AdmissionResponse(BaseModel):
    job_id: str
    attempt: int
    decided_at: int
    verdict: Literal["admit", "queue", "reject"]
    lane: Literal["interactive", "time-slice", "budget", "opportunistic"] | None
    reasons: list[ReasonRecord] = Field(description="the deciding reason first; codes are stable")
    sentence: str = Field(description="the reasons, for the researcher")
    charge_rate_per_gpu_hour: Decimal = Field(
        description="weighted GPU-hours charged per GPU-hour of this job"
    )
    rate_units_per_gpu_second: int
    expected_gpu_hours: Decimal = Field(description="the most this job can cost (weighted GPU-hours)")
    balance_before_gpu_hours: Decimal = Field(description="available in the allocations that would pay")
    balance_after_gpu_hours: Decimal
    held_gpu_hours: Decimal
    fairshare_factor: float
    preempt: list[VictimRecord] = Field(description="jobs to stop first, in this order")
    ticket: str | None = Field(
        default=None,
        description="the decision signed for a scheduler plugin to check locally (admit and queue"
        " answers, and every dry run, where the API has a ticket key; docs/slurm.md)",
    )

    @classmethod
    def of(cls, d: AdmissionDecided) -> AdmissionResponse:
        held = d.available_before_units - d.available_after_units
        return cls(
            job_id=d.job_id, attempt=d.attempt, decided_at=d.occurred_at, verdict=d.verdict, lane=d.lane,
            reasons=list(d.reasons), sentence=" ".join(r.message for r in d.reasons),
            charge_rate_per_gpu_hour=units_to_hours(d.rate * 3600), rate_units_per_gpu_second=d.rate,
            expected_gpu_hours=units_to_hours(d.expected_units),
            balance_before_gpu_hours=units_to_hours(d.available_before_units),
            balance_after_gpu_hours=units_to_hours(d.available_after_units),
            held_gpu_hours=units_to_hours(held), fairshare_factor=d.fairshare_factor, preempt=list(d.preempt),
        )  # fmt: skip


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cluster: Identifier
    gpus: Annotated[int, Field(ge=0, le=1_000_000, description="GPUs to free (0: only the unhealthy hosts)")]


class PlanResponse(BaseModel):
    cluster: str
    gpus_requested: int
    gpus_freed: int
    enough: bool
    victims: list[VictimRecord]


class HostHealthRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cluster: Identifier
    host: Identifier
    healthy: bool
    reason: Annotated[str, Field(max_length=1000)] = ""


def _service(request: Request) -> AdmissionService:
    service: AdmissionService | None = request.app.state.admission
    if service is None:
        raise HTTPException(503, "the admission service is not enabled here (ALLMENDE_ADMISSION_ENABLED)")
    return service


def _json(answer: AdmissionResponse) -> Response:
    """The answer serialized once, by its own model: FastAPI would validate it again first (the
    response model stays declared, for the OpenAPI schema)."""
    return Response(answer.__pydantic_serializer__.to_json(answer), media_type="application/json")


def _ticket(request: Request, d: AdmissionDecided, dry_run: bool) -> str | None:
    """The decision signed, when this API has a key: only a real admit or queue may let a job be
    submitted; a dry run's ticket carries its verdict for job_submit.lua's dry-run log."""
    key: bytes | None = getattr(request.app.state, "ticket_key", None)
    if key is None or (d.verdict == "reject" and not dry_run):
        return None
    fields = {f: getattr(d, f) for f in admission_tickets.FIELDS}
    ttl: int = getattr(request.app.state, "ticket_ttl_s", 300)
    ticket = admission_tickets.Ticket(
        d.job_id, fields, d.verdict, d.lane, d.occurred_at, d.occurred_at + ttl, dry_run
    )
    return admission_tickets.issue(ticket, key)


def _refused(exc: AdmissionRefused | AdmissionNotRecorded) -> HTTPException:
    if isinstance(exc, AdmissionNotRecorded):  # Kafka away: no answer yet; the same call again is safe
        return HTTPException(503, {"detail": str(exc), "code": "not-recorded"}, headers={"Retry-After": "1"})
    if exc.status == 503:  # starting, or a standby: the same call again (there, or elsewhere) is safe
        body = {"detail": str(exc), "code": exc.code or "starting"}
        return HTTPException(503, body, headers={"Retry-After": "1"})
    code = {404: "unknown", 409: "conflict"}.get(exc.status, "invalid")
    return HTTPException(exc.status, {"detail": str(exc), "code": code})


@router.post(
    "/admission",
    response_model=AdmissionResponse,
    responses=ERRORS,
    summary="Admit, queue or reject a job; whom to preempt. The same job id gets the same answer.",
)
async def admission(
    body: AdmissionRequest,
    caller: Submitter,
    request: Request,
    dry_run: Annotated[bool, Query(description="decide without recording: what would happen now")] = False,
) -> Response:
    service = _service(request)
    try:
        decided = await service.admit(body.job(), caller.name, dry_run=dry_run)
    except (AdmissionRefused, AdmissionNotRecorded) as exc:
        raise _refused(exc) from None
    answer = AdmissionResponse.of(decided)
    answer.ticket = _ticket(request, decided, dry_run)
    return _json(answer)


@router.get(
    "/admission/{job_id}",
    response_model=AdmissionResponse,
    responses=ERRORS,
    summary="The recorded decision, for any job ever decided",
    description="The job's latest recorded decision: from memory while the job is live, else from"
    " the decision history in ClickHouse (every decision the admission log holds, kept after the job"
    " ended and left memory). 404 only for a job never decided (or whose decision was not recorded).",
)
async def recorded(
    job_id: Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@/+-]+$")],
    caller: Scheduler,
    request: Request,
    store: Store,
) -> Response:
    decided = _service(request).decision(job_id)
    if decided is None:  # let go of (the job ended long ago), or never decided: the history says
        try:
            decided = await run_in_threadpool(store.decision, job_id)
        except Exception as exc:  # ClickHouse away: no answer yet, not "never decided"
            raise HTTPException(
                503,
                {"detail": f"the decision history cannot be read now ({exc!r})", "code": "unavailable"},
                headers={"Retry-After": "1"},
            ) from None
    if decided is None:
        raise HTTPException(404, f"no decision for job {job_id!r}")
    return _json(AdmissionResponse.of(decided))


@router.post(
    "/preemption/plan",
    response_model=PlanResponse,
    responses=ERRORS,
    summary="Whom to stop to free GPUs: unhealthy hosts first, then opportunistic, lowest fair share first",
)
async def preemption_plan(body: PlanRequest, caller: Scheduler, request: Request) -> PlanResponse:
    try:
        victims, freed = _service(request).preemption_plan(body.cluster, body.gpus)
    except AdmissionRefused as exc:
        raise _refused(exc) from None
    records = [VictimRecord(job_id=v.job_id, project=v.project, gpus=v.gpus, code=v.code, reason=v.reason)
               for v in victims]  # fmt: skip
    return PlanResponse(
        cluster=body.cluster,
        gpus_requested=body.gpus,
        gpus_freed=freed,
        enough=freed >= body.gpus,
        victims=records,
    )


@router.post(
    "/hosts/health", responses=ERRORS, summary="Report a host unhealthy (its jobs become victims) or healthy"
)
async def host_health(body: HostHealthRequest, caller: Scheduler, request: Request) -> dict[str, str]:
    try:
        event = await _service(request).host_health(
            body.cluster, body.host, body.healthy, body.reason, caller.name
        )
    except (AdmissionRefused, AdmissionNotRecorded) as exc:
        raise _refused(exc) from None
    return {"event_id": event.event_id, "type": event.type}
