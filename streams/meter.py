"""The metering worker: a faust app that turns job events into ledger entries.

Run it with `allmende worker` (any number of processes; they share the partitions). Faust's
guarantee is at least once, so nothing here relies on exactly-once: the per-job meter state is
a faust table (changelogged, so it follows partitions across workers and restarts), every entry
it emits has a deterministic id and version, and a redelivered event re-emits the entries it
produced the first time, which the ledger writer then ignores as already posted.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterable
from typing import Any

import faust
import structlog
from faust.types import EventT

from allmende.core.metrics import METER, METER_DEAD_LETTERS, METER_EVENTS, register
from allmende.core.settings import Settings
from allmende.domain.metering import JobMeter, MeteringRejected
from allmende.domain.postings import newest_per_entry
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import ContractError, JobEvent, parse_job_event
from allmende.schemas.ledger import LedgerEntry, encode_entries

log = structlog.get_logger(__name__)

# Events per batch and the longest a batch waits to fill: bounds both latency and memory.
BATCH_MAX = 5_000
BATCH_WITHIN_S = 0.2


class _DecodedMeters:
    """Decoded JobMeter objects beside the table's bytes, to skip decoding on every batch.

    A cached object is used only while the table still holds the very bytes object it was
    encoded to (identity, not equality): after a recovery or rebalance the table's values are
    new objects, so the cache can never serve state the table does not have.
    """

    def __init__(self, max_jobs: int = 50_000) -> None:
        self._items: OrderedDict[str, tuple[bytes, JobMeter]] = OrderedDict()
        self._max = max_jobs

    def get(self, job_id: str, raw: bytes | None) -> JobMeter:
        # Taken out while in use: if processing fails before `put`, the table decides next time.
        held = self._items.pop(job_id, None)
        if held is not None and raw is not None and held[0] is raw:
            return held[1]
        return JobMeter.from_bytes(raw) if raw else JobMeter(job_id)

    def put(self, job_id: str, raw: bytes, meter: JobMeter) -> None:
        self._items[job_id] = (raw, meter)
        self._items.move_to_end(job_id)
        while len(self._items) > self._max:
            self._items.popitem(last=False)


def stream_settings() -> dict[str, Any]:
    """The consuming side of the meter's app, shared with bench/faust_ceiling.py's counting agent.

    The bench compares the meter with an agent that only counts: both read with these.
    """
    return {
        # A commit flushes the producer and waits for every ack: per few batches, not per one.
        "broker_commit_every": 10 * BATCH_MAX,
        "broker_commit_interval": 3.0,
        # Room for a few whole batches per agent, so a batch is not cut short by a full buffer.
        "stream_buffer_maxsize": 4 * BATCH_MAX,
        "consumer_auto_offset_reset": "earliest",
    }


def _broker_url(bootstrap: str) -> str:
    return ";".join(f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip())


async def _producer_knows(app: faust.App, topic: str) -> None:
    """Wait until the producer's metadata has `topic`'s partitions.

    A table write picks its changelog partition from the producer's metadata (use_partitioner),
    without waiting for it. faust refreshes that metadata right after creating the changelog
    topic, but the broker may not list a topic it has just created yet; the producer would then
    not learn of it for metadata_max_age_ms (5 min), and the agent's first write would crash it
    (TypeError in aiokafka's `_partition`), losing the batch in hand. aiokafka's `partitions_for`
    asks again until the topic is there. Only ask once the topic is declared: a broker that
    creates topics on request would otherwise make it, with its own defaults.
    """
    driver: Any = app.producer  # faust's aiokafka driver, around aiokafka's own producer
    await driver._ensure_producer().partitions_for(topic)


def create_app(settings: Settings) -> faust.App:
    register(METER)
    app = faust.App(
        settings.meter_app_id,
        broker=_broker_url(settings.kafka_bootstrap_servers),
        store="memory://",
        datadir=str(settings.meter_data_dir),
        topic_partitions=settings.topic_partitions,
        web_enabled=False,
        producer_linger_ms=20,
        producer_compression_type="lz4",
        producer_max_batch_size=1024 * 1024,
        **stream_settings(),
        # A killed worker's partitions move to the others after this long, not faust's 60 s.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
    )
    job_events = app.topic(
        settings.job_events_topic,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
    )
    ledger_entries = app.topic(
        settings.ledger_entries_topic,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
    )
    dead_letters = app.topic(settings.dead_letter_topic, key_serializer="raw", value_serializer="raw")
    # Batches mix partitions, so the changelog partition comes from the key (same murmur2
    # partitioner as the producers of job events), not from the "current event".
    meters = app.Table(
        "meter-state",
        default=None,
        key_type=bytes,
        value_type=bytes,  # bytes -> the "raw" codec, also when recovering
        partitions=settings.topic_partitions,
        use_partitioner=True,
    )

    decoded = _DecodedMeters()

    async def refuse(event: EventT[bytes], reason: str) -> None:
        METER_DEAD_LETTERS.inc()
        message = event.message
        log.warning("event_refused", reason=reason, partition=message.partition, offset=message.offset)
        record = DeadLetter.of(
            stage="meter",
            reason=reason,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )
        await dead_letters.send(value=record.to_json())

    @app.agent(job_events)
    async def meter(stream: AsyncIterable[EventT[bytes]]) -> None:
        changelog_known = False
        async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):  # type: ignore[attr-defined]
            if not changelog_known:  # events flow once the table has declared its changelog topic
                await _producer_knows(app, meters.changelog_topic.get_topic_name())
                changelog_known = True
            by_job: dict[str, list[tuple[EventT[bytes], JobEvent]]] = defaultdict(list)
            for event in batch:
                try:
                    parsed = parse_job_event(event.message.value)
                except ContractError as exc:
                    await refuse(event, exc.reason)
                    continue
                key = event.message.key
                if key is not None and key != parsed.job_id.encode():
                    await refuse(event, f"key {key!r} is not the job id {parsed.job_id!r}")
                    continue
                by_job[parsed.job_id].append((event, parsed))
            for job_id, items in by_job.items():
                raw = meters.get(job_id.encode())
                state = decoded.get(job_id, raw)
                emitted: list[LedgerEntry] = []
                for event, parsed in items:
                    try:
                        emitted.extend(state.apply(parsed))
                    except MeteringRejected as exc:
                        await refuse(event, str(exc))
                raw = state.to_bytes()
                meters[job_id.encode()] = raw
                decoded.put(job_id, raw, state)
                key = job_id.encode()
                if emitted:
                    # The producer's own send: faust flushes it before committing offsets.
                    await app.producer.send(
                        ledger_entries.get_topic_name(),
                        key,
                        encode_entries(list(newest_per_entry(emitted).values())),
                        partition=None,
                        timestamp=None,
                        headers=None,
                    )
                METER_EVENTS.inc(len(items))

    return app
