"""Poison records (issue 22): every record has one fate, counted or dead-lettered with its reason.

A seeded stream of real trace jobs' events, with bad records of every kind the meter refuses
mixed in on the same partitions (so in the same batches as good ones), goes through the real
meter worker and ledger writer on the real broker and chDB. The ledger must equal, job by job
and to the GPU-second, a replay of the valid events alone, and the dead-letter topic must hold
exactly one letter per bad record (matched by the source partition and offset the broker gave
it), each with its reason, each small enough for the topic. The same for the ledger writer's own
input, the ledger-entry topic.

Among the bad records, usage that cannot have happened (domain/usage_checks.py): a job of a project
or on a cluster the plan does not declare, of a GPU type its cluster lacks, on more GPUs than its
cluster has, a reading from beyond the meter's clock.
"""

from __future__ import annotations

import base64
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.metering import JobMeter
from allmende.domain.traces import TraceFormat, TraceJob, job_events
from allmende.schemas.admin_events import ClusterDeclared
from allmende.schemas.dead_letter import KEY_PREFIX_MAX, RECORD_MAX_BYTES, VALUE_PREFIX_MAX, DeadLetter
from allmende.schemas.events import JobEvent, JobFinished, JobSubmitted, JobUsageSample, encode_event
from allmende.schemas.ledger import LedgerEntry, encode_entries
from allmende.testing.declared_plan import plan_for
from allmende.testing.harness import Pipeline, read_topic, wait_until

pytestmark = pytest.mark.integration
SAMPLE_EVERY_S = 600
SEED = 22
EACH_KIND = 3  # bad records of each kind
OVERSIZED = 900_000  # characters of the oversized field: under the broker's 1 MB, as in issue 22


@dataclass(frozen=True, eq=False)
class Record:
    key: bytes | None
    value: bytes | None
    bad: str = ""  # the kind of bad record; "" for a valid one
    reason: str = ""  # what its dead letter's reason must say


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The meter's own clock skew (the shared fixture widens it for fictional 2027 instants), and a
    retention longer than the trace: a bad record long after its job would otherwise find the job
    let go of (dead-lettered as `retired`, or a conflicting submission taken for a new job's),
    depending on where the batches fall (tests/integration/test_retention.py covers that)."""
    default_skew = Settings.model_fields["clock_skew_s"].default
    decade = 10 * 365 * 86_400
    return settings.model_copy(update={"clock_skew_s": default_skew, "ended_job_retention_s": decade})


def _send(settings: Settings, topic: str, records: list[Record]) -> dict[tuple[int, int], Record]:
    """Send in order (idempotent producer: the order holds per partition); where each landed."""
    producer = KafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=5
    )
    try:
        futures = [(producer.send(topic, key=r.key, value=r.value), r) for r in records]
        producer.flush()
        placed = {}
        for future, record in futures:
            meta = future.get(timeout=60)
            placed[(meta.partition, meta.offset)] = record
        return placed
    finally:
        producer.close()


def _wait_ledger(store: LedgerStore, expected: dict[str, int], timeout: float = 180) -> dict[str, int]:
    want = sum(expected.values())
    wait_until(lambda: store.total_gpu_seconds() >= want, timeout, f"ledger to reach {want} GPU-s")
    # Settle: a double count would keep growing past the target.
    got = wait_until(lambda: (t := store.job_gpu_seconds()) and sum(t.values()) == want and t, 30, "settle")
    return {k: v for k, v in got.items() if v}


def _letters(settings: Settings, count: int) -> list[tuple[bytes, DeadLetter]]:
    """Every dead letter, once `count` have come; then a while longer, to see there are no more."""
    topic = settings.dead_letter_topic
    wait_until(
        lambda: len(read_topic(settings, topic, count, timeout=5)) >= count, 120, f"{count} dead letters"
    )
    raw = read_topic(settings, topic, count + 1, timeout=10)
    return [(r, DeadLetter.model_validate_json(r)) for r in raw]


def _assert_one_letter_per_bad_record(
    letters: list[tuple[bytes, DeadLetter]], placed: dict[tuple[int, int], Record], stage: str, topic: str
) -> None:
    bad = {at: r for at, r in placed.items() if r.bad}
    by_place = {(letter.source_partition, letter.source_offset): letter for _, letter in letters}
    assert len(by_place) == len(letters), "a record dead-lettered twice"
    assert by_place.keys() == bad.keys(), "dead letters are not exactly the bad records"
    for raw, letter in letters:
        record = bad[(letter.source_partition, letter.source_offset)]
        value = record.value or b""
        assert len(raw) <= RECORD_MAX_BYTES, record.bad
        assert (letter.stage, letter.source_topic) == (stage, topic)
        assert record.reason in letter.reason, (record.bad, letter.reason)
        assert letter.value_length == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
        assert letter.truncated == (len(value) > VALUE_PREFIX_MAX)
        assert letter.value_prefix() == value[:VALUE_PREFIX_MAX]
        assert letter.key_length == (None if record.key is None else len(record.key))
        if record.key is not None:
            assert letter.key_b64 is not None
            assert base64.b64decode(letter.key_b64) == record.key[:KEY_PREFIX_MAX]


def _jobs(tarball: Path, limit: int) -> list[TraceJob]:
    return list(read_trace(tarball, TraceFormat.ELASTICFLOW, cluster="cluster10", limit=limit))


# -- the meter's input: job events -----------------------------------------------------------------


def _valid(event: JobEvent) -> Record:
    return Record(event.job_id.encode(), encode_event(event))


def _bad_events(
    rng: random.Random, events: list[JobEvent]
) -> dict[str, Callable[[], tuple[JobEvent, Record]]]:
    """Makers of bad records, by kind; each returns the valid event it was made from and the record."""

    def pick(kind: type[JobEvent] | None = None) -> JobEvent:
        return rng.choice([e for e in events if kind is None or isinstance(e, kind)])

    def oversized() -> tuple[JobEvent, Record]:
        event = pick()
        data = orjson.loads(encode_event(event))
        data["producer"] = "p" * OVERSIZED
        return event, Record(event.job_id.encode(), orjson.dumps(data), "oversized", "at most 200 characters")

    def not_utf8() -> tuple[JobEvent, Record]:
        event = pick()
        raw = encode_event(event)
        if rng.random() < 0.5:  # a broken byte sequence inside a string of a real event
            cut = raw.index(b'"producer":"') + len(b'"producer":"')
            value = raw[:cut] + b"\xc3\x28\xff" + raw[cut:]
        else:  # garbage from the first byte
            value = b"\xff\xfe" + rng.randbytes(rng.randrange(10, 5_000))
        return event, Record(event.job_id.encode(), value, "not-utf8", "Invalid JSON")

    def truncated() -> tuple[JobEvent, Record]:
        event = pick()
        raw = encode_event(event)
        return event, Record(
            event.job_id.encode(), raw[: rng.randrange(1, len(raw) - 1)], "truncated", "Invalid JSON"
        )

    def wrong_type() -> tuple[JobEvent, Record]:
        event = pick()
        data = orjson.loads(encode_event(event))
        field, wrong = rng.choice(
            [
                ("occurred_at", str(event.occurred_at)),
                ("occurred_at", event.occurred_at + 0.5),
                ("job_id", 12345),
            ]
            + ([("gpus", str(data["gpus"]))] if "gpus" in data else [])
            + ([("gpu_utilization", "high")] if "gpu_utilization" in data else [])
        )
        data[field] = wrong
        return event, Record(event.job_id.encode(), orjson.dumps(data), "wrong-type", field)

    def end_before_start() -> tuple[JobEvent, Record]:
        event = pick()
        at = event.occurred_at
        finished = JobFinished(
            event_id=f"{event.event_id}:bad-end", occurred_at=at, producer="fuzz", job_id=event.job_id,
            status="failed", started_at=at + rng.randrange(1, 86_400),
        )  # fmt: skip
        return event, Record(
            event.job_id.encode(), encode_event(finished), "end-before-start", "is after occurred_at"
        )

    def duplicate() -> tuple[JobEvent, Record]:
        # The job's submission again under another event id: refused once the first is known.
        event = pick(JobSubmitted)
        again = event.model_copy(update={"event_id": f"{event.event_id}:again"})
        return event, Record(
            event.job_id.encode(), encode_event(again), "duplicate", "already has JobSubmitted"
        )

    def key_not_job() -> tuple[JobEvent, Record]:
        event, other = pick(), pick()
        key = b"not-" + other.job_id.encode()
        return event, Record(key, encode_event(event), "key-not-job-id", "is not the job id")

    def tombstone() -> tuple[JobEvent, Record]:
        event = pick()
        return event, Record(event.job_id.encode(), None, "no-value", "no value")

    # Usage that cannot have happened: each a new job's submission, or a reading of a known job.
    capacity = {c.cluster: c.gpus for c in plan_for(events) if isinstance(c, ClusterDeclared)}

    def submitted_elsewhere(kind: str, reason: str, **change: object) -> tuple[JobEvent, Record]:
        event = pick(JobSubmitted)
        job_id = f"{event.job_id}-{kind}-{rng.randrange(10**9)}"
        other = event.model_copy(update={"job_id": job_id, "event_id": f"{job_id}:submitted", **change})
        return event, Record(job_id.encode(), encode_event(other), kind, reason)

    def unknown_project() -> tuple[JobEvent, Record]:
        return submitted_elsewhere("unknown-project", "which the plan does not declare", project="ghost-lab")

    def unknown_cluster() -> tuple[JobEvent, Record]:
        return submitted_elsewhere("unknown-cluster", "which the plan does not declare", cluster="nowhere")

    def gpu_type() -> tuple[JobEvent, Record]:
        return submitted_elsewhere("gpu-type", "asks for GPU type 'H900'", gpu_type="H900")

    def over_capacity() -> tuple[JobEvent, Record]:
        event = pick(JobUsageSample)
        gpus = max(capacity.values()) + 1  # more than any cluster has: impossible on its own
        reading = event.model_copy(update={"event_id": f"{event.event_id}:over", "gpus_in_use": gpus})
        return event, Record(
            event.job_id.encode(), encode_event(reading), "over-capacity", f"reports {gpus} GPUs"
        )

    def future_instant() -> tuple[JobEvent, Record]:
        event = pick(JobUsageSample)
        later = int(time.time()) + 86_400
        reading = event.model_copy(update={"event_id": f"{event.event_id}:later", "occurred_at": later})
        return event, Record(
            event.job_id.encode(), encode_event(reading), "future-instant", "after the meter's clock"
        )

    return {
        f.__name__: f
        for f in (
            oversized,
            not_utf8,
            truncated,
            wrong_type,
            end_before_start,
            duplicate,
            key_not_job,
            tombstone,
            unknown_project,
            unknown_cluster,
            gpu_type,
            over_capacity,
            future_instant,
        )
    }


def _fuzzed_events(rng: random.Random, jobs: list[TraceJob]) -> tuple[list[Record], list[JobEvent]]:
    """Valid events in time order with the bad records at seeded places; and the valid events."""
    valid = list(timeline(jobs, SAMPLE_EVERY_S))
    stream = [_valid(e) for e in valid]
    origin = {id(r): e.event_id for r, e in zip(stream, valid, strict=True)}
    makers = _bad_events(rng, valid)
    for _ in range(EACH_KIND):
        for make in makers.values():
            source, record = make()
            # After the event it was made from: a duplicate is one only once the first is known.
            after = next(i for i, r in enumerate(stream) if origin.get(id(r)) == source.event_id)
            stream.insert(rng.randint(after + 1, len(stream)), record)
    return stream, valid


def test_a_fuzzed_job_event_stream_meters_the_valid_events_and_dead_letters_each_bad_one(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    rng = random.Random(SEED)
    jobs = _jobs(elasticflow_tarball, limit=120)
    pipeline.declare(jobs)
    stream, valid = _fuzzed_events(rng, jobs)
    meters: dict[str, JobMeter] = {}
    for event in valid:  # the ledger a replay of the valid events alone gives
        meters.setdefault(event.job_id, JobMeter(event.job_id)).apply(event)
    expected = {job: m.gpu_seconds() for job, m in meters.items() if m.gpu_seconds()}
    worker = pipeline.start_meter()

    placed = _send(settings, settings.job_events_topic, stream)

    bad_at = [at for at, r in placed.items() if r.bad]
    assert len(bad_at) == 13 * EACH_KIND
    assert len({partition for partition, _ in bad_at}) >= 3  # spread over the partitions
    assert max(len(r.value or b"") for r in stream) > OVERSIZED  # the 900 KB record is in
    assert _wait_ledger(store, expected) == expected
    _assert_one_letter_per_bad_record(
        _letters(settings, len(bad_at)), placed, "meter", settings.job_events_topic
    )
    # One worker did it all, never crashing: no batch was lost to a restart.
    log = worker.log_path.read_text(errors="replace")
    assert not worker.died() and "Crashed reason" not in log and "meter_batch_failed" not in log


# -- the writer's input: ledger entries ------------------------------------------------------------


def _bad_entry_records(rng: random.Random, entries: list[LedgerEntry]) -> list[Record]:
    """Bad ledger-entry records; each, if it were posted, would change its job's GPU-seconds."""

    def changed(**change: object) -> bytes:
        entry = rng.choice(entries)
        data = orjson.loads(encode_entries([entry]))[0]
        data.update(version=entry.version + 1, **change)  # would replace the valid version
        return orjson.dumps([data])

    def key() -> bytes:
        return rng.choice(entries).job_id.encode()

    reason = "not a ledger entry"
    return [
        Record(key(), orjson.dumps([{"entry_id": "e" * OVERSIZED}]), "oversized", reason),
        Record(key(), b"\xff\xfe" + rng.randbytes(300), "not-utf8", reason),
        Record(key(), changed(gpus=1)[:-7], "truncated", reason),
        Record(key(), changed(gpus="8"), "wrong-type", reason),
        Record(key(), changed(gpus=True), "bool-for-int", reason),
        Record(key(), changed(interval_end=10**12), "past-the-ledger", reason),
        Record(key(), changed(interval_end=0), "end-before-start", reason),
        Record(key(), b'{"entries": []}', "not-an-array", reason),
        # GPU-sample rows (`{"utilisation": [...]}`) the ledger cannot hold
        Record(
            key(),
            b'{"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4, "x"]]}',
            "row-wrong-type",
            reason,
        ),
        Record(
            key(), b'{"utilisation": [["p", "u", "c", "j", "n1", 1000, 970, 4, 10]]}', "row-backwards", reason
        ),
        Record(key(), b'{"utilisation": 7}', "rows-not-a-list", reason),
        Record(key(), None, "no-value", reason),
    ]


def test_a_fuzzed_ledger_entry_stream_posts_the_valid_records_and_dead_letters_each_bad_one(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    rng = random.Random(SEED)
    records: list[Record] = []
    entries: list[LedgerEntry] = []
    expected: dict[str, int] = {}
    for job in _jobs(elasticflow_tarball, limit=60):
        meter = JobMeter(job.job_id)
        for event in job_events(job, SAMPLE_EVERY_S):
            meter.apply(event)
        entries.extend(meter.entries())
        records.append(Record(job.job_id.encode(), encode_entries(meter.entries())))
        if meter.gpu_seconds():
            expected[job.job_id] = meter.gpu_seconds()
    for record in _bad_entry_records(rng, entries):
        records.insert(rng.randint(0, len(records)), record)

    placed = _send(settings, settings.ledger_entries_topic, records)

    assert _wait_ledger(store, expected) == expected
    bad = sum(1 for r in records if r.bad)
    _assert_one_letter_per_bad_record(
        _letters(settings, bad), placed, "ledger-writer", settings.ledger_entries_topic
    )
    assert pipeline.writer.last_error is None
