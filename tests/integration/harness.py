"""Test harness: run the real pieces (meter worker processes, ledger writer) and wait on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from kafka import KafkaConsumer, KafkaProducer

from allmende.replay import make_producer, publish
from allmende.settings import Settings
from schemas.events import JobEvent
from services.ledger_store import LedgerStore
from services.ledger_writer import LedgerWriter

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def env_for(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "ALLMENDE_TOPIC_PREFIX": settings.topic_prefix,
        "ALLMENDE_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "ALLMENDE_METER_APP_ID": settings.meter_app_id,
        "ALLMENDE_METER_DATA_DIR": str(settings.meter_data_dir),
        "ALLMENDE_LOG_LEVEL": "INFO",
        "ALLMENDE_LOG_JSON": "false",
    }


class MeterWorker:
    """One `streams.worker` process, as `allmende worker` runs it."""

    def __init__(self, settings: Settings, log_dir: Path, name: str = "meter", metrics_port: int = 0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.metrics_port = metrics_port  # 0: none (several workers of a test would share one)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.worker"],
            cwd=ROOT,
            env={**env_for(settings), "ALLMENDE_METER_METRICS_PORT": str(metrics_port)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        wait_until(
            lambda: b"Worker ready" in self.log_path.read_bytes() or self._died(),
            timeout,
            f"meter worker ready ({self.log_path})",
        )
        if self._died():
            raise AssertionError(f"meter worker exited: {self.log_path.read_text()[-3000:]}")

    def _died(self) -> bool:
        return self.proc.poll() is not None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self._log.close()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


class Pipeline:
    """The running pipeline of one test: its settings, ledger, writer and meter workers."""

    def __init__(self, settings: Settings, store: LedgerStore, writer: LedgerWriter, logs: Path) -> None:
        self.settings = settings
        self.store = store
        self.writer = writer
        self.logs = logs
        self.meters: list[MeterWorker] = []

    def start_meter(self, metrics_port: int = 0) -> MeterWorker:
        worker = MeterWorker(self.settings, self.logs, metrics_port=metrics_port)
        self.meters.append(worker)
        worker.wait_ready()
        return worker


def wait_until(check: Callable[[], T], timeout: float, what: str, every: float = 0.25) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


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
    )
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            values.extend(m.value for m in consumer)
    finally:
        consumer.close()
    return values
