"""Group commit on a real broker: every caller's records land once, in order, in shared batches."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from kafka import TopicPartition
from prometheus_client import REGISTRY

from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.kafka_topics import ensure_topics
from allmende.core.settings import Settings
from allmende.services.group_commit import GroupCommit

pytestmark = pytest.mark.integration

CALLERS = 200
RECORDS_EACH = 3
PADDING = b"p" * 2000  # about a decision's size


def _read(settings: Settings) -> list[tuple[bytes, bytes]]:
    tp = TopicPartition(settings.admission_topic, 0)
    consumer, _ = replaying_consumer(settings.kafka_bootstrap_servers, [tp])
    seen: list[tuple[bytes, bytes]] = []
    try:
        read_to_end(consumer, tp, lambda record: seen.append((record.key, record.value)))
    finally:
        consumer.close(autocommit=False)
    return seen


async def _publish_concurrently(settings: Settings) -> tuple[int, list[BaseException | None]]:
    # Small batches, so that a group spans several of them.
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True,
        max_batch_size=64 * 1024,
    )  # fmt: skip
    await producer.start()
    log = GroupCommit(producer, settings.admission_topic)
    log.start()
    try:

        async def caller(n: int) -> None:
            await asyncio.sleep(0)  # let the others queue too
            records = [(f"job-{n}".encode(), f"{n}:{i}:".encode() + PADDING) for i in range(RECORDS_EACH)]
            if n == CALLERS - 1:  # one caller's record is too large for Kafka: it alone must hear so
                records = [(b"huge", b"x" * 2 * 1024 * 1024)]
            await log.publish(records)

        outcomes = await asyncio.gather(*(caller(n) for n in range(CALLERS)), return_exceptions=True)
        await log.publish([(b"after", b"after")])  # the commit goes on after a failed group
        return log.batches, [o if isinstance(o, BaseException) else None for o in outcomes]
    finally:
        await log.stop()
        await producer.stop()


def test_concurrent_callers_share_batches_and_each_sees_its_records_once_in_order(settings: Settings) -> None:
    ensure_topics(settings)
    batches, outcomes = asyncio.run(_publish_concurrently(settings))
    failed = [n for n, o in enumerate(outcomes) if o is not None]
    assert failed == [CALLERS - 1]
    assert isinstance(outcomes[-1], ValueError) and "bytes is above" in str(outcomes[-1])

    seen = _read(settings)
    values = [v.decode().removesuffix(PADDING.decode()) for _, v in seen]
    good = [v.removesuffix(":") for v in values if v != "after"]
    assert len(good) == len(set(good))
    per_caller: dict[int, list[int]] = {}
    for value in good:
        n, i = value.split(":")
        per_caller.setdefault(int(n), []).append(int(i))
    assert set(per_caller) == set(range(CALLERS - 1))
    assert all(order == list(range(RECORDS_EACH)) for order in per_caller.values())
    assert values[-1] == "after"
    assert all(key == f"job-{v.split(':')[0]}".encode() for (key, _), v in zip(seen, good, strict=False))
    # Shared: far fewer batches than callers (each caller alone would have needed its own).
    assert batches < CALLERS // 4, batches
    # The metrics count every caller that queued (all but the refused one, plus "after") once.
    labels = {"topic": settings.admission_topic}
    assert REGISTRY.get_sample_value("allmende_group_commit_callers_sum", labels) == CALLERS
    commits = REGISTRY.get_sample_value("allmende_group_commit_seconds_count", labels)
    assert commits is not None and 2 <= commits <= batches


async def _stop_mid_commit(settings: Settings) -> list[BaseException | None]:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    log = GroupCommit(producer, settings.admission_topic)
    log.start()
    try:
        futures = [log.submit([(b"job", b"x" * 500)]) for _ in range(50)]
        await asyncio.sleep(0)  # the commit takes the group
        futures += [log.submit([(b"job", b"late")]) for _ in range(5)]  # still queued
        await log.stop(timeout_s=0)
        assert all(f.done() for f in futures)  # nobody is left waiting
        return [f.exception() for f in futures]
    finally:
        await producer.stop()


def test_stopping_tells_every_caller_whether_its_records_were_acknowledged(settings: Settings) -> None:
    ensure_topics(settings)
    outcomes = asyncio.run(_stop_mid_commit(settings))
    assert all(o is None or "stopped before the broker acknowledged" in str(o) for o in outcomes)
    assert any(o is not None for o in outcomes)  # the queued ones at least
