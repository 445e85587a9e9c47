"""`python -m streams.worker`: one metering worker process (what `allmende worker` runs)."""

from __future__ import annotations

import sys

from allmende.kafka_topics import ensure_topics
from allmende.logs import configure_logging
from allmende.metrics_server import serve_metrics
from allmende.settings import Settings
from streams.app import create_app

_FAUST_LEVELS = {"CRITICAL": "crit", "ERROR": "error", "WARNING": "warn", "INFO": "info", "DEBUG": "debug"}


def main() -> None:
    settings = Settings()
    configure_logging(settings)
    ensure_topics(settings)
    serve_metrics(settings, "meter", settings.meter_metrics_port)
    app = create_app(settings)
    level = _FAUST_LEVELS.get(settings.log_level.upper(), "info")
    # faust's worker command reads its own argv; the banner and web server are not wanted.
    sys.argv = ["allmende-worker", "worker", "--without-web", "-l", level]
    app.main()


if __name__ == "__main__":
    main()
