"""`python -m allmende.streams.meter_worker`: one metering worker process (what `allmende worker` runs).

faust picks its event loop once, when `faust` is first imported (`F_LOOP`), so this module
imports nothing of faust at the top: `main` chooses the loop from the settings, then imports
the app.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys

import structlog

from allmende.core.settings import Settings

_FAUST_LEVELS = {"CRITICAL": "crit", "ERROR": "error", "WARNING": "warn", "INFO": "info", "DEBUG": "debug"}

log = structlog.get_logger(__name__)


def select_loop(loop: str) -> None:
    """Make faust run on `loop` ("uvloop" or "aio"): call before faust is imported.

    faust reads `FAUST_LOOP`, then `F_LOOP`, when it is imported. If something imported it
    already, the env var is too late, so the loop is set through mode's own switch instead (what
    faust's import would have called); either way this must run before any event loop exists.
    """
    os.environ["FAUST_LOOP"] = os.environ["F_LOOP"] = loop
    if "faust" in sys.modules:
        import mode.loop

        if loop == "aio":
            asyncio.set_event_loop_policy(None)  # back to asyncio's own, if uvloop's was set
        mode.loop.use(loop)
    elif loop == "uvloop":
        import uvloop  # noqa: F401  # fail here, with a clear error, if it is missing


def tune_gc() -> None:
    """Fewer cyclic-GC passes over a heap that only grows: call once the app is built.

    The meter keeps every job's state in memory (the table and its decoded objects) and makes
    short-lived objects per event (events, entries, faust's messages); with CPython's default
    thresholds a young collection runs every 700 allocations and the old ones walk that whole
    state. Freezing what exists at start-up and collecting the young generation every 20,000
    allocations cut the worker's CPU per event by about a tenth. Reference counting still frees
    everything acyclic at once; only cycles wait longer. bench/faust_ceiling.py calls it too.
    """
    gc.freeze()
    gc.set_threshold(20_000, 20, 1_000)


def loop_policy() -> str:
    """The module of the asyncio policy in force: `uvloop` or `asyncio.unix_events`."""
    return type(asyncio.get_event_loop_policy()).__module__


def main() -> None:
    settings = Settings()
    select_loop(settings.meter_loop)

    from allmende.core.kafka_topics import ensure_topics
    from allmende.core.logs import configure_logging
    from allmende.core.metrics import serve_metrics
    from allmende.streams.meter import create_app

    configure_logging(settings)
    log.info("meter_loop", loop=settings.meter_loop, policy=loop_policy())
    ensure_topics(settings)
    # faust makes only the last level of its datadir: a fresh ALLMENDE_STATE_DIR may not exist yet.
    settings.meter_data_dir.mkdir(parents=True, exist_ok=True)
    serve_metrics(settings, "meter", settings.meter_metrics_port)
    app = create_app(settings)
    level = _FAUST_LEVELS.get(settings.log_level.upper(), "info")
    # faust's worker command reads its own argv; the banner and web server are not wanted.
    sys.argv = ["allmende-worker", "worker", "--without-web", "-l", level]
    tune_gc()
    app.main()


if __name__ == "__main__":
    main()
