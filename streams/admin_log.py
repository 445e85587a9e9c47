"""The admin log on Kafka: publish admin events, and fold the topic into an `AdminState`.

The topic has one partition, so every reader folds the same events in the same order. Readers
hold the whole state in memory (an institute's organisation, budgets and agreements are small)
and catch up to the end of the topic before they answer or post: the API before every command
and read, the ledger writer before every batch, so that a policy published before a batch prices
that batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.metrics import ADMIN_EVENTS_APPLIED, ADMIN_EVENTS_REFUSED, ADMIN_LOG, register
from allmende.core.settings import Settings
from allmende.domain.admin_state import AdminState
from allmende.domain.charging import PolicyTimeline
from allmende.schemas.admin_events import AdminEvent, encode_admin_event, parse_admin_event
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import ContractError

log = structlog.get_logger(__name__)


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
                bootstrap_servers=self.settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True
            )
        return self._producer

    def catch_up(self, timeout: float = 30.0) -> AdminState:
        """Fold every record up to the end of the topic as it is now; returns the state."""
        with self._lock:
            folded = read_to_end(
                self._consumer_for(), self._tp, lambda r: self._fold(r.offset, r.key, r.value), timeout
            )
            if folded:
                self._view = self._state.copy()
            return self._view

    def _fold(self, offset: int, key: bytes | None, value: bytes) -> None:
        try:
            event = parse_admin_event(value)
        except ContractError as exc:
            ADMIN_EVENTS_REFUSED.inc()
            log.warning("admin_event_refused", reason=exc.reason, offset=offset)
            if self._dead_letters:
                record = DeadLetter.of(
                    stage="admin-log", reason=exc.reason, topic=self.topic, partition=0, offset=offset,
                    key=key, value=value,
                )  # fmt: skip
                self._producer_for().send(self.settings.dead_letter_topic, value=record.to_json())
            return
        try:
            if self._state.apply(event):
                ADMIN_EVENTS_APPLIED.inc()
        except KeyError as exc:
            # Only a writer that skipped the rules can put this on the log; keep folding the rest.
            log.error("admin_event_unappliable", event_id=event.event_id, missing=str(exc), offset=offset)

    def publish(self, events: Sequence[AdminEvent], timeout: float = 30.0) -> None:
        """Append events (acknowledged by all replicas), then fold them in."""
        with self._lock:
            producer = self._producer_for()
            futures = [
                producer.send(self.topic, key=e.aggregate.encode(), value=encode_admin_event(e), partition=0)
                for e in events
            ]
            for future in futures:
                future.get(timeout=timeout)
            self.catch_up(timeout)

    def timeline(self) -> PolicyTimeline:
        """The charge policy timeline, rebuilt only when a policy was added."""
        with self._lock:
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
