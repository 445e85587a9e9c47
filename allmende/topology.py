"""Which components run in which process: declared here, apart from HTTP.

A deployment runs three kinds of process (`PROCESSES`); the one-box default (`allmende up`) is
one of each, with embedded ClickHouse. The API process runs, besides its routes, the in-process
components its roles name (`API_ROLES`, each a switch in the settings; `allmende serve --role`
picks them). With embedded chDB the ledger writer must be one of them: one process owns the data
directory, so the writer lives beside the API that reads what it writes. With a ClickHouse server,
run writers apart (`allmende writer`, ALLMENDE_WRITER_ENABLED=false on the API side).

`running_components` builds and stops the components of an API process in dependency order;
`create_app` is that process: the HTTP app (`allmende.services.api.app`) with the components in
its lifespan. `MeterProcess` is a meter worker as a child process, for programs that run the
whole pipeline themselves (the simulator's runs, the benchmarks, the tests); `allmende up` starts
its long-lived one detached (`allmende.core.supervisor`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from allmende.core.clickhouse import Database, nice_engine_threads
from allmende.core.dead_letters import RefusedLetters
from allmende.core.gc_pauses import freeze_long_lived, thaw_and_collect
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.logs import configure_logging
from allmende.core.settings import Settings
from allmende.core.supervisor import Child, python_module
from allmende.domain.squatting import SquatRule
from allmende.services.admin_service import AdminService
from allmende.services.admission_service import AdmissionService
from allmende.services.api.app import build_api
from allmende.services.api.auth import TokenBook
from allmende.services.api.dashboard_views import DashboardViews
from allmende.services.api.oidc import IdentityProvider
from allmende.services.burn_alerts import BurnAlerter
from allmende.services.dashboard_queries import DashboardQueries
from allmende.services.web.oidc_signin import PendingSignIns
from allmende.streams.admin_log import AdminLog
from allmende.streams.decision_writer import DecisionWriter
from allmende.streams.fairshare_calculator import FairShareCalculator
from allmende.streams.ledger_writer import LedgerWriter
from allmende.streams.preemption_writer import PreemptionWriter
from allmende.streams.sample_writer import SampleWriter

log = structlog.get_logger(__name__)

# The processes of a deployment, and the command that runs each.
PROCESSES = {
    "api": "allmende serve: the HTTP API and pages, with the in-process roles below",
    "meter": "allmende worker: job events -> ledger entries (faust; any number share the partitions)",
    "writer": "allmende writer: ledger entries -> ClickHouse, when not in the API process",
}
# The API process's roles beside HTTP, and the setting that switches each. Admission spends
# budgets from the fair-share calculator's usage, so admission runs the calculator too.
API_ROLES = {
    "writer": "writer_enabled",
    "fairshare": "fairshare_enabled",
    "admission": "admission_enabled",
    "alerts": "alerts_enabled",
}
RETIRE_EVERY_S = 1.0  # how often admission lets go of jobs past their retention
ADMIN_FOLLOW_S = 0.5  # how stale the dashboards' admin state may be (commands here show at once)
ENGINE_NICE_EVERY_S = 30.0  # chDB grows its pools as it works: new threads are niced at this pace


# `--role reads`: none of the roles, HTTP alone (the ledger's and the pages' reads, from ClickHouse).
READS_ONLY = "reads"


def with_roles(settings: Settings, roles: set[str]) -> Settings:
    """`settings` with exactly `roles` switched on in the API process (`reads` alone: none)."""
    roles = roles - {READS_ONLY}
    unknown = roles - API_ROLES.keys()
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; known: {', '.join([*API_ROLES, READS_ONLY])}")
    return settings.model_copy(update={flag: role in roles for role, flag in API_ROLES.items()})


async def _thaw() -> None:
    found = thaw_and_collect()  # on the loop: a full collection holds the interpreter wherever it runs
    log.info("gc_thawed", unreachable=found)


async def _every(every_s: float, what: str, work: Callable[[], Awaitable[object]]) -> None:
    """Run `work()` every `every_s` seconds; a failure (Kafka or ClickHouse away) waits for the next round."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await work()
        except Exception as exc:
            log.warning(f"{what}_failed", error=repr(exc))


@dataclass
class Components:
    """What one API process runs beside its routes (None: that role is off)."""

    db: Database
    store: LedgerStore
    tokens: TokenBook
    admin_log: AdminLog
    admin: AdminService
    dashboard: DashboardViews
    writer: LedgerWriter | None = None
    decision_writer: DecisionWriter | None = None  # beside the ledger writer: every decision kept
    preemption_writer: PreemptionWriter | None = None  # and every preemption
    sample_writer: SampleWriter | None = None  # and the GPUs' own samples (docs/dcgm.md)
    fairshare: FairShareCalculator | None = None
    admission: AdmissionService | None = None
    alerter: BurnAlerter | None = None
    refused: RefusedLetters | None = None  # the dead-letter topic, followed for admins
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@asynccontextmanager
async def running_components(s: Settings) -> AsyncIterator[Components]:
    """Start the API process's components in dependency order; stop them in reverse."""
    db = Database(s.clickhouse_dsn, s.clickhouse_database)
    await run_in_threadpool(db.migrate)
    # Embedded chDB has one owning process: with the writer here, every posting passes this store.
    store = LedgerStore(db, sole_writer=s.writer_enabled and db.embedded)
    await run_in_threadpool(ensure_topics, s)
    admin_log = AdminLog(s)
    writer = decision_writer = preemption_writer = sample_writer = None
    if s.writer_enabled:
        # One admin log for both: a policy the API publishes is the writer's next price list.
        writer = LedgerWriter(s, store, admin_log=admin_log)
        decision_writer, preemption_writer = DecisionWriter(s, store), PreemptionWriter(s, store)
        sample_writer = SampleWriter(s, store)
    await run_in_threadpool(admin_log.catch_up)
    fairshare = None
    if s.fairshare_enabled or s.admission_enabled:
        fairshare = FairShareCalculator(s, admin_log, db)
        fairshare.start()
    admission = None
    if s.admission_enabled:
        assert fairshare is not None
        admission = AdmissionService(s, admin_log, fairshare)
        await admission.start()
        # Serve once budgets and fair share reflect the whole ledger (admission refuses until
        # then): bounded, so a slow replay still lets the other routes answer.
        await run_in_threadpool(fairshare.ready.wait, s.startup_replay_timeout_s)
    # The writers start once admission can answer: their catch-up (the ledger's reconciliation
    # scans every posting) would otherwise take the cores the replay the scheduler waits for needs.
    for keeper in (writer, decision_writer, preemption_writer, sample_writer):
        if keeper is not None:
            keeper.start()
    admin = AdminService(
        admin_log, store, writer, expiry_grace_s=s.expiry_grace_s,
        held=admission.held_units if admission is not None else None,
    )  # fmt: skip
    dashboard = DashboardViews(
        admin, DashboardQueries(db), SquatRule.of(s.squat_max_utilization, s.squat_grace_s),
        admission=admission, fairshare=fairshare, overrun_grace_s=s.overrun_grace_s,
        capacity_lookback_s=s.capacity_lookback_s,
    )  # fmt: skip
    alerter = None
    if s.alerts_enabled:  # burn warnings and the per-project gauges, from the pages' figures
        alerter = BurnAlerter(
            s, dashboard.project_burns, capacity=dashboard.over_capacity, dispute=admin.dispute_over_capacity,
            squatting=dashboard.squatting_now if s.squat_alerts else None,
        )  # fmt: skip
        await alerter.start()
    loops: list[Coroutine[Any, Any, None]] = [
        # Expire allocations whose period has ended; the events' ids make a repeat harmless.
        _every(s.expiry_check_s, "expiry", lambda: run_in_threadpool(admin.expire_due)),
        # Keep the admin state the dashboards read caught up with the log.
        _every(ADMIN_FOLLOW_S, "admin_follow", lambda: run_in_threadpool(admin_log.read_state)),
        # Collect what the frozen generation holds in dead cycles (allmende/core/gc_pauses.py).
        _every(s.gc_thaw_every_s, "gc_thaw", _thaw),
    ]
    if db.embedded:  # chDB's merges run in this process: behind the requests, not beside them
        loops.append(
            _every(ENGINE_NICE_EVERY_S, "nice_engine", lambda: run_in_threadpool(nice_engine_threads))
        )
    if admission is not None:
        # Often, so releases come in small batches instead of one burst that would stall the
        # decisions waiting behind it.
        loops.append(_every(0.25, "hold_release", admission.release_due))
        # Ended jobs leave memory once their retention has passed (a heap: costs what is due).
        # Not while the decision history is behind: a decision leaves memory once the store has it
        # (with a ClickHouse server, `allmende writer` keeps the history; its lag is not seen here).
        through = decision_writer.decided_through if decision_writer is not None else None
        loops.append(
            _every(RETIRE_EVERY_S, "retire", lambda: run_in_threadpool(admission.retire_ended, through))
        )
        if s.checkpoint_every_s > 0:  # a start loads the latest and reads only the log's tail
            loops.append(
                _every(s.checkpoint_every_s, "checkpoint", lambda: run_in_threadpool(admission.checkpoint))
            )
    components = Components(
        db=db, store=store, tokens=TokenBook(s), admin_log=admin_log, admin=admin, dashboard=dashboard,
        writer=writer, decision_writer=decision_writer, preemption_writer=preemption_writer,
        sample_writer=sample_writer,
        fairshare=fairshare, admission=admission,
        alerter=alerter,
        refused=RefusedLetters(s), tasks=[asyncio.create_task(loop) for loop in loops],
    )  # fmt: skip
    log.info("api_started", clickhouse=db.dsn, database=db.name, writer=s.writer_enabled)
    freeze_long_lived()  # the replayed projections: out of every later full collection
    sys.setswitchinterval(s.gil_switch_interval_us / 1_000_000)
    try:
        yield components
    finally:
        for task in components.tasks:
            task.cancel()
        if alerter is not None:
            await alerter.stop()
        if admission is not None:
            await admission.stop()
        if fairshare is not None:
            await run_in_threadpool(fairshare.stop)
        if writer is not None:
            await run_in_threadpool(writer.stop)
        for keeper in (decision_writer, preemption_writer, sample_writer):
            if keeper is not None:
                await run_in_threadpool(keeper.stop)
        await run_in_threadpool(admin_log.close)
        if components.refused is not None:
            await run_in_threadpool(components.refused.close)


def run_writer(s: Settings) -> None:
    """The standalone ledger writer process (`allmende writer`), until SIGTERM or SIGINT."""
    import signal
    import threading

    from allmende.core.metrics import serve_metrics

    db = Database(s.clickhouse_dsn, s.clickhouse_database)
    db.migrate()
    ensure_topics(s)
    serve_metrics(s, "writer", s.writer_metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    store = LedgerStore(db)
    histories = (DecisionWriter(s, store), PreemptionWriter(s, store), SampleWriter(s, store))
    for history in histories:
        history.start()
    try:
        LedgerWriter(s, store).run_forever(stop)
    finally:
        for history in histories:
            history.stop()


def meter_env(settings: Settings) -> dict[str, str]:
    """A child's environment that makes it read and write `settings`' topics and meter state."""
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "ALLMENDE_TOPIC_PREFIX": settings.topic_prefix,
        "ALLMENDE_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "ALLMENDE_METER_APP_ID": settings.meter_app_id,
        "ALLMENDE_METER_DATA_DIR": str(settings.meter_data_dir),
        "ALLMENDE_CLOCK_SKEW_S": str(settings.clock_skew_s),
        "ALLMENDE_ENDED_JOB_RETENTION_S": str(settings.ended_job_retention_s),
        "ALLMENDE_LOG_LEVEL": "INFO",
        "ALLMENDE_LOG_JSON": "false",
    }


class MeterProcess(Child):
    """One meter worker (`python -m allmende.streams.meter_worker`), its output in a log of its own."""

    def __init__(self, settings: Settings, log_dir: Path, name: str = "meter", metrics_port: int = 0) -> None:
        self.metrics_port = metrics_port  # 0: none (several workers of one run would share one)
        super().__init__(
            python_module("allmende.streams.meter_worker"),
            log_dir / f"{name}-{time.monotonic_ns()}.log",
            {**meter_env(settings), "ALLMENDE_METER_METRICS_PORT": str(metrics_port)},
        )

    def ready(self) -> bool:
        return b"Worker ready" in self.log_path.read_bytes()

    def wait_ready(self, timeout: float = 90.0) -> None:
        self.wait_for(self.ready, timeout, "meter worker")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API process: the HTTP app, with its components started and stopped in its lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings or Settings()
        configure_logging(s)
        async with running_components(s) as components:
            # The routes' dependencies (services/api/deps.py) read them from the app's state.
            for name in (
                "store",
                "tokens",
                "writer",
                "decision_writer",
                "preemption_writer",
                "fairshare",
                "admission",
                "admin",
                "dashboard",
                "alerter",
                "refused",
            ):
                setattr(app.state, name, getattr(components, name))
            app.state.ticket_key, app.state.ticket_ttl_s = s.ticket_key(), s.admission_ticket_ttl_s
            # Sign-in through the organisation's IdP (docs/auth.md): its keys fetched when first needed.
            app.state.settings = s
            app.state.idp = IdentityProvider(s) if s.oidc_issuer else None
            app.state.pending_signins = PendingSignIns()
            yield

    return build_api(lifespan)
