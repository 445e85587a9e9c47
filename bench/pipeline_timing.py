"""Timing a meter worker and the ledger writer until the ledger holds what a bench sent
(bench/ingest.py, bench/ingest_samples.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from allmende.testing.harness import wait_until


def until_complete(
    worker: Any,
    writer: Any,
    complete: Callable[[], bool],
    watch: Callable[[list[int | None]], Any],
    what: str,
) -> tuple[float, str]:
    """Seconds from the worker's "ready" until `complete()`, and what `watch` (a CpuWatch over the
    worker's pid) says of the CPU meanwhile; the worker and the writer are stopped after."""
    try:
        worker.wait_ready(120)
        watching = watch([worker.proc.pid])
        t0 = time.perf_counter()
        wait_until(complete, 1800, what, every=0.01)
        took = time.perf_counter() - t0
        return took, watching.stop()
    finally:
        worker.kill()
        writer.stop()
