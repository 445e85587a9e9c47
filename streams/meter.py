"""The metering worker: a faust app that turns job events into ledger entries, and each job's
submission into its attribution (whose its GPU samples are: docs/dcgm.md; the samples themselves
go to the ledger by streams/sample_writer.py, not through here).

Run it with `allmende worker` (any number of processes; they share the partitions). Faust's
guarantee is at least once, so nothing here relies on exactly-once: the per-job meter state is
a faust table (changelogged, so it follows partitions across workers and restarts), every entry
it emits has a deterministic id and version, and a redelivered event re-emits the entries it
produced the first time, which the ledger writer then ignores as already posted.

Every record has one fate: counted, or dead-lettered with its reason. Nothing a record holds
(any bytes, any size, any contract violation) escapes its own parse and apply; a dead letter is
bounded, so it always fits on its topic; and a batch ends (faust then acks its events, and
commits them later) only once the broker has acknowledged every ledger entry and dead letter it
produced (`_Deliveries`). What cannot be made durable ends the process before any ack
(`_end_before_acks`).

The table holds what is live plus one retention period (`_Retirement`): a finished job's state is
deleted (a tombstone in the changelog, so a recovering worker does not load it) once its
partition's stream is `ended_job_retention_s` past the job's last instant, and a `retired` record
on the ledger-entry topic tells the readers its entries are final. A timed event of a job the
table does not hold, that far behind its partition, is dead-lettered (`retired`): it cannot be
told from a change to a job let go of, and nothing is charged for it.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import sys
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterable, Awaitable, Collection
from typing import Any, NoReturn

import faust
import orjson
import structlog
from aiokafka.errors import KafkaTimeoutError
from faust.exceptions import ProducerSendError
from faust.types import TP, EventT, RecordMetadata
from kafka.partitioner.default import murmur2

from allmende.core.metrics import (
    METER,
    METER_DEAD_LETTERS,
    METER_EVENTS,
    METER_LAG_RECORDS,
    METER_LATE_EVENTS,
    METER_RETIRED_JOBS,
    METER_SKIPPED_GAPS,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.admin_state import DISPUTED, AdminState
from allmende.domain.gpu_utilisation import JobAttribution, encode_attributions
from allmende.domain.metering import JobMeter, MeteringRejected
from allmende.domain.postings import newest_per_entry
from allmende.domain.usage_checks import ImpossibleUsage, PlanView, check_event
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import ContractError, JobEvent, JobSubmitted, parse_job_event
from allmende.schemas.ledger import LedgerEntry, encode_entries, encode_retired
from allmende.streams.admin_log import AdminLog
from allmende.streams.offset_continuity import OffsetContinuity

log = structlog.get_logger(__name__)

# Events per batch and the longest a batch waits to fill: bounds both latency and memory.
BATCH_MAX = 5_000
BATCH_WITHIN_S = 0.2
DISPUTES_CHECK_S = 2.0  # how often the admin log is read for disputes of jobs no event brings


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


ROWS_PER_RECORD = 2_000  # attributions per record: about 200 KB, well under ENTRY_RECORD_MAX_BYTES

# A ledger-entry record stays this small: a job's burst of events (or a late JobSubmitted, which
# re-emits every entry of the job) is split over several records rather than exceed the
# producer's 1 MB. Entries are independent (the writer keeps the largest revision of each), so
# how they are grouped into records changes nothing.
ENTRY_RECORD_MAX_BYTES = 512 * 1024

# A send the broker did not take is sent again after this long, then twice as long, up to the cap.
RESEND_FIRST_S = 0.5
RESEND_MAX_S = 30.0
EXIT_BATCH_FAILED = 70  # EX_SOFTWARE: the worker's exit when a batch's fate cannot be made durable


def entry_records(entries: list[LedgerEntry], max_bytes: int = ENTRY_RECORD_MAX_BYTES) -> list[bytes]:
    """`entries` as ledger-entry records (JSON arrays) of at most `max_bytes` each (but one entry)."""
    value = encode_entries(entries)
    if len(value) <= max_bytes or len(entries) == 1:
        return [value]
    half = len(entries) // 2
    return entry_records(entries[:half], max_bytes) + entry_records(entries[half:], max_bytes)


def _worth_resending(exc: BaseException) -> bool:
    """An error the broker's return may mend (it is away, slow, electing a leader)."""
    cause = exc.__cause__ if isinstance(exc, ProducerSendError) and exc.__cause__ is not None else exc
    return isinstance(cause, KafkaTimeoutError) or bool(getattr(cause, "retriable", False))


class _Deliveries:
    """The records one batch produces (ledger entries, dead letters), delivered before it ends.

    Why not leave them to faust: faust commits a batch's offsets once the agent has acked its
    events, and it flushes its producer first (faust/transport/consumer.py, `_commit_offsets`:
    `await self.app.producer.flush()` before `self._commit(...)`, when not in a transaction). But
    aiokafka's flush only waits until every pending batch is done, delivered or failed
    (aiokafka/producer/message_accumulator.py, `flush`); a send that failed (a broker away for
    longer than the producer's request timeout) would not stop the commit. So the meter waits for
    each record's own acknowledgement, and sends again what the broker did not take, for as long
    as it takes: an outage stalls the batch (and with it the commits), it never loses a record.
    """

    def __init__(self, app: faust.App) -> None:
        self._producer = app.producer
        self._records: list[tuple[str, bytes | None, bytes]] = []

    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._records.append((topic, key, value))

    async def delivered(self) -> None:
        """Return once the broker has acknowledged every record (in any order)."""
        pending = [(record, await self._sent(record)) for record in self._records]
        for record, future in pending:
            delay = RESEND_FIRST_S
            while True:
                try:
                    await future
                    break
                except Exception as exc:
                    if not _worth_resending(exc):
                        raise
                    log.warning("meter_send_failed", topic=record[0], error=repr(exc), retry_in_s=delay)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, RESEND_MAX_S)
                    future = await self._sent(record)
        self._records.clear()

    async def _sent(self, record: tuple[str, bytes | None, bytes]) -> Awaitable[RecordMetadata]:
        """The record handed to the producer: its delivery to await. A send refused at once for a
        reason the broker's return may mend (metadata unavailable) is a delivery that failed."""
        topic, key, value = record
        try:
            return await self._producer.send(topic, key, value, partition=None, timestamp=None, headers=None)
        except Exception as exc:
            if not _worth_resending(exc):
                raise
            failed: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed


class _Plan:
    """The plan the meter checks events against (domain/usage_checks.py): the admin log, caught
    up to its end before every batch, so a plan applied before events were sent is in force
    for them. The admin log away (Kafka away): the batch waits, as its deliveries would."""

    def __init__(self, settings: Settings) -> None:
        self._log = AdminLog(settings, dead_letters=False)  # the API dead-letters the admin log
        self._state: AdminState | None = None
        self._view = PlanView.of(AdminState())

    @property
    def last(self) -> PlanView:
        """The plan as last caught up (for batches that check nothing against it)."""
        return self._view

    async def current(self) -> PlanView:
        delay = RESEND_FIRST_S
        loop = asyncio.get_running_loop()
        while True:
            try:
                state = await loop.run_in_executor(None, self._log.catch_up, 10.0)
                break
            except Exception as exc:
                log.warning("meter_plan_unavailable", error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, RESEND_MAX_S)
        if state is not self._state:  # catch_up returns the same object until something folds
            self._state, self._view = state, PlanView.of(state)
        return self._view


class _Retirement:
    """When the meter lets go of finished jobs, per partition: a heap of (instant the job may go,
    job) and two clocks. `metered_to`: the latest instant of an event metered from the partition
    since this worker took it; a job goes once it passes the job's last instant by the retention
    (a replay of the past retires as the live run did). `clocks`: the same, or the latest instant
    the table's jobs hold, if later; an event of a job the table holds nothing of, a retention
    behind it, is late. After an assignment the table is indexed again (`index`) and `metered_to`
    starts over: the events since the last commit come again, and a job they heal (a lost
    emission, `JobMeter.apply`) must still be held when they come."""

    def __init__(self, retention_s: int, partitions: int) -> None:
        self.retention_s = retention_s
        self.partitions = partitions
        self.clocks: dict[int, int] = {}
        self.metered_to: dict[int, int] = {}
        self._due: dict[int, list[tuple[int, str]]] = defaultdict(list)
        self.indexed = False

    def partition_of(self, key: bytes) -> int:
        """The partition a key's events and table row are on (the producers' murmur2)."""
        return int(murmur2(key) & 0x7FFFFFFF) % self.partitions

    def horizon(self, partition: int) -> int | None:
        """Events on the partition at or before this instant are past the retention (None: no clock yet)."""
        clock = self.clocks.get(partition)
        return None if clock is None else clock - self.retention_s

    def saw(self, partition: int, at: int, metered: bool = True) -> None:
        if at > self.clocks.get(partition, at - 1):
            self.clocks[partition] = at
        if metered and at > self.metered_to.get(partition, at - 1):
            self.metered_to[partition] = at

    def follow(self, partition: int, job_id: str, state: JobMeter) -> None:
        last = state.last_instant()
        if last is not None:
            self.later(partition, last + self.retention_s, job_id)

    def later(self, partition: int, at: int, job_id: str) -> None:
        heapq.heappush(self._due[partition], (at, job_id))

    def index(self, table: Any) -> None:
        """Every finished job of the table onto its partition's heap; each partition's clock from
        the latest instant its jobs hold."""
        self._due.clear()
        self.metered_to.clear()
        for key, raw in list(table.items()):
            if not raw:
                continue
            state = JobMeter.from_bytes(raw)
            partition = self.partition_of(key)
            if state.boundaries:
                self.saw(partition, max(b[0] for b in state.boundaries), metered=False)
            self.follow(partition, state.job_id, state)
        self.indexed = True
        log.info("meter_table_indexed", jobs=len(table), clocks=self.clocks)

    def due(self, partition: int) -> list[str]:
        """The jobs whose time to go has come on the partition (each checked again by the caller)."""
        clock, heap, found = self.metered_to.get(partition), self._due.get(partition), []
        while clock is not None and heap and heap[0][0] <= clock:
            found.append(heapq.heappop(heap)[1])
        return found


def _end_before_acks(exc: Exception, batch: list[EventT[bytes]]) -> NoReturn:
    """End the worker at once: the batch's events must not be acked.

    Nothing a record holds gets here (`meter_batch` guards each record); only I/O that retrying
    cannot mend (a record the broker refuses for good) or a bug does. Raising would not do:
    faust's `take_events` (faust/streams.py) acks the events it yielded in a `finally`, which runs
    when the agent's body raises too (the generator is closed), so the next commit would pass the
    events whose fate is unknown, and faust restarts the agent with the consumer already past
    them: lost for good (issue 22). Nor can the meter hold back their acks: faust commits past a
    gap at the head of a partition's acked offsets (`Consumer._new_offset` checks it only when a
    commit exists and the gap is more than one offset). So the process ends without acking,
    committing or flushing; a worker started again (`allmende up`, systemd) or the group's other
    workers meter the events again from the last commit, which the ledger takes at most once.
    """
    log.critical(
        "meter_batch_failed",
        error=repr(exc),
        events=len(batch),
        first=[(e.message.partition, e.message.offset) for e in batch[:1]],
        exc_info=exc,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_BATCH_FAILED)


def _late(job_id: str, at: int, horizon: int) -> str:
    return (
        f"job {job_id}: the meter holds no state for it and this event (at {at}) is at or before "
        f"{horizon}, the retention (ALLMENDE_ENDED_JOB_RETENTION_S) behind its partition's stream: "
        "the job ended and was let go of, or the event comes too late to be metered"
    )


def create_app(settings: Settings) -> faust.App:
    register(METER)
    app = faust.App(
        settings.meter_app_id,
        broker=_broker_url(settings.kafka_bootstrap_servers),
        store="memory://",
        datadir=str(settings.meter_data_dir),
        topic_partitions=settings.topic_partitions,
        web_enabled=False,
        # Our log lines are JSON on stderr; faust's worker would wrap stderr into its own logging.
        worker_redirect_stdouts=False,
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
    plan = _Plan(settings)
    retirement = _Retirement(settings.ended_job_retention_s, settings.topic_partitions)

    continuity: OffsetContinuity[TP] = OffsetContinuity()

    async def _assigned(sender: Any, /, *_: Any, signal: Any, **__: Any) -> None:
        retirement.indexed = False  # the table changes with the assignment: index it again
        continuity.forget()  # a partition handed back may start where another worker committed

    app.on_partitions_assigned.connect(_assigned)

    def refuse(out: _Deliveries, event: EventT[bytes], reason: str, code: str) -> None:
        METER_DEAD_LETTERS.inc()
        message = event.message
        # Bounded (schemas/dead_letter.py): it fits on the topic whatever the record holds.
        record = DeadLetter.of(
            stage="meter",
            reason=reason,
            code=code,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )
        log.warning(
            "event_refused",
            code=code,
            reason=record.reason,
            partition=message.partition,
            offset=message.offset,
        )
        out.send(dead_letters_topic, None, record.to_json())

    def parsed_or_refused(out: _Deliveries, event: EventT[bytes]) -> JobEvent | None:
        """The event, or None once it is dead-lettered: nothing a record holds escapes."""
        message = event.message
        try:
            if message.value is None:
                raise ContractError("no value (a tombstone), not a job event")
            parsed = parse_job_event(message.value)
            key = message.key
            if key is not None and key != parsed.job_id.encode():
                reason, code = f"key {key[:100]!r} is not the job id {parsed.job_id!r}", "contract"
            else:
                return parsed
        except ContractError as exc:
            reason, code = exc.reason, "contract"
        except Exception as exc:  # a record no rule foresaw: refused with what it raised
            reason, code = f"unexpected {type(exc).__name__}: {exc}", "unexpected"
        refuse(out, event, reason, code)
        return None

    def metered(
        out: _Deliveries,
        job_id: str,
        raw: bytes | None,
        items: list[tuple[EventT[bytes], JobEvent]],
        in_force: PlanView,
        now: int,
        horizon: int | None,
    ) -> tuple[JobMeter, list[LedgerEntry]]:
        """The job's state with the batch's events applied, and the entries they emitted."""
        state = decoded.get(job_id, raw)
        emitted: list[LedgerEntry] = []
        applied: list[JobEvent] = []
        for event, parsed in items:
            # Late: a timed event of a job of which nothing is held, not even from this batch (a
            # submission carries the instant the job was queued, days ago perhaps: never late,
            # and what follows it is the job's).
            unknown = state.submitted is None and not state.boundaries
            if (
                unknown
                and horizon is not None
                and parsed.occurred_at <= horizon
                and not isinstance(parsed, JobSubmitted)
            ):
                METER_LATE_EVENTS.inc()
                refuse(out, event, _late(job_id, parsed.occurred_at, horizon), "retired")
                continue
            try:
                check_event(parsed, in_force, now, settings.clock_skew_s)
                emitted.extend(state.apply(parsed))
                applied.append(parsed)
            except ImpossibleUsage as exc:  # checked before the state changes
                refuse(out, event, str(exc), exc.code)
            except MeteringRejected as exc:  # raised before the state changes
                refuse(out, event, str(exc), "conflict")
            except Exception as exc:
                refuse(out, event, f"unexpected {type(exc).__name__}: {exc}", "unexpected")
                # It may have changed the state before it raised: the state again, without it.
                state = JobMeter.from_bytes(raw) if raw else JobMeter(job_id)
                emitted = [entry for earlier in applied for entry in state.apply(earlier)]
        emitted.extend(state.dispute(in_force.dispute_stage(job_id)))
        return state, emitted

    @app.agent(job_events)
    async def meter(stream: AsyncIterable[EventT[bytes]]) -> None:
        changelog_known = False
        async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):  # type: ignore[attr-defined]
            try:
                if not changelog_known:  # events flow once the table has declared its changelog topic
                    await _producer_knows(app, meters.changelog_topic.get_topic_name())
                    changelog_known = True
                kept, gaps = continuity.admit((e.message.tp, e.message.offset) for e in batch)
                if gaps:
                    uncommittable(gaps)  # before any await: faust's commit loop must not pass them
                    await seek_back(continuity.to_seek(gaps, time.monotonic()))
                    batch = [event for event, keep in zip(batch, kept, strict=True) if keep]
                if batch:
                    await meter_batch(batch)
            except Exception as exc:
                _end_before_acks(exc, batch)

    def uncommittable(gaps: dict[TP, int]) -> None:
        """Take the skipped stretch out of faust's own record of gaps (faust-streaming 0.11-0.15,
        `Consumer._gap`: offset ranges it counts as acknowledged, meant for compacted topics), so
        the next commit cannot pass records this worker never metered."""
        ranges = getattr(app.consumer, "_gap", None)
        if ranges is None:
            return
        for tp, missing in gaps.items():
            try:
                if tp in ranges:
                    ranges[tp].chop(missing, 2**63)
            except Exception as exc:  # another faust: the seek back still re-meters the stretch
                log.warning("meter_gap_unchopped", partition=tp.partition, error=repr(exc))

    async def seek_back(gaps: dict[TP, int]) -> None:
        """Seek each partition back to the first record the consumer skipped (streams/
        offset_continuity.py), or to the earliest the broker still holds if retention took it."""
        for tp, missing in gaps.items():
            METER_SKIPPED_GAPS.inc()
            try:
                earliest = (await app.consumer.earliest_offsets(tp)).get(tp) or 0
                target = max(missing, earliest)
                await app.consumer.seek(tp, target)
            except Exception as exc:  # tried again at the next batch; a rebalance forgets it
                log.warning("meter_seek_back_failed", topic=tp.topic, partition=tp.partition, error=repr(exc))
                continuity.seek_failed(tp)
                continue
            log.warning(
                "meter_records_skipped",
                topic=tp.topic,
                partition=tp.partition,
                first_missing=missing,
                seek_to=target,
            )
            continuity.sought_to(tp, target)

    async def meter_batch(batch: list[EventT[bytes]]) -> None:
        """Give every event of the batch its fate (counted or dead-lettered) and make it durable.

        A record's content never raises out of here: parsing and applying are guarded per record.
        What may raise is I/O that retrying did not mend, or a bug: see `_end_before_acks`.
        """
        out = _Deliveries(app)
        in_force = await plan.current()
        now = int(time.time())
        if not retirement.indexed:
            retirement.index(meters)
        by_job: dict[str, list[tuple[EventT[bytes], JobEvent]]] = defaultdict(list)
        attributions: list[JobAttribution] = []  # whose the submitted jobs' GPU samples are
        latest: dict[int, int] = {}  # per partition: the clocks move once the batch is judged by them
        for event in batch:
            parsed = parsed_or_refused(out, event)
            if parsed is not None:
                by_job[parsed.job_id].append((event, parsed))
                # A submission's instant is when the job was queued; one beyond the skew is refused.
                at, partition = parsed.occurred_at, event.message.partition
                if not isinstance(parsed, JobSubmitted) and at <= now + settings.clock_skew_s:
                    latest[partition] = max(latest.get(partition, at), at)
        for job_id, items in by_job.items():
            key = job_id.encode()
            raw = meters.get(key)
            partition = items[0][0].message.partition
            state, emitted = metered(out, job_id, raw, items, in_force, now, retirement.horizon(partition))
            if raw is None and not state.boundaries and state.submitted is None:
                continue  # every record refused: nothing to keep
            raw = state.to_bytes()
            meters[key] = raw
            decoded.put(job_id, raw, state)
            attribution = state.attribution()
            # Each submission the batch brings says it again (a redelivery too): the ledger keeps
            # one row per job whatever the repeats.
            if attribution is not None and any(isinstance(parsed, JobSubmitted) for _, parsed in items):
                attributions.append(JobAttribution(job_id, *attribution))
            emit(out, key, emitted)
            retirement.follow(partition, job_id, state)
            METER_EVENTS.inc(len(items))
        # Attributions are independent of one another and of the jobs' entries (keyed by job,
        # never revised): a batch's go in as few records as fit, not one per job.
        for first in range(0, len(attributions), ROWS_PER_RECORD):
            value = orjson.dumps(encode_attributions(attributions[first : first + ROWS_PER_RECORD]))
            out.send(ledger_entries_topic, None, value)
        for partition, at in latest.items():
            retirement.saw(partition, at)
        retire(out, in_force, by_job.keys())  # with the plan just caught up: a dispute keeps its job
        await out.delivered()
        note_lag(batch)

    def retire(out: _Deliveries, in_force: PlanView, touched: Collection[str]) -> None:
        """Delete the finished jobs whose time has come from the table (a tombstone each) and say
        so on the ledger-entry topic, after every entry of theirs: those of earlier batches are
        acknowledged already, and a job this batch touched waits for a later one."""
        retired = 0
        # Only the partitions this worker meters: its table may hold standby copies of others.
        owned = {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == job_events_topic}
        for partition in [p for p in retirement.metered_to if p in owned]:
            clock = retirement.metered_to[partition]
            for job_id in retirement.due(partition):
                stage = in_force.disputes.get(job_id)
                unsettled = stage is not None and (followed.get(job_id) != stage or stage == DISPUTED)
                if job_id in touched or unsettled:
                    # Kept: a later batch lets it go (an open dispute keeps it: its resolution
                    # re-emits the job's entries from this state).
                    retirement.later(partition, clock + 1, job_id)
                    continue
                key = job_id.encode()
                raw = meters.get(key)
                if not raw:
                    continue  # gone already (the heap may hold a job twice)
                state = decoded.get(job_id, raw)
                last = state.last_instant()
                if last is None or last + retirement.retention_s > clock:  # a later event came
                    decoded.put(job_id, raw, state)
                    retirement.follow(partition, job_id, state)
                    continue
                del meters[key]
                out.send(ledger_entries_topic, key, encode_retired(job_id, clock))
                retired += 1
        if retired:
            METER_RETIRED_JOBS.inc(retired)
            log.info("meter_jobs_retired", jobs=retired, clocks=retirement.metered_to)

    def emit(out: _Deliveries, key: bytes, entries: list[LedgerEntry]) -> None:
        """A job's entries to the ledger-entry topic: each entry's newest revision, in as few
        records as fit."""
        if entries:
            for value in entry_records(list(newest_per_entry(entries).values())):
                out.send(ledger_entries_topic, key, value)

    def note_lag(batch: list[EventT[bytes]]) -> None:
        """Per partition, the events after the batch's last (the consumer's latest high-water mark):
        how far behind the worker is, from its own /metrics, which answer while Kafka does not."""
        last: dict[TP, int] = {}
        for event in batch:
            tp = event.message.tp
            last[tp] = max(last.get(tp, -1), event.message.offset)
        for tp, offset in last.items():
            try:  # a figure, never a reason to fail the batch (a rebalance may have taken the partition)
                high = app.consumer.highwater(tp)
            except Exception:
                continue
            if high is not None:
                METER_LAG_RECORDS.labels(str(tp.partition)).set(max(0, high - offset - 1))

    # The dispute stage each owned job's entries were last re-emitted with by `follow_disputes`.
    followed: dict[str, int] = {}

    @app.timer(interval=DISPUTES_CHECK_S)  # type: ignore[untyped-decorator]
    async def follow_disputes() -> None:
        """Re-emit the entries of a job whose dispute was raised or resolved, when no event of the
        job brings it to a batch (an ended job's). Only jobs of this worker's partitions are in its
        table; what it sends is what `metered` would (the same ids and revisions), so a batch of
        the job's own, or another worker after a rebalance, sending the same is harmless. The
        table is not written here: the job's next batch records the stage."""
        if app.rebalancing or getattr(app, "in_recovery", False):
            return  # the table may hold part of a job's state: its next tick sees all of it
        try:
            in_force = await plan.current()
            due = [(j, s) for j, s in in_force.disputes.items() if followed.get(j) != s]
            if not due:
                return
            out = _Deliveries(app)
            sent: dict[str, int] = {}
            for job_id, stage in due:
                raw = meters.get(job_id.encode())
                if not raw:
                    continue  # another worker's job, or none of its events metered yet
                emit(out, job_id.encode(), JobMeter.from_bytes(raw).dispute(stage))
                sent[job_id] = stage
            await out.delivered()
            followed.update(sent)  # only once acknowledged: a failed tick sends them again
        except Exception as exc:  # tried again at the next tick: the entries are idempotent
            log.warning("meter_disputes_failed", error=repr(exc))

    ledger_entries_topic = ledger_entries.get_topic_name()
    job_events_topic = job_events.get_topic_name()
    dead_letters_topic = settings.dead_letter_topic
    return app
