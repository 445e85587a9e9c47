"""The HTTP API: its routes (one router per resource), the pages, health and error bodies.

What runs behind the routes (the ledger writer, fair share, admission, the admin log...) is
not decided here: `allmende.topology` starts those components in the lifespan it passes in and
puts them on the app's state, where the routes' dependencies (`deps.py`) find them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import make_asgi_app
from starlette.exceptions import HTTPException as StarletteHTTPException

from allmende import __version__
from allmende.services.admission_service import AdmissionService
from allmende.services.api.deps import Store, Writer
from allmende.services.api.models import Health
from allmende.services.api.routes_admin import router as admin_router
from allmende.services.api.routes_admission import router as admission_router
from allmende.services.api.routes_balance import router as balance_router
from allmende.services.api.routes_dashboard import router as dashboard_router
from allmende.services.api.routes_fairshare import router as fairshare_router
from allmende.services.api.routes_requests import router as requests_router
from allmende.services.api.routes_usage import router as usage_router
from allmende.services.web.oidc_signin import router as oidc_router
from allmende.services.web.routes import router as web_router
from allmende.streams.admin_log import NotRecorded

STATE_AGE_HEADER = "X-Allmende-State-Age"  # seconds since the admin state last reached its log's end


def _admission_role(admission: AdmissionService | None) -> str:
    if admission is None:
        return "disabled"
    return "leader" if admission.leading else "standby"


def build_api(lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]]) -> FastAPI:
    app = FastAPI(
        title="Allmende",
        version=__version__,
        summary="GPU-hour budgets, ledger and admission for shared GPU clusters",
        lifespan=lifespan,
    )
    # Routes match in order: the scheduler's per-job call first, the human-paced ones after.
    app.include_router(admission_router)
    app.include_router(usage_router)
    app.include_router(balance_router)
    app.include_router(admin_router)
    app.include_router(requests_router)
    app.include_router(fairshare_router)
    app.include_router(dashboard_router)
    app.include_router(web_router)
    app.include_router(oidc_router)
    app.mount("/metrics", make_asgi_app())

    @app.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz(request: Request, store: Store, writer: Writer) -> Health | JSONResponse:
        try:
            await run_in_threadpool(store.db.rows, "SELECT 1")
            clickhouse = "ok"
        except Exception as exc:  # health must answer, whatever broke
            clickhouse = f"error: {exc}"
        writer_state = "disabled" if writer is None else (writer.last_error or "running")
        for name in ("decision_writer", "preemption_writer", "sample_writer"):  # beside the ledger writer
            history = getattr(request.app.state, name, None)
            if writer_state == "running" and history is not None and history.last_error:
                writer_state = f"{name.replace('_', ' ')}: {history.last_error}"
        alerter = request.app.state.alerter
        alerts = "disabled" if alerter is None else (alerter.last_error or "running")
        calculator = request.app.state.fairshare
        fairshare = "disabled" if calculator is None else (calculator.last_error or "running")
        # A writer or calculator that keeps failing is not "ok", whatever ClickHouse says.
        healthy = (
            clickhouse == "ok"
            and writer_state in ("running", "disabled")
            and fairshare in ("running", "disabled")
        )
        health = Health(
            status="ok" if healthy else "degraded",
            clickhouse=clickhouse,
            writer=writer_state,
            fairshare=fairshare,
            alerts=alerts,
            writer_batches=writer.batches if writer else 0,
            writer_caught_up=bool(writer and writer.caught_up.is_set()),
            admin_state_age_s=request.app.state.admin.log.age_s(),
            admission=_admission_role(request.app.state.admission),
        )
        if health.status != "ok":
            return JSONResponse(health.model_dump(), status_code=503)
        return health

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Refusals carry a machine-readable code beside the sentence: send that body as it is.
        body = exc.detail if isinstance(exc.detail, dict) else {"detail": exc.detail}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(NotRecorded)
    async def not_recorded(_: Request, exc: NotRecorded) -> JSONResponse:
        # Kafka away: the command has no effect, now or later; the same command again is safe.
        body = {"detail": f"{exc}; it has no effect: send it again", "code": "not-recorded"}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    @app.middleware("http")
    async def state_age(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """Every answer says how old the admin state behind it may be (Kafka away: it grows)."""
        response = await call_next(request)
        admin = getattr(request.app.state, "admin", None)
        age = admin.log.age_s() if admin is not None else None
        if age is not None:
            response.headers[STATE_AGE_HEADER] = f"{age:.1f}"
        return response

    return app
