"""The pipeline end to end on a real broker and a real chDB ledger."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from allmende.core.kafka_local import free_port
from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, publish, timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.metering import JobMeter
from allmende.domain.traces import TraceFormat, TraceJob, job_events, with_idle_placeholders
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import JobEvent, encode_event
from allmende.testing.harness import Pipeline, read_topic, send_events, send_raw, wait_until

pytestmark = pytest.mark.integration
SAMPLE_EVERY_S = 600


def _jobs(tarball: Path, cluster: str, limit: int | None = None) -> list[TraceJob]:
    """The trace's jobs, a fifth of them idle placeholders: idle time is metered as exactly."""
    jobs = read_trace(tarball, TraceFormat.ELASTICFLOW, cluster=cluster, limit=limit)
    return list(with_idle_placeholders(jobs, 0.2, seed=11))


def _expected_idle(jobs: list[TraceJob]) -> dict[str, int]:
    """Idle GPU-seconds x 10,000 per job, by the documented rule: every GPU-second at its sample's
    utilisation; a job too short for any sample reported none and is busy throughout."""
    idle = {}
    for j in jobs:
        if j.duration_s > SAMPLE_EVERY_S and j.utilization < 1.0:
            idle[j.job_id] = j.gpu_seconds * (10_000 - round(j.utilization * 10_000))
    return idle


def _assert_idle_exact(store: LedgerStore, jobs: list[TraceJob]) -> None:
    idle = {k: v for k, v in store.job_idle_units().items() if v}
    assert idle == _expected_idle(jobs) and idle  # some placeholders ran long enough to sample


def _expected_per_job(jobs: list[TraceJob]) -> dict[str, int]:
    return {j.job_id: j.gpu_seconds for j in jobs if j.gpu_seconds}


def _wait_ledger(
    store: LedgerStore, expected: dict[str, int], timeout: float = 180, settings: Settings | None = None
) -> dict[str, int]:
    want = sum(expected.values())
    try:
        wait_until(lambda: store.total_gpu_seconds() >= want, timeout, f"ledger to reach {want} GPU-s")
    except TimeoutError as exc:  # which jobs, and what the dead-letter topic holds
        got = store.job_gpu_seconds()
        wrong = {j: (got.get(j, 0), n) for j, n in expected.items() if got.get(j, 0) != n}
        raw = read_topic(settings, settings.dead_letter_topic, 100_000, timeout=5) if settings else []
        codes = Counter(DeadLetter.model_validate_json(v).code for v in raw)
        first = dict(list(wrong.items())[:10])
        raise TimeoutError(
            f"{exc}; {len(wrong)} jobs differ (got, want): {first}; dead letters {codes}"
        ) from None
    # Settle: a double count would keep growing past the target.
    got = wait_until(lambda: (t := store.job_gpu_seconds()) and sum(t.values()) == want and t, 30, "settle")
    return {k: v for k, v in got.items() if v}


def test_replaying_an_elasticflow_cluster_gives_the_traces_gpu_seconds_exactly(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    jobs = _jobs(elasticflow_tarball, "cluster10")
    pipeline.declare(jobs)
    pipeline.start_meter()
    producer = make_producer(settings.kafka_bootstrap_servers)
    publish(producer, settings.job_events_topic, timeline(jobs, SAMPLE_EVERY_S))
    producer.close()

    ledger = _wait_ledger(store, _expected_per_job(jobs))

    assert sum(ledger.values()) == sum(j.gpu_seconds for j in jobs)
    assert ledger == _expected_per_job(jobs)
    _assert_idle_exact(store, jobs)
    assert store.reconcile().rebuilt is False  # the view kept pace with the postings


def test_every_event_twice_in_shuffled_order_gives_the_in_order_ledger(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    jobs = _jobs(elasticflow_tarball, "cluster10", limit=120)
    events: list[JobEvent] = [e for j in jobs for e in job_events(j, SAMPLE_EVERY_S)] * 2
    random.Random(7).shuffle(events)
    # Reordering is exact within the retention (an event further behind its partition's stream is
    # dead-lettered as `retired`): here it spans the whole shuffled trace.
    span = max(e.occurred_at for e in events) - min(e.occurred_at for e in events) + 1
    retention = max(span, pipeline.settings.ended_job_retention_s)
    pipeline.settings = pipeline.settings.model_copy(update={"ended_job_retention_s": retention})
    settings, store = pipeline.settings, pipeline.store
    pipeline.declare(jobs)
    pipeline.start_meter()
    send_events(settings, events)

    ledger = _wait_ledger(store, _expected_per_job(jobs))

    assert ledger == _expected_per_job(jobs)
    # Not only the totals: every entry is the one in-order delivery gives.
    in_order = {}
    for job in jobs:
        meter = JobMeter(job.job_id)
        for event in job_events(job, SAMPLE_EVERY_S):
            meter.apply(event)
        in_order.update({e.entry_id: e for e in meter.entries()})
    # The totals can match before the last copies are metered (a sample missing between two equal
    # readings charges the same): wait for the entries, which converge to the in-order ones only.
    ids = [j.job_id for j in jobs]
    with contextlib.suppress(AssertionError):
        wait_until(lambda: store.current_entries(ids) == in_order, 60, "the entries to converge")
    assert store.current_entries(ids) == in_order
    _assert_idle_exact(store, jobs)


def test_a_worker_killed_mid_replay_and_restarted_loses_and_doubles_nothing(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    jobs = _jobs(elasticflow_tarball, "cluster01", limit=600)
    pipeline.declare(jobs)
    expected = _expected_per_job(jobs)
    first = pipeline.start_meter()
    producer = make_producer(settings.kafka_bootstrap_servers)
    replay = threading.Thread(
        target=publish, args=(producer, settings.job_events_topic, timeline(jobs, SAMPLE_EVERY_S), 40_000.0)
    )
    replay.start()
    # Kill once part, not all, of the ledger has been written.
    wait_until(lambda: store.total_gpu_seconds() > sum(expected.values()) // 10, 120, "first postings")
    first.kill(signal.SIGKILL)
    assert store.total_gpu_seconds() < sum(expected.values())
    pipeline.start_meter()
    replay.join()
    producer.close()

    assert _wait_ledger(store, expected, settings=settings) == expected
    _assert_idle_exact(store, jobs)


def test_two_meter_workers_give_the_same_ledger_as_one(pipeline: Pipeline, elasticflow_tarball: Path) -> None:
    settings, store = pipeline.settings, pipeline.store
    jobs = _jobs(elasticflow_tarball, "cluster10")
    pipeline.declare(jobs)
    pipeline.start_meter()
    pipeline.start_meter()
    producer = make_producer(settings.kafka_bootstrap_servers)
    publish(producer, settings.job_events_topic, timeline(jobs, SAMPLE_EVERY_S))
    producer.close()

    ledger = _wait_ledger(store, _expected_per_job(jobs))

    assert ledger == _expected_per_job(jobs)
    logs = " ".join(m.log_path.read_text() for m in pipeline.meters)
    assert logs.count("Worker ready") >= 2  # both took part


def test_malformed_events_go_to_the_dead_letter_topic_and_the_worker_goes_on(
    pipeline: Pipeline, elasticflow_tarball: Path
) -> None:
    settings, store = pipeline.settings, pipeline.store
    job = _jobs(elasticflow_tarball, "cluster10", limit=1)[0]
    pipeline.declare([job])
    events = list(job_events(job, SAMPLE_EVERY_S))
    contract_break = orjson.loads(encode_event(events[1]))
    contract_break["gpus"] = -3
    bad = [
        (b"job-x", b"{not json"),
        (job.job_id.encode(), orjson.dumps(contract_break)),
        (b"someone-else", encode_event(events[0])),  # key is not the job id
    ]
    worker = pipeline.start_meter(metrics_port=free_port())
    send_raw(settings, bad[:2])
    send_events(settings, events)
    send_raw(settings, bad[2:])

    assert _wait_ledger(store, {job.job_id: job.gpu_seconds}) == {job.job_id: job.gpu_seconds}
    letters = [DeadLetter.model_validate_json(v) for v in read_topic(settings, settings.dead_letter_topic, 3)]
    assert sorted(letter.original_value() for letter in letters) == sorted(v for _, v in bad)
    reasons = {letter.original_value(): letter.reason for letter in letters}
    assert "Invalid JSON" in reasons[b"{not json"]
    assert "gpus" in reasons[orjson.dumps(contract_break)]
    assert "not the job id" in reasons[encode_event(events[0])]
    assert all(
        letter.stage == "meter" and letter.source_topic == settings.job_events_topic for letter in letters
    )
    # The worker's own /metrics counts what it metered and what it refused.
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"

    def counters() -> dict[str, float]:
        families = text_string_to_metric_families(httpx.get(url, timeout=10).text)
        return {
            s.name: s.value
            for f in families
            for s in f.samples
            if s.name.startswith("allmende_meter_") and s.name.endswith("_total")
        }

    wait_until(lambda: counters().get("allmende_meter_events_total", 0) >= len(events), 30, "metered count")
    assert counters() == {
        "allmende_meter_events_total": len(events), "allmende_meter_dead_letters_total": 3,
        "allmende_meter_late_events_total": 0, "allmende_meter_retired_jobs_total": 0,
        "allmende_meter_skipped_gaps_total": 0,
    }  # fmt: skip
