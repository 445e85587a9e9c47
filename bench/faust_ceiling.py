"""A faust agent that does nothing but count: the framework's own ceiling on this machine.

Run by bench/ingest.py as a subprocess: `python bench/faust_ceiling.py BOOTSTRAP TOPIC N [LOOP]`.
It reads like the meter worker does: the same event loop (LOOP, "uvloop" or "aio", chosen before
faust is imported, as streams/worker.py does), the same consumer settings and the same batches
(streams/app.py), so the bench compares like with like. Prints `LOOP <asyncio policy module>` and
`RATE <events/s>` once it has taken N events (faust routes print to its log, stderr).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

from allmende.streams.meter_worker import loop_policy, select_loop, tune_gc  # imports no faust

bootstrap, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
select_loop(sys.argv[4] if len(sys.argv) > 4 else "uvloop")

import faust  # noqa: E402

from allmende.streams.meter import BATCH_MAX, BATCH_WITHIN_S, stream_settings  # noqa: E402

app = faust.App(
    f"ceiling-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
    web_enabled=False, datadir=tempfile.mkdtemp(prefix="bench-ceiling-"), **stream_settings(),
)  # fmt: skip
source = app.topic(topic, key_serializer="raw", value_serializer="raw")
seen = [0, 0.0]


@app.agent(source)
async def count(stream):  # type: ignore[no-untyped-def]
    async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
        if not seen[0]:
            seen[1] = time.perf_counter()
            print(f"LOOP {loop_policy()}", flush=True)
        seen[0] += len(batch)
        if seen[0] >= expected:
            print(f"RATE {seen[0] / (time.perf_counter() - seen[1]):.0f}", flush=True)
            os._exit(0)


if __name__ == "__main__":
    tune_gc()  # as streams/worker.py does before its app runs
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "warn"]
    app.main()
