"""The admin log on Kafka: publish admin events, and fold the topic into an `AdminState`.

The topic has one partition, so every reader folds the same events in the same order. Readers
hold the whole state in memory (an institute's organisation, budgets and agreements are small)
and catch up to the end of the topic before they answer or post: the API before every command
and read, the ledger writer before every batch, so that a policy published before a batch prices
that batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from allmende.core.kafka_reading import appended_late, read_to_end, record_by_header, replaying_consumer
from allmende.core.metrics import ADMIN_EVENTS_APPLIED, ADMIN_EVENTS_REFUSED, ADMIN_LOG, register
from allmende.core.settings import Settings
from allmende.domain.admin_state import AdminState
from allmende.domain.charging import PolicyTimeline
from allmende.schemas.admin_events import AdminEvent, encode_admin_event, parse_admin_event
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import ContractError

log = structlog.get_logger(__name__)


class NotRecorded(RuntimeError):
    """The admin log did not take a command's events in time (Kafka away): they have no effect,
    now or later (appended late, they are void); the same command again is safe."""


class AdminLog:
    """One reader (and writer) of the admin topic; thread-safe."""

    def __init__(self, settings: Settings, *, dead_letters: bool = True) -> None:
        register(ADMIN_LOG)
        self.settings = settings
        self.topic = settings.admin_events_topic
        self._tp = TopicPartition(self.topic, 0)
        self._dead_letters = dead_letters
        self._lock = threading.RLock()
        self._consumer: KafkaConsumer | None = None
        self._producer: KafkaProducer | None = None
        self._state = AdminState()
        self._view = AdminState()  # a copy readers may hold while the fold goes on
        self._timeline: PolicyTimeline | None = None
        self._policies_seen = -1
        self._caught_up_at: float | None = None  # wall clock of the last catch-up to the end
        self._timeline_lock = threading.Lock()

    @property
    def state(self) -> AdminState:
        """A consistent snapshot of the state (replaced, never changed, by the next catch-up)."""
        return self._view

    def _consumer_for(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer, _ = replaying_consumer(self.settings.kafka_bootstrap_servers, [self._tp])
        return self._consumer

    def _producer_for(self) -> KafkaProducer:
        if self._producer is None:
            self._producer = KafkaProducer(
                bootstrap_servers=self.settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True,
                # Kafka away: a send waits no longer for metadata than a command waits for its answer.
                max_block_ms=self.settings.write_timeout_ms,
            )  # fmt: skip
        return self._producer

    def catch_up(self, timeout: float = 30.0) -> AdminState:
        """Fold every record up to the end of the topic as it is now; returns the state."""
        deadline = time.monotonic() + timeout
        # Bounded wait for the lock too: another reader blocked on an away broker must not hold
        # this one past its own timeout.
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError(f"the admin log was being read by another caller for {timeout:.2f}s")
        try:
            left = max(0.001, deadline - time.monotonic())
            folded = read_to_end(self._consumer_for(), self._tp, self._fold, left)
            if folded:
                self._view = self._state.copy()
            self._caught_up_at = time.time()
            return self._view
        finally:
            self._lock.release()

    def read_state(self) -> AdminState:
        """For reads: caught up within `read_timeout_ms`, or (Kafka away) the state as last
        caught up; `age_s` says how old it is."""
        try:
            return self.catch_up(self.settings.read_timeout_ms / 1000)
        except Exception as exc:
            log.info("admin_state_stale", age_s=self.age_s(), error=repr(exc))
            return self._view

    def age_s(self) -> float | None:
        """Seconds since the state last reached the end of the log (None: never)."""
        return None if self._caught_up_at is None else max(0.0, time.time() - self._caught_up_at)

    def _fold(self, record: Any) -> None:
        offset, key, value = record.offset, record.key, record.value
        try:
            event = parse_admin_event(value)
        except ContractError as exc:
            ADMIN_EVENTS_REFUSED.inc()
            log.warning("admin_event_refused", reason=exc.reason, offset=offset)
            if self._dead_letters:
                record = DeadLetter.of(
                    stage="admin-log", reason=exc.reason, code="contract", topic=self.topic, partition=0,
                    offset=offset, key=key, value=value,
                )  # fmt: skip
                self._producer_for().send(self.settings.dead_letter_topic, value=record.to_json())
            return
        if appended_late(record):  # its command was answered 503: void
            log.info("admin_event_void", event_id=event.event_id, offset=offset)
            return
        try:
            if self._state.apply(event):
                ADMIN_EVENTS_APPLIED.inc()
        except KeyError as exc:
            # Only a writer that skipped the rules can put this on the log; keep folding the rest.
            log.error("admin_event_unappliable", event_id=event.event_id, missing=str(exc), offset=offset)

    def publish(self, events: Sequence[AdminEvent], timeout: float = 30.0) -> None:
        """Append events (acknowledged by all replicas) within `write_timeout_ms`, then fold them
        in. Not taken in time: NotRecorded, and they never take effect (`record_by`)."""
        timeout_ms = self.settings.write_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        # Appended a little before the answer is given up on (an acknowledgement on its way).
        record_by = time.time_ns() // 1_000_000 + timeout_ms - min(100, timeout_ms // 2)
        if not self._lock.acquire(timeout=timeout_ms / 1000):
            raise NotRecorded("the admin log is busy with a reader waiting on Kafka; send the command again")
        try:
            try:
                producer = self._producer_for()
                headers = record_by_header(record_by)
                futures = [
                    producer.send(self.topic, key=e.aggregate.encode(), value=encode_admin_event(e),
                                  partition=0, headers=headers)
                    for e in events
                ]  # fmt: skip
                for future in futures:
                    appended = future.get(timeout=max(0.001, deadline - time.monotonic())).timestamp
                    if appended > record_by:  # the broker's append time (LogAppendTime)
                        raise TimeoutError(f"appended at {appended} ms, after its record-by {record_by} ms")
            except Exception as exc:
                raise NotRecorded(f"the admin log did not take the command in time ({exc!r})") from exc
            self.catch_up(timeout)
        finally:
            self._lock.release()

    def timeline(self) -> PolicyTimeline:
        """The charge policy timeline, rebuilt only when a policy was added."""
        with self._timeline_lock:  # not the log's lock: a slow catch-up must not hold up pricing
            if self._policies_seen != len(self._view.policies) or self._timeline is None:
                self._timeline = self._view.timeline()
                self._policies_seen = len(self._view.policies)
            return self._timeline

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
