"""A batch whose INSERT landed but answered an error is not posted twice (issue 22, outages).

With a ClickHouse server, an INSERT can be written and its answer lost (a timeout, a dropped
connection). The writer then fails the batch and reads it again from its saved offsets; what it
posts the second time must be measured against the ledger, not against what it remembered.
On the real broker and chDB, with a store that writes the first batch and then raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from kafka import KafkaProducer

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.metering import JobMeter
from allmende.domain.postings import Posting
from allmende.domain.traces import TraceFormat, job_events
from allmende.schemas.ledger import encode_entries
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.harness import wait_until

pytestmark = pytest.mark.integration


class LandsThenFails(LedgerStore):
    """Writes the first batch of postings, then raises as if its answer had been lost."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.failed = 0

    def append(self, postings: Sequence[Posting]) -> None:
        super().append(postings)
        if postings and not self.failed:
            self.failed += 1
            raise ConnectionError("the INSERT's answer was lost")


def test_a_batch_that_landed_but_failed_is_not_posted_again(
    settings: Settings, elasticflow_tarball: Path
) -> None:
    jobs = list(read_trace(elasticflow_tarball, TraceFormat.ELASTICFLOW, cluster="cluster10", limit=30))
    meters = {job.job_id: JobMeter(job.job_id) for job in jobs}
    records = []
    for job in jobs:
        for event in job_events(job, 600):
            meters[job.job_id].apply(event)
        records.append((job.job_id.encode(), encode_entries(meters[job.job_id].entries())))
    want = sum(m.gpu_seconds() for m in meters.values())

    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    ensure_topics(settings)
    store = LandsThenFails(db)
    writer = LedgerWriter(settings, store)
    writer.start()
    try:
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        for key, value in records:
            producer.send(settings.ledger_entries_topic, key=key, value=value)
        producer.flush()
        producer.close()
        wait_until(lambda: store.failed and writer.batches > 0, 120, "the failed batch, then a good one")
        wait_until(lambda: store.total_gpu_seconds() >= want, 60, "the ledger")
    finally:
        writer.stop()
    assert store.failed == 1
    assert store.total_gpu_seconds() == want  # not twice the first batch
    assert store.reconcile().duplicate_postings == 0
