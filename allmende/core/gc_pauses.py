"""Garbage-collector pauses: keep long-lived state out of full collections, and measure them.

The API holds its projections in memory (decisions, holds, jobs, usage): hundreds of thousands of
objects that live for the process's lifetime. CPython's full collection walks all of them, and
with the default thresholds one ran every second or two under load, each a pause of 0.1-0.4 s on
every request waiting behind it (seen as the admission benchmark's p99). After each full
collection the survivors are frozen (`gc.freeze`): later collections walk only what was made
since. Reference counting still frees frozen objects; only a reference cycle among them, formed
after freezing, is never collected: objects in flight at a full collection (a request's, a
batch's) are frozen with the long-lived state, and those in cycles stay when they die. So every
`thaw_every_s` (`thaw_and_collect`) everything is unfrozen, collected once in full (one long pause,
a few requests in ten minutes: nowhere near the p99) and frozen again: what leaked is bounded by
what ten minutes can freeze, not by the process's history.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from allmende.core.metrics import GC, GC_PAUSE_SECONDS, register

_started: list[float] = [0.0]
_installed: list[bool] = [False]


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    generation = info["generation"]
    GC_PAUSE_SECONDS.labels(generation=str(generation)).observe(time.perf_counter() - _started[0])
    if generation == 2:
        gc.freeze()  # the survivors of a full collection are the long-lived state


def freeze_long_lived() -> None:
    """Collect once, freeze what survives (the start-up state), and do so after every full
    collection from now on. Idempotent: a second call only collects and freezes again."""
    gc.collect()
    gc.freeze()
    if not _installed[0]:
        register(GC)
        gc.callbacks.append(_on_collection)
        _installed[0] = True


def thaw_and_collect() -> int:
    """Unfreeze, collect everything once (the cycles frozen since the last time), freeze again.
    Returns what the collection found unreachable."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
