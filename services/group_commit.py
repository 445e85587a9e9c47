"""Group commit onto one Kafka partition: many callers' records, one batch, one acknowledgement.

The admission service answers a request only once its events are acknowledged (what was answered
can be replayed). Sent one by one, each record pays the producer's per-message work (a future,
the accumulator, a sender wake-up) and its own round trip. Here every caller's records wait in a
queue; one task takes all that has queued since its last send, writes them into one record batch,
sends it and waits for its acknowledgement while the next group queues: the cost of a round trip
is shared by everyone waiting, as databases share a log flush.

One batch is in flight at a time, so records reach the partition in the order they were queued.
A failed batch fails every caller in it; none of its records is reported as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder
from prometheus_client import Histogram

Record = tuple[bytes, bytes]  # key, value
# Below Kafka's default message.max.bytes (1 MiB) with room for the batch's own header.
MAX_RECORD_BYTES = 1_000_000

# The wait every answer pays for durability: the floor under the admission latency.
COMMIT_SECONDS = Histogram(
    "allmende_group_commit_seconds",
    "From a group's send to the broker's acknowledgement of all its batches",
    ["topic"],
    buckets=(5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.25, 1.0),
)
COMMIT_CALLERS = Histogram(
    "allmende_group_commit_callers",
    "Callers whose records share one group commit",
    ["topic"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 512),
)


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a failure as seen: the caller may have gone away and would never read it."""
    if not future.cancelled():
        future.exception()


class GroupCommit:
    def __init__(self, producer: AIOKafkaProducer, topic: str, partition: int = 0) -> None:
        self._producer = producer
        self._topic = topic
        self._partition = partition
        self._queue: list[tuple[Sequence[Record], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # sent, for tests and metrics

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"group-commit:{self._topic}")

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (for at most `timeout_s`), then stop."""
        if self._task is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._queue and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def submit(self, records: Sequence[Record]) -> asyncio.Future[None]:
        """Queue `records` now (requests decided in this turn of the loop share a commit); the
        future is done once they are acknowledged, in this order, or failed. Await it shielded:
        cancelling it would not take the records back."""
        if self._task is None:
            raise RuntimeError("the group commit has not started")
        for key, value in records:
            if len(key) + len(value) > MAX_RECORD_BYTES:
                raise ValueError(f"a record of {len(key) + len(value):,} bytes is above {MAX_RECORD_BYTES:,}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self._queue.append((records, future))
        self._wake.set()
        return future

    async def publish(self, records: Sequence[Record]) -> None:
        """Return once `records` are acknowledged, in this order; raise if they were not."""
        # Shielded: a caller that goes away (a dropped connection) must not cancel the batch.
        await asyncio.shield(self.submit(records))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                group, self._queue = self._queue, []
                await self._commit(group)

    async def _commit(self, group: list[tuple[Sequence[Record], asyncio.Future[None]]]) -> None:
        """Send the group in as few batches as fit; each caller hears of the batches its records
        are in (one failed batch fails only the callers with records in it)."""
        started = time.perf_counter()
        batches: list[tuple[BatchBuilder, list[asyncio.Future[None]]]] = []
        batch = self._producer.create_batch()
        callers: list[asyncio.Future[None]] = []
        for records, future in group:
            for key, value in records:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    batches.append((batch, callers))  # full: this record starts the next
                    batch, callers = self._producer.create_batch(), []
                    batch.append(key=key, value=value, timestamp=None)  # the first always fits
                if not callers or callers[-1] is not future:
                    callers.append(future)
        if batch.record_count():
            batches.append((batch, callers))
        failed: dict[int, BaseException] = {}
        acks = []
        for batch, callers in batches:
            try:
                acks.append(await self._producer.send_batch(batch, self._topic, partition=self._partition))
            except Exception as exc:  # not even queued (no metadata, producer stopped)
                acks.append(None)
                failed.update((id(f), exc) for f in callers)
        for ack, (_, callers) in zip(acks, batches, strict=True):
            if ack is None:
                continue
            try:
                await ack
            except Exception as exc:  # the broker refused the batch or went away
                failed.update((id(f), exc) for f in callers)
        self.batches += len(batches)
        COMMIT_SECONDS.labels(topic=self._topic).observe(time.perf_counter() - started)
        COMMIT_CALLERS.labels(topic=self._topic).observe(len(group))
        for _, future in group:
            if future.done():
                continue
            if id(future) in failed:
                future.set_exception(failed[id(future)])
            else:
                future.set_result(None)
