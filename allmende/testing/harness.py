"""Test harness: run the real pieces (meter worker processes, ledger writer) and wait on them."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer

from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, publish
from allmende.core.settings import Settings
from allmende.core.supervisor import wait_until as wait_until  # the tests wait with it
from allmende.domain.traces import TraceJob
from allmende.schemas.events import JobEvent
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.declared_plan import declare
from allmende.topology import MeterProcess

ROOT = Path(__file__).resolve().parents[2]


# The worker process is the production one (the simulator runs it too); the tests' name for it.
MeterWorker = MeterProcess


class Pipeline:
    """The running pipeline of one test: its settings, ledger, writer and meter workers."""

    def __init__(self, settings: Settings, store: LedgerStore, writer: LedgerWriter, logs: Path) -> None:
        self.settings = settings
        self.store = store
        self.writer = writer
        self.logs = logs
        self.meters: list[MeterWorker] = []

    def declare(self, jobs: Iterable[TraceJob | JobEvent]) -> None:
        """Declare the projects and clusters of `jobs` on the admin log (the meter checks events
        against the plan), before their events are sent."""
        declare(self.settings, jobs)

    def start_meter(self, metrics_port: int = 0) -> MeterWorker:
        worker = MeterWorker(self.settings, self.logs, metrics_port=metrics_port)
        self.meters.append(worker)
        worker.wait_ready()
        return worker


def send_events(settings: Settings, events: Iterable[JobEvent]) -> int:
    producer = make_producer(settings.kafka_bootstrap_servers)
    try:
        return publish(producer, settings.job_events_topic, events)
    finally:
        producer.close()


def send_raw(settings: Settings, items: Iterable[tuple[bytes | None, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    for key, value in items:
        producer.send(settings.job_events_topic, key=key, value=value)
    producer.flush()
    producer.close()


def read_topic(settings: Settings, topic: str, count: int, timeout: float = 60.0) -> list[bytes]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=1000,
        isolation_level="read_committed",
    )
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            values.extend(m.value for m in consumer)
    finally:
        consumer.close()
    return values
