"""Prometheus `/metrics` for the processes without an HTTP API: meter workers, standalone writers.

The API process serves `/metrics` on its own port (with the embedded writer's metrics in it).
"""

from __future__ import annotations

import structlog
from prometheus_client import start_http_server

from allmende.core.settings import Settings

log = structlog.get_logger(__name__)


def serve_metrics(settings: Settings, process: str, port: int) -> int | None:
    """Serve this process's metrics on ALLMENDE_METRICS_HOST:`port` (0: not at all); the port is
    returned. A port already taken (a second worker on the host) is a warning, not a reason to
    stop working: give each process its own port."""
    if not port:
        return None
    try:
        start_http_server(port, addr=settings.metrics_host)
    except OSError as exc:
        log.warning("metrics_not_served", process=process, port=port, error=str(exc),
                    hint=f"set ALLMENDE_{process.upper()}_METRICS_PORT per process")  # fmt: skip
        return None
    log.info("metrics_served", process=process, url=f"http://{settings.metrics_host}:{port}/metrics")
    return port
