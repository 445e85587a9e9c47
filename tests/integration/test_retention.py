"""Memory bounded by what is live (issue 29): the meter lets go of a finished job once its
partition's stream is one retention period past it, deletes it from its table's changelog (a
recovering worker does not load it), tells the ledger-entry readers its entries are final, and
dead-letters a later event of it; the ledger stays exact throughout.

Real meter worker, ledger writer, broker and chDB. The retention is an hour of the stream's own
time (fictional instants), so nothing waits for the wall clock.
"""

from __future__ import annotations

import re

import orjson
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from allmende.core.settings import Settings
from allmende.domain.traces import TraceJob, job_events
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import FinishStatus, JobEvent, JobFinished, JobUsageSample
from allmende.schemas.ledger import retired_job
from allmende.testing.harness import Pipeline, send_events, wait_until

pytestmark = pytest.mark.integration
R = 3600
T = 1_790_000_000  # September 2026: well before the wall clock
SAMPLE_EVERY_S = 300


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"ended_job_retention_s": R})


def _on_partition(prefix: str, partition: int, partitions: int, n: int) -> list[str]:
    """`n` job ids whose events go to `partition` (the producers' murmur2 on the key)."""
    found, i = [], 0
    while len(found) < n:
        job_id = f"{prefix}-{i}"
        if (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions == partition:
            found.append(job_id)
        i += 1
    return found


def _job(job_id: str, start: int, duration: int) -> TraceJob:
    return TraceJob(
        job_id, "retain", "ada", "rc1", "H100", 4, start - 60, start, duration, FinishStatus.SUCCEEDED
    )


def _records(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        found: list[tuple[bytes | None, bytes | None]] = []
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for records in consumer.poll(timeout_ms=500).values():
                found.extend((r.key, r.value) for r in records)
        return found
    finally:
        consumer.close()


def _letters(settings: Settings) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(v) for _, v in _records(settings, settings.dead_letter_topic) if v]


def test_a_finished_job_is_let_go_of_after_the_retention_and_its_late_events_change_nothing(
    settings: Settings, pipeline: Pipeline
) -> None:
    old, later = _on_partition("retire", 0, settings.topic_partitions, 2)
    first = _job(old, T, 1800)
    second = _job(later, T + 1800 + R + 60, 600)  # its events move the partition's clock past old's retention
    pipeline.declare([first, second])
    pipeline.start_meter()
    first_events = list(job_events(first, SAMPLE_EVERY_S))
    send_events(settings, first_events)
    wait_until(
        lambda: pipeline.store.job_gpu_seconds().get(old) == first.gpu_seconds, 60, "the first job charged"
    )

    send_events(settings, job_events(second, SAMPLE_EVERY_S))
    wait_until(
        lambda: pipeline.store.job_gpu_seconds().get(later) == second.gpu_seconds, 60, "the second job"
    )

    # The meter let go of the first job: a tombstone on its table's changelog, a `retired` record
    # after the job's entries on the ledger-entry topic.
    changelog = f"{settings.meter_app_id}-meter-state-changelog"
    wait_until(lambda: (old.encode(), None) in _records(settings, changelog), 60, "the tombstone")
    entries = [(k, v) for k, v in _records(settings, settings.ledger_entries_topic) if k == old.encode()]
    assert retired_job(entries[-1][1]) == old
    assert [retired_job(v) for _, v in entries].count(old) == 1
    assert orjson.loads(entries[-1][1])["at"] >= first.start_at + first.duration_s + R

    # A copy of its last event, and an event that would change it: both dead-lettered as
    # `retired`, neither charged.
    copy = next(e for e in first_events if isinstance(e, JobFinished))
    change = JobUsageSample(
        event_id=f"{old}:late-sample", occurred_at=T + 900, producer="test", job_id=old,
        gpus_in_use=8, gpu_utilization=1.0,
    )  # fmt: skip
    send_events(settings, [copy, change])
    wait_until(lambda: _refused_ids(settings) == {copy.event_id, change.event_id}, 60, "two dead letters")
    letters = [d for d in _letters(settings) if d.code == "retired"]
    assert len(letters) == 2
    assert all(old in d.reason and "ALLMENDE_ENDED_JOB_RETENTION_S" in d.reason for d in letters)

    # A worker started again recovers the table without the job: a copy is late there too. (Once
    # the worker committed past them: events it metered but did not commit come again first.)
    wait_until(lambda: _committed_to_end(settings), 30, "the meter's commit")
    pipeline.meters[0].kill()
    restarted = pipeline.start_meter()
    again: JobEvent = next(e for e in first_events if isinstance(e, JobUsageSample))
    send_events(settings, [again])
    wait_until(lambda: again.event_id in _refused_ids(settings), 90, "the copy dead-lettered")
    # It indexed what it recovered: the second job alone.
    indexed = re.findall(r"meter_table_indexed\s.*?jobs=(\d+)", restarted.log_path.read_text())
    assert indexed and indexed[0] == "1", indexed
    seconds = pipeline.store.job_gpu_seconds()
    assert (seconds[old], seconds[later]) == (first.gpu_seconds, second.gpu_seconds)


def _refused_ids(settings: Settings) -> set[str]:
    """The event ids of the job events dead-lettered as `retired`."""
    return {orjson.loads(d.original_value())["event_id"] for d in _letters(settings) if d.code == "retired"}


def _committed_to_end(settings: Settings) -> bool:
    """The meter's consumer group has committed every job event on the topic (asked as the group,
    without joining it)."""
    bootstrap, group = settings.kafka_bootstrap_servers, settings.meter_app_id
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        topic = settings.job_events_topic
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        ends = consumer.end_offsets(partitions)
        return all(end == 0 or (consumer.committed(tp) or 0) >= end for tp, end in ends.items())
    finally:
        consumer.close(autocommit=False)
