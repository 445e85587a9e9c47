"""A topic consumer that writes to ClickHouse and keeps its offsets there, beside what it wrote.

The ledger, decision and preemption writers are all this: a thread that reads its topic from the
offsets saved in `ingest_offsets` (never Kafka's committed ones), writes a batch, then saves the
offsets past it, so a crash between the two reads the batch again and never skips it; after a
failure (Kafka or ClickHouse away) it starts again from those offsets. What a writer does with a
batch comes from its `session`: a context opened for each run (what the run needs beside the
consumer: a producer, a reconciled ledger) that gives the function writing one batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.producer.future import FutureRecordMetadata
from prometheus_client import Gauge

from allmende.core.kafka_reading import LagWatch, wait_for_partitions
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.schemas.dead_letter import DeadLetter

log = structlog.get_logger(__name__)
RETRY_S = 2.0  # the wait before `run` starts again after a failure
# Offsets of batches that wrote nothing are saved at most this often: each save is an insert (a
# part for ClickHouse to merge), and a writer that filters (preemptions) writes nothing in most
# batches. A crash reads those records again, which writes nothing again.
IDLE_SAVE_EVERY_S = 10.0


Write = Callable[[Sequence[Any]], object]  # writes a batch of consumer records, then their offsets


class DeadLetters:
    """A writer's refusals, sent to the dead-letter topic; `confirm` before the offsets are saved.

    `confirm` waits until each letter of the batch is done, delivered or not, and raises what kept
    one from the broker: the batch then fails and is read again from the saved offsets, so a
    refusal is never passed by unrecorded.
    """

    def __init__(self, settings: Settings) -> None:
        self._topic = settings.dead_letter_topic
        self._producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, linger_ms=20)
        self._letters: list[FutureRecordMetadata] = []

    def send(self, record: DeadLetter) -> None:
        self._letters.append(self._producer.send(self._topic, value=record.to_json()))

    def confirm(self) -> None:
        if not self._letters:
            return
        self._producer.flush()
        for letter in self._letters:
            letter.get(timeout=0)  # raises what kept it from the broker
        self._letters.clear()

    def close(self) -> None:
        self._producer.close(timeout=5)


class OffsetsBesideData:
    thread_name = "writer"  # the thread's name, and the log event of a failure (`<name>_failed`)

    def __init__(
        self,
        settings: Settings,
        store: LedgerStore,
        topic: str,
        consumer_name: str,
        session: Callable[[], AbstractContextManager[Write]],
        *,
        on_revoked: Callable[[], None] | None = None,
        lag_gauge: Gauge | None = None,
        **consumer_options: int,
    ) -> None:
        self.settings = settings
        self.store = store
        self.topic = topic
        self.consumer_name = consumer_name
        self._session = session
        self._on_revoked = on_revoked  # partitions went to another writer (group mode)
        self._lag_gauge = lag_gauge  # records behind per partition, if a metric shows it
        self._consumer_options = consumer_options
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lag = LagWatch()
        self.caught_up = self._lag.caught_up
        self.batches = 0
        self.last_error: str | None = None
        self._unsaved: dict[int, int] = {}  # offsets past batches that wrote nothing, not yet saved
        self._saved_at = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run_forever, args=(self._stop,), name=self.thread_name, daemon=True
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
            except Exception as exc:  # keep the process alive; Kafka or ClickHouse may come back
                self.last_error = repr(exc)
                log.exception(f"{self.thread_name.replace('-', '_')}_failed", error=repr(exc))
                stop.wait(RETRY_S)

    def run(self, stop: threading.Event) -> None:
        """Read the topic from the stored offsets and write what comes, until `stop`."""
        self._unsaved = {}  # read again from the stored offsets
        with self._session() as write:
            consumer = self._consumer(**self._consumer_options)
            try:
                self._attach(consumer)
                self.last_error = None  # Kafka answers again: a failure before is over
                while not stop.is_set():
                    records = self._take(consumer, stop)
                    if records:
                        write(records)
                        if self.settings.writer_mode == "group":
                            consumer.commit_async()  # for lag dashboards only
                        self.last_error = None  # writing again: a failure before is over
                    behind = self._lag.check(consumer, list(consumer.assignment()))
                    if self._lag_gauge is not None:
                        for tp, lag in (behind or {}).items():
                            self._lag_gauge.labels(partition=str(tp.partition)).set(lag)
            finally:
                consumer.close(autocommit=False)

    def _save_offsets(self, records: Sequence[Any], wrote: bool = True) -> None:
        """The offsets past `records`, saved once what they hold is written: a crash between the
        two reads them again, never skips them. After a batch that wrote nothing (`wrote`
        False) they are saved only every IDLE_SAVE_EVERY_S, or with the next batch that writes."""
        next_offsets = self._unsaved
        for record in records:
            next_offsets[record.partition] = max(next_offsets.get(record.partition, 0), record.offset + 1)
        self.batches += 1
        now = time.monotonic()
        if not wrote and now - self._saved_at < IDLE_SAVE_EVERY_S:
            return
        self.store.save_offsets(self.consumer_name, self.topic, next_offsets)
        self._unsaved, self._saved_at = {}, now

    def _consumer(self, **extra: Any) -> KafkaConsumer:
        s = self.settings
        return KafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            group_id=self.consumer_name,
            client_id=f"{self.consumer_name}-{threading.get_ident()}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.writer_batch_max,
            isolation_level="read_committed",  # an aborted admission transaction is no history
            **extra,
        )

    def _attach(self, consumer: KafkaConsumer) -> None:
        """Read the topic from the stored offsets: in a group of writers (`writer_mode` group:
        one per partition, sought to on each assignment), else every partition (always so with
        embedded chDB: no group coordination, nothing that can stall on a missed heartbeat)."""
        writer = self

        class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                if writer._on_revoked is not None:
                    writer._on_revoked()

            def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                writer._seek_to_stored(consumer, assigned)

        if self.settings.writer_mode == "group":
            consumer.subscribe([self.topic], listener=_Rebalance())
        else:
            partitions = wait_for_partitions(consumer, self.topic)
            consumer.assign(partitions)
            self._seek_to_stored(consumer, partitions)

    def _seek_to_stored(self, consumer: KafkaConsumer, partitions: Iterable[TopicPartition]) -> None:
        """Resume from the offsets saved beside the data, not from Kafka's committed ones."""
        stored = self.store.offsets(self.consumer_name, self.topic)
        for tp in partitions:
            if tp.partition in stored:
                consumer.seek(tp, stored[tp.partition])
            else:
                consumer.seek_to_beginning(tp)

    def _take(self, consumer: KafkaConsumer, stop: threading.Event) -> list[Any]:
        """Up to writer_batch_max records, waiting at most writer_batch_wait_ms for more."""
        s = self.settings
        deadline = time.monotonic() + s.writer_batch_wait_ms / 1000
        records: list[Any] = []
        while len(records) < s.writer_batch_max and not stop.is_set():
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0:
                break
            polled = consumer.poll(timeout_ms=wait_ms, max_records=s.writer_batch_max - len(records))
            for tp_records in polled.values():
                records.extend(tp_records)
        return records
