"""Group commit onto one Kafka partition: many callers' records, one batch, one acknowledgement.

The admission service answers a request only once its events are acknowledged (what was answered
can be replayed). Sent one by one, each record pays the producer's per-message work (a future,
the accumulator, a sender wake-up) and its own round trip. Here every caller's records wait in a
queue; one task takes all that has queued since its last send, writes them into one record batch,
sends it and waits for its acknowledgement while the next group queues: the cost of a round trip
is shared by everyone waiting, as databases share a log flush.

One batch is in flight at a time, so records reach the partition in the order they were queued.
A failed batch fails every caller in it; none of its records is reported as written.

With a transactional producer (admission's hot standby) each group is one transaction: all of it
is committed or none (read_committed readers never see an aborted group), and a producer fenced
by a newer one with its transactional id (a new leader) fails every caller from then on: the
commit is broken, and its owner hears of it (`on_broken`) to step down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiokafka.producer.sender
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder

from allmende.core.metrics import GROUP_COMMIT, GROUP_COMMIT_CALLERS, GROUP_COMMIT_SECONDS, register

Header = tuple[str, bytes]
Record = tuple[bytes, bytes] | tuple[bytes, bytes, Sequence[Header]]  # key, value[, headers]
# Below Kafka's default message.max.bytes (1 MiB) with room for the batch's own header.
MAX_RECORD_BYTES = 1_000_000
ABORT_TIMEOUT_S = 5.0  # an abort Kafka does not answer: the producer is given up (broken)
# Between two transactions the broker writes the last one's markers; the next one's partition is
# refused (CONCURRENT_TRANSACTIONS) until then. aiokafka waits 20 ms before asking again; the
# markers take a millisecond or two here, so every group commit would wait ~20 ms for nothing.
aiokafka.producer.sender.BACKOFF_OVERRIDE = 0.002


# Each caller's records, and its future: done with the broker's append time (ms; None when the
# topic keeps the producer's time) once they are acknowledged.
Group = list[tuple[Sequence[Record], asyncio.Future[int | None]]]


def fill_batches(
    create_batch: Callable[[], BatchBuilder], group: Group
) -> list[tuple[BatchBuilder, list[asyncio.Future[int | None]]]]:
    """The group's records in as few batches as fit, in order, each with the callers in it.

    A caller's records never straddle two batches unless they are more than one batch holds:
    one batch may be acknowledged while the next fails, and a decision recorded without its
    hold would replay as an admit that holds nothing."""
    batches: list[tuple[BatchBuilder, list[asyncio.Future[int | None]]]] = []
    batch, inside, callers = create_batch(), list[Record](), list[asyncio.Future[int | None]]()
    for records, future in group:
        taken = 0
        for record in records:
            if not _append(batch, record):
                break
            taken += 1
        if taken == len(records):
            inside.extend(records)
            callers.append(future)
            continue
        if inside:  # full before this caller's last record: the batch goes without any of it
            if taken:
                batch = create_batch()
                for record in inside:
                    _append(batch, record)
            batches.append((batch, callers))
            batch, inside, callers, taken = create_batch(), [], [], 0
        for record in records[taken:]:  # from an empty batch, which takes any first record
            if not _append(batch, record):
                batches.append((batch, [*callers, future]))  # more than one batch holds: split
                batch, inside, callers = create_batch(), [], []
                _append(batch, record)
            inside.append(record)
        callers.append(future)
    if callers:
        batches.append((batch, callers))
    return batches


def _append(batch: BatchBuilder, record: Record) -> bool:
    """Add `record` to `batch`; False when it is full."""
    key, value, *rest = record
    headers = rest[0] if rest else []
    return batch.append(key=key, value=value, timestamp=None, headers=headers) is not None


def _fail(group: Group, exc: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)


def _retrieved(future: asyncio.Future[int | None]) -> None:
    """Mark a failure as seen: the caller may have gone away and would never read it."""
    if not future.cancelled():
        future.exception()


class GroupCommit:
    def __init__(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        partition: int = 0,
        transactional: bool = False,
        on_broken: Callable[[BaseException], None] | None = None,
    ) -> None:
        register(GROUP_COMMIT)
        self._producer = producer
        self._topic = topic
        self._partition = partition
        self._transactional = transactional
        self._on_broken = on_broken
        self.broken: BaseException | None = None  # transactional: fenced, or an abort not answered
        self._queue: Group = []
        self._inflight: Group = []  # the group being committed
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # sent, for tests and metrics
        # The offset after the last record the broker acknowledged: what a checkpoint of a state
        # that folds every acknowledged record covers (None: nothing acknowledged yet).
        self.acked_end: int | None = None

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
        # Whoever waits on what was in flight or still queued hears it, instead of waiting forever.
        left, self._inflight, self._queue = self._inflight + self._queue, [], []
        _fail(left, RuntimeError("the group commit stopped before the broker acknowledged"))

    def submit(self, records: Sequence[Record]) -> asyncio.Future[int | None]:
        """Queue `records` now (requests decided in this turn of the loop share a commit); the
        future is done once they are acknowledged, in this order (with the broker's append time
        of their batch), or failed. Await it shielded:
        cancelling it would not take the records back."""
        if self._task is None:
            raise RuntimeError("the group commit has not started")
        if self.broken is not None:
            raise RuntimeError(f"the group commit is broken: {self.broken!r}")
        for key, value, *_ in records:
            if len(key) + len(value) > MAX_RECORD_BYTES:
                raise ValueError(f"a record of {len(key) + len(value):,} bytes is above {MAX_RECORD_BYTES:,}")
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
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
                self._inflight = group
                try:
                    await (self._commit_atomically(group) if self._transactional else self._commit(group))
                except Exception as exc:  # a bug, not the broker: fail the group, keep committing
                    _fail(group, exc)
                self._inflight = []

    async def _commit_atomically(self, group: Group) -> None:
        """The group as one transaction: every caller hears that it is committed, or that it is not."""
        if self.broken is not None:
            _fail(group, RuntimeError(f"the group commit is broken: {self.broken!r}"))
            return
        started = time.perf_counter()
        batches = fill_batches(self._producer.create_batch, group)
        producer = self._producer
        try:
            await producer.begin_transaction()
            acks = [await producer.send_batch(b, self._topic, partition=self._partition) for b, _ in batches]
            appended = [await ack for ack in acks]
            # Unanswered (Kafka away mid-commit), its outcome is unknown: given up as broken.
            await asyncio.wait_for(producer.commit_transaction(), ABORT_TIMEOUT_S)
        except Exception as exc:
            _fail(group, exc)
            await self._abandon(exc)
            return
        stamps = [
            self._acked(metadata, batch) for metadata, (batch, _) in zip(appended, batches, strict=True)
        ]
        self._counted(started, len(batches), len(group))
        for stamped, (_, callers) in zip(stamps, batches, strict=True):
            for future in callers:  # a caller split over batches: the last one's time
                if not future.done():
                    future.set_result(stamped)

    def _acked(self, metadata: Any, batch: BatchBuilder) -> int | None:
        """Note a batch the broker acknowledged; its append time (None: the producer's time)."""
        end = metadata.offset + batch.record_count()
        self.acked_end = end if self.acked_end is None else max(self.acked_end, end)
        return metadata.timestamp if metadata.timestamp_type == 1 else None  # LogAppendTime

    def _counted(self, started: float, batches: int, callers: int) -> None:
        self.batches += batches
        GROUP_COMMIT_SECONDS.labels(topic=self._topic).observe(time.perf_counter() - started)
        GROUP_COMMIT_CALLERS.labels(topic=self._topic).observe(callers)

    async def _abandon(self, exc: BaseException) -> None:
        """Abort the failed transaction; fenced, or the abort unanswered, the producer is done for."""
        producer = self._producer
        txn = producer._txn_manager  # aiokafka exposes no state of its own: fatal means fenced
        if txn is not None and not txn.is_fatal_error():
            try:
                await asyncio.wait_for(producer.abort_transaction(), ABORT_TIMEOUT_S)
                return
            except Exception as abort_exc:
                exc = abort_exc
        self.broken = exc
        if self._on_broken is not None:
            self._on_broken(exc)

    async def _commit(self, group: Group) -> None:
        """Send the group in as few batches as fit; each caller hears of the batches its records
        are in (one failed batch fails only the callers with records in it)."""
        started = time.perf_counter()
        batches = fill_batches(self._producer.create_batch, group)
        failed: dict[int, BaseException] = {}
        appended: dict[int, int | None] = {}
        acks = []
        for batch, callers in batches:
            try:
                acks.append(await self._producer.send_batch(batch, self._topic, partition=self._partition))
            except Exception as exc:  # not even queued (no metadata, producer stopped)
                acks.append(None)
                failed.update((id(f), exc) for f in callers)
        for ack, (ack_batch, callers) in zip(acks, batches, strict=True):
            if ack is None:
                continue
            try:
                metadata = await ack
            except Exception as exc:  # the broker refused the batch or went away
                failed.update((id(f), exc) for f in callers)
                continue
            stamped = self._acked(metadata, ack_batch)
            for f in callers:  # a caller split over batches: the last one's time
                appended[id(f)] = stamped
        self._counted(started, len(batches), len(group))
        for _, future in group:
            if future.done():
                continue
            if id(future) in failed:
                future.set_exception(failed[id(future)])
            else:
                future.set_result(appended.get(id(future)))
