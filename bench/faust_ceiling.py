"""A faust agent that does nothing but count: the framework's own ceiling on this machine.

Run by bench/ingest.py as a subprocess: `python bench/faust_ceiling.py BOOTSTRAP TOPIC N`.
Prints `RATE <events/s>` once it has taken N events (faust routes print to its log, stderr).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

import faust

bootstrap, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
app = faust.App(
    f"ceiling-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
    web_enabled=False, consumer_auto_offset_reset="earliest", broker_commit_every=50_000,
    datadir=tempfile.mkdtemp(prefix="bench-ceiling-"),
)  # fmt: skip
source = app.topic(topic, key_serializer="raw", value_serializer="raw")
seen = [0, 0.0]


@app.agent(source)
async def count(stream):  # type: ignore[no-untyped-def]
    async for batch in stream.take_events(5_000, within=0.2):
        if not seen[0]:
            seen[1] = time.perf_counter()
        seen[0] += len(batch)
        if seen[0] >= expected:
            print(f"RATE {seen[0] / (time.perf_counter() - seen[1]):.0f}", flush=True)
            os._exit(0)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "warn"]
    app.main()
