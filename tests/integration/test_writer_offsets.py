"""Where the writers keep their offsets (the real chDB): beside what they wrote, and for batches
that wrote nothing (a preemption writer's usual batch: no preemption among the job events) only
every IDLE_SAVE_EVERY_S or with the next batch that writes, never past a record not yet read."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.schemas.events import JobPreempted, encode_event
from allmende.streams import offsets_beside_data
from allmende.streams.preemption_writer import PreemptionWriter

pytestmark = pytest.mark.integration


class Record(NamedTuple):
    partition: int
    offset: int
    value: bytes


def _reading(partition: int, offset: int) -> Record:
    return Record(partition, offset, b'{"type":"JobUsageSample"}')


def _preempted(partition: int, offset: int, job: str) -> Record:
    event = JobPreempted(
        event_id=f"{job}-p", occurred_at=1_800_000_000, producer="t", job_id=job, reason="test"
    )
    return Record(partition, offset, encode_event(event))


def test_offsets_of_batches_that_wrote_nothing_wait_for_a_write_or_the_interval(
    settings: Settings, store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = PreemptionWriter(settings, store)
    saved = lambda: store.offsets(writer.consumer_name, writer.topic)  # noqa: E731

    assert writer.write_batch([_reading(0, 0), _reading(1, 0)]) == 0
    assert saved() == {0: 1, 1: 1}  # the first save is due at once
    assert writer.write_batch([_reading(0, 1), _reading(0, 2)]) == 0
    assert saved() == {0: 1, 1: 1}  # nothing written: kept until a write or the interval

    assert writer.write_batch([_preempted(1, 1, "j1")]) == 1
    assert saved() == {0: 3, 1: 2}  # with the write, the idle batch's offsets too
    rows = store.db.rows("SELECT job_id FROM {db}.job_preemptions FINAL")
    assert rows == [("j1",)]

    monkeypatch.setattr(offsets_beside_data, "IDLE_SAVE_EVERY_S", 0.0)
    assert writer.write_batch([_reading(0, 3)]) == 0
    assert saved() == {0: 4, 1: 2}  # the interval passed
