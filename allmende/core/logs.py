"""Structured logs: JSON lines by default (ALLMENDE_LOG_JSON=false for a console format)."""

from __future__ import annotations

import logging
import sys
import threading

import structlog

from allmende.core.settings import Settings


class _StderrLogger:
    """Writes each line to the *current* ``sys.stderr``.

    structlog's PrintLogger keeps the stream it was built with; when that stream is a
    test runner's capture (or a CLI runner's) that is closed afterwards, every later log
    line in the process fails with "I/O operation on closed file".
    """

    _lock = threading.Lock()  # one line at a time, whatever thread logs

    def msg(self, message: str) -> None:
        with self._lock:
            stream = sys.stderr
            stream.write(message + "\n")
            stream.flush()

    log = debug = info = warning = warn = error = err = critical = fatal = exception = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(settings: Settings) -> None:
    level = logging.getLevelName(settings.log_level.upper())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if settings.log_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level if isinstance(level, int) else 20),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )
