"""The ledger API process: read-side routes, and (embedded ClickHouse) the ledger writer.

With chDB one process owns the data directory, so the writer thread lives here, beside the API
that reads what it writes. With a ClickHouse server, run writers and API processes apart
(ALLMENDE_WRITER_ENABLED=false on the API side).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app
from starlette.exceptions import HTTPException as StarletteHTTPException

from allmende import __version__
from allmende.core.clickhouse import Database
from allmende.core.gc_pauses import freeze_long_lived
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.logs import configure_logging
from allmende.core.settings import Settings
from allmende.domain.squatting import SquatRule
from allmende.services.admin_service import AdminService
from allmende.services.admission_service import AdmissionService
from allmende.services.api.auth import TokenBook
from allmende.services.api.dashboard_views import DashboardViews
from allmende.services.api.deps import Store, Writer
from allmende.services.api.models import Health
from allmende.services.api.routes_admin import router as admin_router
from allmende.services.api.routes_admission import router as admission_router
from allmende.services.api.routes_balance import router as balance_router
from allmende.services.api.routes_dashboard import router as dashboard_router
from allmende.services.api.routes_fairshare import router as fairshare_router
from allmende.services.api.routes_usage import router as usage_router
from allmende.services.burn_alerts import BurnAlerter
from allmende.services.dashboard_queries import DashboardQueries
from allmende.services.web.routes import router as web_router
from allmende.streams.admin_log import AdminLog
from allmende.streams.fairshare_calculator import FairShareCalculator
from allmende.streams.ledger_writer import LedgerWriter

log = structlog.get_logger(__name__)


async def _expire_periodically(service: AdminService, every_s: float) -> None:
    """Expire allocations whose period has ended; the events' ids make a repeat harmless."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await run_in_threadpool(service.expire_due)
        except Exception as exc:  # Kafka or ClickHouse away: try again next round
            log.warning("expiry_failed", error=repr(exc))


async def _follow_admin_log(admin_log: AdminLog, every_s: float) -> None:
    """Keep the admin state the dashboards read (`DashboardViews.state`) caught up with the log."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await run_in_threadpool(admin_log.catch_up)
        except Exception as exc:  # Kafka away: the pages show the state as last read meanwhile
            log.warning("admin_follow_failed", error=repr(exc))


async def _release_periodically(service: AdmissionService, every_s: float = 0.25) -> None:
    """Release the holds of jobs that ended or never started; often, so releases come in small
    batches instead of one burst that would stall the decisions waiting behind it. Decisions the
    log did not take (Kafka away) are sent again first."""
    while True:
        await asyncio.sleep(every_s)
        try:
            if failed := await service.record_unrecorded():
                log.warning("admission_decisions_unrecorded", jobs=failed)
            await service.release_due()
        except Exception as exc:  # Kafka away: the next round releases them
            log.warning("hold_release_failed", error=repr(exc))


ADMIN_FOLLOW_S = 0.5  # how stale the dashboards' admin state may be (commands here show at once)


def create_app(settings: Settings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings or Settings()
        configure_logging(s)
        db = Database(s.clickhouse_dsn, s.clickhouse_database)
        await run_in_threadpool(db.migrate)
        # Embedded chDB has one owning process: with the writer here, every posting passes this store.
        app.state.store = LedgerStore(db, sole_writer=s.writer_enabled and db.embedded)
        app.state.tokens = TokenBook(s)
        await run_in_threadpool(ensure_topics, s)
        admin_log = AdminLog(s)
        app.state.writer = None
        if s.writer_enabled:
            # One admin log for both: a policy the API publishes is the writer's next price list.
            app.state.writer = LedgerWriter(s, app.state.store, admin_log=admin_log)
            app.state.writer.start()
        await run_in_threadpool(admin_log.catch_up)
        app.state.fairshare = None
        # Admission spends budgets from the calculator's in-memory usage: it needs it running.
        if s.fairshare_enabled or s.admission_enabled:
            app.state.fairshare = FairShareCalculator(s, admin_log, db)
            app.state.fairshare.start()
        app.state.admission = None
        if s.admission_enabled:
            app.state.admission = AdmissionService(s, admin_log, app.state.fairshare)
            await app.state.admission.start()
            # Serve once budgets and fair share reflect the whole ledger (admission refuses until
            # then): bounded, so a slow replay still lets the other routes answer.
            await run_in_threadpool(app.state.fairshare.ready.wait, s.startup_replay_timeout_s)
        admission = app.state.admission
        app.state.admin = AdminService(
            admin_log, app.state.store, app.state.writer, expiry_grace_s=s.expiry_grace_s,
            held=admission.held_units if admission is not None else None,
        )  # fmt: skip
        app.state.dashboard = DashboardViews(
            app.state.admin, DashboardQueries(db), SquatRule.of(s.squat_max_utilization, s.squat_grace_s),
            admission=admission, fairshare=app.state.fairshare,
        )  # fmt: skip
        app.state.alerter = None
        if s.alerts_enabled:  # burn warnings and the per-project gauges, from the pages' figures
            app.state.alerter = BurnAlerter(s, app.state.dashboard.project_burns)
            await app.state.alerter.start()
        tasks = [
            asyncio.create_task(_expire_periodically(app.state.admin, s.expiry_check_s)),
            asyncio.create_task(_follow_admin_log(admin_log, ADMIN_FOLLOW_S)),
        ]
        if admission is not None:
            tasks.append(asyncio.create_task(_release_periodically(admission)))
        log.info("api_started", clickhouse=db.dsn, database=db.name, writer=s.writer_enabled)
        freeze_long_lived()  # the replayed projections: out of every later full collection
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if app.state.alerter is not None:
                await app.state.alerter.stop()
            if admission is not None:
                await admission.stop()
            if app.state.fairshare is not None:
                await run_in_threadpool(app.state.fairshare.stop)
            if app.state.writer is not None:
                await run_in_threadpool(app.state.writer.stop)
            await run_in_threadpool(admin_log.close)

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
    app.include_router(fairshare_router)
    app.include_router(dashboard_router)
    app.include_router(web_router)
    app.mount("/metrics", make_asgi_app())

    @app.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz(request: Request, store: Store, writer: Writer) -> Health | JSONResponse:
        try:
            await run_in_threadpool(store.db.rows, "SELECT 1")
            clickhouse = "ok"
        except Exception as exc:  # health must answer, whatever broke
            clickhouse = f"error: {exc}"
        writer_state = "disabled" if writer is None else (writer.last_error or "running")
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

    return app
