"""Reading topics the way every projection here does: from the start, to the end, then following.

A projection rebuilt by replay assigns itself partitions (no consumer group: it owns no offsets,
its state is rebuilt) and reads from the beginning. It knows it has caught up when its position
reaches the end offsets; asking for them is a broker round trip, so `LagWatch` asks at most
once a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from allmende.core.checkpoints import Offsets, offsets_problem


def wait_for_partitions(consumer: KafkaConsumer, topic: str, timeout: float = 60.0) -> list[TopicPartition]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = consumer.partitions_for_topic(topic)
        if found:
            return [TopicPartition(topic, p) for p in sorted(found)]
        time.sleep(0.5)
    raise RuntimeError(f"topic {topic} has no partitions (not created?)")


def replaying_consumer(
    bootstrap: str, source: str | Sequence[TopicPartition], **config: Any
) -> tuple[KafkaConsumer, list[TopicPartition]]:
    """A consumer assigned the partitions (or every partition of a topic), at their beginning,
    committing nothing; and the partitions. It reads what is committed only: the admission log's
    leader writes in transactions, and an aborted one (its answer was 503) must never be folded."""
    config = {"isolation_level": "read_committed", **config}
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **config)
    partitions = wait_for_partitions(consumer, source) if isinstance(source, str) else list(source)
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    return consumer, partitions


def offsets_misfit(
    consumer: KafkaConsumer, partitions: Sequence[TopicPartition], offsets: Offsets, timeout_ms: int = 30_000
) -> str | None:
    """Why a checkpoint's offsets cannot resume these partitions as they are now (None: they can)."""
    found: tuple[Offsets, Offsets] = ({}, {})
    for held, asked in zip(found, (consumer.beginning_offsets, consumer.end_offsets), strict=True):
        for tp, offset in asked(list(partitions), timeout_ms).items():
            held.setdefault(tp.topic, {})[tp.partition] = offset
    return offsets_problem(offsets, *found)


def resume(
    consumer: KafkaConsumer,
    partitions: Sequence[TopicPartition],
    offsets: Mapping[int, int],
    timeout_ms: int = 30_000,
) -> str | None:
    """Seek each partition to its offset in `offsets` (a checkpoint's: the next record to read),
    if they fit the partitions as they are now; else leave the consumer at the beginning and say
    why (the caller replays everything)."""
    topic = partitions[0].topic if partitions else ""
    problem = offsets_misfit(consumer, partitions, {topic: dict(offsets)}, timeout_ms)
    if problem is None:
        for tp in partitions:
            consumer.seek(tp, offsets[tp.partition])
    return problem


def read_to_end(
    consumer: KafkaConsumer, tp: TopicPartition, handle: Callable[[Any], None], timeout: float = 30.0
) -> int:
    """Hand every record up to the partition's end (as it is now) to `handle`; returns how many.
    Kafka away: TimeoutError (or the client's error) once `timeout` passes without a record, not
    after the client's own minutes; a long log read at a start goes on as long as records come."""
    deadline = time.monotonic() + timeout

    def left_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    end = consumer.end_offsets([tp], timeout_ms=left_ms())[tp]
    count = 0
    while consumer.position(tp, timeout_ms=left_ms()) < end:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{tp.topic}[{tp.partition}] not read to offset {end}: nothing came for {timeout:.0f}s"
            )
        for records in consumer.poll(timeout_ms=min(500, left_ms())).values():
            for record in records:
                handle(record)
                count += 1
            deadline = time.monotonic() + timeout  # Kafka answers: the wait starts again
    return count


LOG_APPEND_TIME = 1  # a record's timestamp type when the broker set it on append
# The record header a writer that answers requests puts on what it appends: the latest broker
# append time (UTC ms, decimal) at which the record counts. Its writer answered 503 past it, so a
# copy a producer delivered later (once Kafka was back) is void. A header, not a field of the
# event: a deliberate copy of the events (a replay, a restore) carries the value bytes only.
RECORD_BY = "allmende-record-by"


def record_by_header(record_by: int) -> list[tuple[str, bytes]]:
    return [(RECORD_BY, str(record_by).encode())]


def appended_late(record: Any) -> bool:
    """The record reached the log after the instant it had to be recorded by (its `RECORD_BY`
    header): void. Only a topic whose timestamps the broker sets on append
    (`message.timestamp.type=LogAppendTime`) can tell; others count every record."""
    if record.timestamp_type != LOG_APPEND_TIME:
        return False
    for name, value in record.headers or ():
        if name == RECORD_BY:
            return bool(record.timestamp > int(value))
    return False


class LagWatch:
    """How far a consumer is behind the end of its partitions, checked at most every `every_s`."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.caught_up = threading.Event()
        self._checked_at = 0.0

    def check(
        self, consumer: KafkaConsumer, partitions: Sequence[TopicPartition], force: bool = False
    ) -> dict[TopicPartition, int] | None:
        """Records behind per partition, or None when it was checked less than `every_s` ago
        (unless forced)."""
        now = time.monotonic()
        if (now - self._checked_at < self.every_s and not force) or not partitions:
            return None
        self._checked_at = now
        behind = {
            tp: max(0, end - consumer.position(tp))
            for tp, end in consumer.end_offsets(list(partitions)).items()
        }
        if any(behind.values()):
            self.caught_up.clear()
        else:
            self.caught_up.set()
        return behind
