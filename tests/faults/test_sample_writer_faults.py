"""The sample writer under faults (issue 24): ClickHouse away fails the batch, which is read again
from the offsets saved beside the rows, with no dead letter sent twice; a writer started again
resumes where the last one saved. On the real broker and chDB."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from kafka import KafkaProducer

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.domain.gpu_utilisation import IdleRow, UnaccountedRow
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id
from allmende.streams.sample_writer import SampleWriter
from allmende.testing.harness import read_topic, wait_until

pytestmark = pytest.mark.integration

T0 = 1_800_000_000


class AwayOnce(LedgerStore):
    """ClickHouse away for the first batch of rows: the INSERT raises, nothing lands."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.failed = 0

    def append_idle(self, rows: Sequence[IdleRow], unaccounted: Sequence[UnaccountedRow] = ()) -> None:
        if rows and not self.failed:
            self.failed += 1
            raise ConnectionError("ClickHouse is away")
        super().append_idle(rows, unaccounted)


def _publish(settings: Settings, jobs: range, rounds: range) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    for r in rounds:
        for j in jobs:
            at = T0 + 30 * r
            record = GpuSamples(
                event_id=sample_id(f"n{j}", at, f"job-{j}"), occurred_at=at, producer="t", node=f"n{j}",
                job_id=f"job-{j}", interval_s=30,
                gpus=tuple(GpuSample(gpu=g, utilization_bp=10) for g in range(8)),
            )  # fmt: skip
            producer.send(settings.gpu_samples_topic, key=record.key, value=encode_gpu_samples(record))
    producer.send(settings.gpu_samples_topic, key=b"job-0", value=b"{not json")
    producer.flush()
    producer.close()


def _rows(db: Database) -> int:
    return int(db.rows("SELECT count() FROM {db}.gpu_idle FINAL")[0][0])


def test_clickhouse_away_fails_the_batch_which_is_written_once_and_a_restart_resumes(
    settings: Settings,
) -> None:
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    ensure_topics(settings)
    store = AwayOnce(db)
    _publish(settings, range(20), range(1, 11))
    writer = SampleWriter(settings, store)
    writer.start()
    try:
        wait_until(lambda: _rows(db) == 200, 120, "every row, after the failed batch")
        assert store.failed == 1 and writer.last_error is None
    finally:
        writer.stop()
    saved = store.offsets(writer.consumer_name, writer.topic)
    assert sum(saved.values()) == 201  # every record's fate recorded, the bad one's too
    # A second writer of the same name starts from the saved offsets: it reads the new rounds only.
    _publish(settings, range(20), range(11, 16))
    again = SampleWriter(settings, LedgerStore(db))
    again.start()
    try:
        wait_until(lambda: _rows(db) == 300, 120, "the new rounds")
        wait_until(lambda: again.batches > 0, 30, "a batch")
    finally:
        again.stop()
    assert sum(store.offsets(again.consumer_name, again.topic).values()) == 201 + 101
    letters = [
        DeadLetter.model_validate_json(v)
        for v in read_topic(settings, settings.dead_letter_topic, 3, timeout=10)
    ]
    # one per bad record (two were sent), none twice although the first batch was read again
    assert [(d.stage, d.code) for d in letters] == [("sample-writer", "contract")] * 2
