"""The broker stopped while the meter is behind, then started again: the ledger exact (issue 22).

A whole ElasticFlow cluster's events are on the job-events topic before the meter worker starts,
so the worker (and the ledger writer after it) has a backlog to work through. Once part of the
ledger, not all, is written, the broker is stopped for about 10 s and started again on the same
data. Nothing is restarted by the test: the meter worker (its own process) and the ledger writer
(a thread here) must carry on by themselves, and the ledger must then hold every job's
GPU-seconds exactly once. How long recovery took is printed (run with `-s`).

The broker is the test's own (stopped and started again on the same data), not the session's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from allmende.core.clickhouse import Database
from allmende.core.kafka_local import LocalBroker, free_port
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, publish, timeline
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.harness import Pipeline, wait_until
from allmende.testing.tagged_settings import tagged_settings
from tests.integration.test_pipeline import (
    SAMPLE_EVERY_S,
    _assert_idle_exact,
    _expected_per_job,
    _jobs,
    _wait_ledger,
)

pytestmark = pytest.mark.integration
CLUSTER = "cluster01"  # 1,595 jobs, about 38,000 events: seconds of work for the meter
DOWN_S = 10.0


@pytest.fixture
def pipeline(broker: LocalBroker, chdb_dsn: str, tmp_path: Path) -> Iterator[Pipeline]:
    """What tests/integration/conftest.py's `pipeline` is, on the test's own broker."""
    settings = tagged_settings(broker.bootstrap, chdb_dsn, tmp_path)
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    ensure_topics(settings)
    store = LedgerStore(db)
    writer = LedgerWriter(settings, store)
    writer.start()
    running = Pipeline(settings, store, writer, tmp_path / "logs")
    try:
        yield running
    finally:
        for worker in running.meters:
            worker.kill()
        writer.stop()


def test_the_broker_stopped_with_the_meter_behind_and_started_again_leaves_the_ledger_exact(
    broker: LocalBroker, pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    jobs = _jobs(elasticflow_tarball, CLUSTER)
    pipeline.declare(jobs)
    expected = _expected_per_job(jobs)
    want = sum(expected.values())
    producer = make_producer(settings.kafka_bootstrap_servers)
    events = publish(producer, settings.job_events_topic, timeline(jobs, SAMPLE_EVERY_S))
    producer.close()
    # Every event is on the topic before the worker reads any: it starts behind by all of them.
    worker = pipeline.start_meter(metrics_port=free_port())

    wait_until(lambda: store.total_gpu_seconds() > 0, 180, "the first postings")
    stopping = time.monotonic()
    broker.stop()
    stopped = time.monotonic()
    at_stop, metered = store.total_gpu_seconds(), _metered(worker.metrics_port)
    behind = _lag(worker.metrics_port)
    assert 0 < at_stop < want, f"not partway: {at_stop} of {want} GPU-s"
    assert metered < events, f"the meter was not behind: {metered} of {events} events metered"
    assert sum(behind.values()) > 0, f"its lag metric did not say so: {behind}"
    time.sleep(max(0.0, DOWN_S - (time.monotonic() - stopped)))
    assert store.total_gpu_seconds() < want  # nothing reaches the ledger while the broker is away
    assert not worker.died(), worker.log_tail()

    starting = time.monotonic()
    broker.start()
    ready = time.monotonic()
    wait_until(lambda: store.total_gpu_seconds() > at_stop, 180, "the ledger to move again")
    moving = time.monotonic()
    ledger = _wait_ledger(store, expected)
    exact = time.monotonic()

    assert ledger == expected  # no job lost, none counted twice
    _assert_idle_exact(store, jobs)
    assert not worker.died(), worker.log_tail()  # carried on by itself: never restarted
    assert len(pipeline.meters) == 1 and pipeline.writer.last_error is None
    wait_until(lambda: set(_lag(worker.metrics_port).values()) == {0}, 30, "the lag metric at 0")
    print(
        f"\n{events} events, {len(jobs)} jobs, {want} GPU-s. At the stop: {metered} events metered,"
        f" {at_stop / want:.0%} of the GPU-s in the ledger; stop took {stopped - stopping:.1f} s, down"
        f" {starting - stopped:.1f} s, start took {ready - starting:.1f} s. From the start: ledger moving"
        f" in {moving - starting:.1f} s, exact in {exact - starting:.1f} s (ready +{exact - ready:.1f} s)"
    )


def _samples(port: int, name: str) -> list[Sample]:
    """The worker's own /metrics (served without Kafka): the samples of one metric."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _metered(port: int) -> int:
    """Job events the worker has metered."""
    return int(sum(s.value for s in _samples(port, "allmende_meter_events_total")))


def _lag(port: int) -> dict[str, int]:
    """Per partition, the events after the last one the worker metered."""
    return {s.labels["partition"]: int(s.value) for s in _samples(port, "allmende_meter_lag_records")}
