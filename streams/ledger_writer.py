"""The ledger writer: `allmende.ledger-entries` -> ClickHouse postings, exactly once in effect.

Kafka delivers at least once; the writer makes that exact. Per batch it keeps the newest version
of each entry, compares with the version already in the ledger (a per-job cache, backed by the
ledger itself), appends the postings as one INSERT, then records the next offset of every
partition in `ingest_offsets`. On (re)assignment it seeks to those offsets, not to Kafka's
committed ones: the record of what was processed lives next to the ledger it fed. Kafka offsets
are committed too, for lag dashboards only.

Every record has one fate: posted, or dead-lettered with its reason. A record the ledger cannot
hold (not JSON, not entries, a field of the wrong type or out of the columns' range) is refused
on its own, never failing its batch; the offsets are saved only once the batch's postings are in
and its dead letters acknowledged. A ClickHouse or Kafka failure fails the batch, which is read
again from the saved offsets: an outage never dead-letters good records.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.producer.future import FutureRecordMetadata

from allmende.core.kafka_reading import LagWatch, wait_for_partitions
from allmende.core.ledger_store import LedgerStore
from allmende.core.metrics import (
    WRITER,
    WRITER_BATCH_SECONDS,
    WRITER_DEAD_LETTERS,
    WRITER_ENTRIES_READ,
    WRITER_ENTRIES_STALE,
    WRITER_LAG_RECORDS,
    WRITER_POSTINGS_WRITTEN,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.charging import PolicyTimeline, flat_policy
from allmende.domain.postings import newest_per_entry, post
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.ledger import LedgerEntry, decode_entries
from allmende.streams.admin_log import AdminLog

log = structlog.get_logger(__name__)

_JOB_CACHE_MAX = 200_000


@dataclass
class BatchResult:
    records: int
    postings: int
    dead_letters: int


class _JobCache:
    """Current entry versions per job, LRU-bounded; authoritative only for owned partitions."""

    def __init__(self, store: LedgerStore, max_jobs: int = _JOB_CACHE_MAX) -> None:
        self._store = store
        self._jobs: OrderedDict[str, dict[str, LedgerEntry]] = OrderedDict()
        self._max = max_jobs

    def current(self, job_ids: Iterable[str]) -> dict[str, LedgerEntry]:
        wanted = set(job_ids)
        missing = [j for j in wanted if j not in self._jobs]
        if missing:
            loaded = self._store.current_entries(missing)
            for job_id in missing:
                self._jobs[job_id] = {}
            for entry in loaded.values():
                self._jobs[entry.job_id][entry.entry_id] = entry
        found: dict[str, LedgerEntry] = {}
        for job_id in wanted:
            self._jobs.move_to_end(job_id)
            found.update(self._jobs[job_id])
        while len(self._jobs) > self._max:
            self._jobs.popitem(last=False)
        return found

    def accept(self, entries: Iterable[LedgerEntry]) -> None:
        for entry in entries:
            self._jobs.setdefault(entry.job_id, {})[entry.entry_id] = entry

    def clear(self) -> None:
        self._jobs.clear()


# What the ledger's columns hold (schemas/clickhouse/): `day` is a Date (up to 2149-06-06), `gpus`
# at most what a job event may carry, so gpu_seconds x 10,000 (idle units) fits an Int64.
_LAST_SECOND = 65_536 * 86_400 - 1
_MAX_GPUS = 100_000  # the job events' bound (schemas/events.py)
_FIELDS = tuple(LedgerEntry.__dataclass_fields__)
_fields_of = operator.attrgetter(*_FIELDS)
_INTS = ("version", "interval_start", "interval_end", "gpus", "utilization_bp")
_TYPES = tuple(int if f in _INTS else bool if f == "interactive" else str for f in _FIELDS)


def postable_entries(value: bytes | None) -> list[LedgerEntry]:
    """The entries of one ledger-entry record, each one the ledger can hold; else ValueError or
    TypeError saying why. Checked per record, so a bad one never fails the batch's INSERT."""
    if value is None:
        raise ValueError("no value (a tombstone)")
    entries = decode_entries(value)
    for entry in entries:
        if tuple(map(type, _fields_of(entry))) != _TYPES:  # exact: a bool is no int here
            raise TypeError(f"ledger entry {str(entry.entry_id)[:100]!r} has a field of the wrong type")
        if not (
            0 <= entry.interval_start <= entry.interval_end <= _LAST_SECOND
            and entry.gpus <= _MAX_GPUS
            and entry.version < 2**64
        ):
            raise ValueError(f"ledger entry {entry.entry_id[:100]!r} is out of the ledger's range")
    return entries


class LedgerWriter:
    def __init__(
        self,
        settings: Settings,
        store: LedgerStore,
        consumer_name: str | None = None,
        admin_log: AdminLog | None = None,
    ) -> None:
        register(WRITER)
        self.settings = settings
        self.store = store
        # The policy timeline comes from the admin log, read to its end before every batch.
        self.admin_log = admin_log
        self._owns_admin_log = admin_log is None
        # Held while a batch is priced and posted. An admin command that introduces a policy takes
        # it too, so no batch can charge usage past the policy's start while the policy is checked
        # against the charge horizon and published.
        self.posting_lock = threading.Lock()
        self.topic = settings.ledger_entries_topic
        self.consumer_name = consumer_name or settings.writer_group
        self._cache = _JobCache(store)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lag = LagWatch()
        self.caught_up = self._lag.caught_up
        self.batches = 0
        self.last_error: str | None = None

    # -- one batch (pure of Kafka: testable and reused by replays) -----------------------------
    def post_batch(
        self,
        records: list[tuple[int, int, bytes | None, bytes]],
        dead_letter: Callable[[DeadLetter], None],
        timeline: PolicyTimeline | None = None,
    ) -> BatchResult:
        """Post (partition, offset, key, value) records; returns counts. Offsets not saved here."""
        entries: list[LedgerEntry] = []
        refused = 0
        for partition, offset, key, value in records:
            # Whatever a record holds, it is refused here or posts below: nothing it holds may
            # raise out of the batch (the loop would retry the same batch for ever).
            try:
                entries.extend(postable_entries(value))
                continue
            except (ValueError, TypeError) as exc:
                reason = f"not a ledger entry: {exc}"
            except Exception as exc:  # a record no rule foresaw: refused with what it raised
                reason = f"not a ledger entry: unexpected {type(exc).__name__}: {exc}"
            refused += 1
            # Bounded (schemas/dead_letter.py): it fits on the topic whatever the record holds.
            dead_letter(
                DeadLetter.of(
                    stage="ledger-writer",
                    reason=reason,
                    code="contract",
                    topic=self.topic,
                    partition=partition,
                    offset=offset,
                    key=key,
                    value=value,
                )
            )
        newest = newest_per_entry(entries)
        current = self._cache.current(e.job_id for e in newest.values())
        postings, accepted = post(newest, current, timeline or PolicyTimeline([flat_policy()]))
        self.store.append(postings)
        self._cache.accept(accepted.values())
        WRITER_ENTRIES_READ.inc(len(records))
        WRITER_ENTRIES_STALE.inc(len(entries) - len(accepted))
        WRITER_POSTINGS_WRITTEN.inc(len(postings))
        WRITER_DEAD_LETTERS.inc(refused)
        return BatchResult(len(records), len(postings), refused)

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run_forever, args=(self._stop,), name="ledger-writer", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_forever(self, stop: threading.Event) -> None:
        """`run`, restarted after failures (Kafka or ClickHouse away) until `stop` is set."""
        while not stop.is_set():
            try:
                self.run(stop)
                self.last_error = None
            except Exception as exc:  # keep the ledger process alive; Kafka may come back
                self.last_error = repr(exc)
                log.exception("ledger_writer_failed", error=repr(exc))
                stop.wait(2.0)

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        # A batch whose INSERT failed may have landed all the same (a ClickHouse server that wrote
        # the part, then the answer was lost): the ledger, not this cache, says what is posted.
        self._cache.clear()
        report = self.store.reconcile()
        log.info("ledger_reconciled", **asdict(report))
        if self.admin_log is None:
            self.admin_log = AdminLog(s, dead_letters=False)
        admin_log = self.admin_log
        consumer = KafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            group_id=self.consumer_name,
            client_id=f"{self.consumer_name}-{threading.get_ident()}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.writer_batch_max,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        producer = KafkaProducer(bootstrap_servers=s.kafka_bootstrap_servers, linger_ms=20)
        writer = self

        class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                writer._cache.clear()  # another writer may post these jobs now

            def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                writer._seek_to_stored(consumer, assigned)

        # Dead letters of the batch in hand. `flush` waits until each is done, delivered or not;
        # each is checked before the offsets are saved, so a letter the broker did not take fails
        # the batch (the loop retries it from the saved offsets) instead of being passed by.
        letters: list[FutureRecordMetadata] = []

        def dead_letter(record: DeadLetter) -> None:
            letters.append(producer.send(s.dead_letter_topic, value=record.to_json()))

        if s.writer_mode == "group":
            consumer.subscribe([self.topic], listener=_Rebalance())
        else:
            # The only writer (always so with embedded chDB): take every partition, no group
            # coordination, no rebalances, nothing that can stall on a missed heartbeat.
            partitions = wait_for_partitions(consumer, self.topic)
            consumer.assign(partitions)
            self._seek_to_stored(consumer, partitions)
        self.last_error = None  # Kafka answers again: a failure before is over (no batch may come)
        try:
            while not stop.is_set():
                records = self._take(consumer, stop)
                if records:
                    with WRITER_BATCH_SECONDS.time(), self.posting_lock:
                        admin_log.catch_up()
                        self.post_batch(records, dead_letter, admin_log.timeline())
                        producer.flush()
                        for letter in letters:
                            letter.get(timeout=0)  # raises what kept it from the broker
                        letters.clear()
                        next_offsets: dict[int, int] = {}
                        for partition, offset, _, _ in records:
                            next_offsets[partition] = max(next_offsets.get(partition, 0), offset + 1)
                        self.store.save_offsets(self.consumer_name, self.topic, next_offsets)
                    if s.writer_mode == "group":
                        consumer.commit_async()
                    self.batches += 1
                    self.last_error = None  # posting again: a failure before is over
                self._update_lag(consumer)
        finally:
            consumer.close(autocommit=False)
            producer.close(timeout=5)
            if self._owns_admin_log:
                admin_log.close()
                self.admin_log = None

    def _seek_to_stored(self, consumer: KafkaConsumer, partitions: Iterable[TopicPartition]) -> None:
        """Resume from the offsets saved beside the ledger, not from Kafka's committed ones."""
        stored = self.store.offsets(self.consumer_name, self.topic)
        for tp in partitions:
            if tp.partition in stored:
                consumer.seek(tp, stored[tp.partition])
            else:
                consumer.seek_to_beginning(tp)

    def _take(
        self, consumer: KafkaConsumer, stop: threading.Event
    ) -> list[tuple[int, int, bytes | None, bytes]]:
        """Up to writer_batch_max records, waiting at most writer_batch_wait_ms for more."""
        s = self.settings
        deadline = time.monotonic() + s.writer_batch_wait_ms / 1000
        records: list[tuple[int, int, bytes | None, bytes]] = []
        while len(records) < s.writer_batch_max and not stop.is_set():
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0:
                break
            polled = consumer.poll(timeout_ms=wait_ms, max_records=s.writer_batch_max - len(records))
            for tp_records in polled.values():
                records.extend((r.partition, r.offset, r.key, r.value) for r in tp_records)
        return records

    def _update_lag(self, consumer: KafkaConsumer) -> None:
        behind = self._lag.check(consumer, list(consumer.assignment()))
        for tp, lag in (behind or {}).items():
            WRITER_LAG_RECORDS.labels(partition=str(tp.partition)).set(lag)
