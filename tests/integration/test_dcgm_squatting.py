"""Squatting from the GPUs' own samples, end to end on the real broker and chDB (issue 24): a node's
exporter (the stand-in serving the recorded L4 scrape as 8 GPUs, four a job's that idles, four a
busy job's) read by the collector every 30 s for 45 minutes of job time, the records written by
the API's sample writer, the jobs metered by a real worker (their attribution, their charges),
judged by the squatting route. The idle job is flagged
with the right GPU-hours, its busy neighbour is not; GPUs busy with no job are the overview's
unaccounted use; rounds published twice change nothing; a job whose samples come before its
submission is judged once it comes; bad sample records are dead-lettered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from allmende.core.kafka_topics import ensure_topics
from allmende.core.replay import make_producer
from allmende.core.settings import Settings
from allmende.integrations.dcgm.collector import Collector, Target, kafka_publisher, records_of
from allmende.integrations.dcgm.stand_in import ExporterStandIn
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import FinishStatus, JobEvent, JobFinished, JobStarted, JobSubmitted
from allmende.schemas.gpu_samples import encode_gpu_samples
from allmende.testing.budget_harness import ADMIN, ALICE, ok, plan_text, running_api
from allmende.testing.harness import MeterWorker, read_topic, send_events, wait_until
from tests.integration.test_budgets import Q1_2027, QUARTER_PLAN

pytestmark = pytest.mark.integration

L4 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dcgm" / "l4-gpu-operator.prom"
DAY = 86_400
START = Q1_2027 + 3 * DAY
ROUNDS = 90  # 45 minutes at 30 s: the grace period is 30
PATH = "/v1/dashboard/projects/olmo-ft/squatting"


def _lifecycle(job: str, user: str, start: int, end: int | None) -> list[JobEvent]:
    common: dict[str, Any] = {"producer": "test", "job_id": job}
    events: list[JobEvent] = [
        JobSubmitted(
            event_id=f"{job}:sub", occurred_at=start, project="olmo-ft", user=user, cluster="h100-a",
            gpu_type="H100", gpus=4, priority_class="standard", requested_seconds=7200, **common,
        ),  # type: ignore[arg-type]
        JobStarted(event_id=f"{job}:start", occurred_at=start, gpus=4, **common),
    ]  # fmt: skip
    if end is not None:
        events.append(
            JobFinished(event_id=f"{job}:fin", occurred_at=end, status=FinishStatus.SUCCEEDED, **common)
        )
    return events


@pytest.mark.skipif(not L4.exists(), reason="the recorded scrapes are not here")
def test_a_job_idle_for_45_minutes_by_its_gpus_samples_is_flagged_with_its_gpu_hours_not_its_neighbour(
    settings: Settings, tmp_path: Path
) -> None:
    end = START + 30 * ROUNDS
    with (
        ExporterStandIn(L4.read_text(), 10, busy_pct=91, idle_pct=1, free_pct=40) as node,
        running_api(settings, Q1_2027 + DAY) as (api, clock),
        _collecting(settings, node.url, "gpu-a01", 30) as (collector, _, now),
    ):
        # GPUs 0-3 the idle job's, 4-7 the busy one's, 8-9 nobody's but busy (unaccounted use)
        node.jobs = {gpu: ["parked"] if gpu < 4 else ["busy"] if gpu < 8 else [] for gpu in range(10)}
        node.idle_jobs = {"parked"}
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        clock.now = end + 600
        with _metering(settings, tmp_path):
            send_events(
                settings, _lifecycle("parked", "squatter", START, end) + _lifecycle("busy", "ada", START, end)
            )
            for k in range(1, ROUNDS + 1):
                now[0] = START + 30 * k
                done = collector.round()
                assert not done.failed and len(done.records) == 3, done  # two jobs, the free GPUs
            for k in range(ROUNDS - 9, ROUNDS + 1):  # the last ten rounds published again
                now[0] = START + 30 * k
                collector.round()

            def flagged() -> list[dict[str, Any]]:
                rows: list[dict[str, Any]] = ok(api.get(PATH, headers=ALICE))["rows"]
                return rows if rows and Decimal(rows[0]["idle_hours"]) == Decimal("0.75") else []

            rows = wait_until(flagged, 120, "the idle job flagged for 45 minutes")
            overview = ok(api.get("/v1/dashboard/overview", headers=ADMIN))
            lead_overview = ok(api.get("/v1/dashboard/overview", headers=ALICE))
    assert [r["job_id"] for r in rows] == ["parked"]  # the busy neighbour is not
    parked = rows[0]
    assert parked["user"] == "squatter" and parked["cluster"] == "h100-a"
    assert parked["idle_since"] == "2027-01-04T00:00:00Z"  # the job's start: idle from its first sample
    assert Decimal(parked["idle_gpu_hours"]) == 3  # 4 GPUs x 45 minutes, measured
    assert Decimal(parked["gpu_hours"]) == 3  # what the ledger charged it: its lifecycle's
    assert Decimal(parked["charged_gpu_hours"]) == 3 == Decimal(parked["idle_charged_gpu_hours"])
    assert parked["ongoing"] is True  # the stretch reaches the job's end
    # The two GPUs busy with no job: 2 x 45 minutes of use nobody is charged for, shown to admins.
    assert (Decimal(overview["unaccounted_gpu_hours"]), overview["unaccounted_nodes"]) == (Decimal("1.5"), 1)
    assert lead_overview["unaccounted_gpu_hours"] is None and lead_overview["unaccounted_nodes"] is None


@pytest.mark.skipif(not L4.exists(), reason="the recorded scrapes are not here")
def test_samples_that_come_before_the_jobs_submission_are_judged_once_it_comes(
    settings: Settings, tmp_path: Path
) -> None:
    with (
        ExporterStandIn(L4.read_text(), 8, idle_pct=0) as node,
        running_api(settings, Q1_2027 + DAY) as (api, clock),
        _collecting(settings, node.url, "gpu-a02", 60) as (collector, producer, now),
    ):
        node.jobs = {gpu: ["early"] for gpu in range(8)}
        node.idle_jobs = {"early"}
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        clock.now = START + 7200
        with _metering(settings, tmp_path):
            for k in range(1, 46):  # 45 minutes of 8 idle GPUs, the job unknown yet
                now[0] = START + 60 * k
                collector.round()
            bad = {  # each dead-lettered, with its reason; the worker goes on
                b"early": b"{not json",
                b"other-job": producer_value(collector, "early"),  # keyed by another job than its own
                b"early ": b'{"type": "GpuSamples", "schema_version": 1}',
            }
            for key, value in bad.items():
                producer.send(settings.gpu_samples_topic, key=key, value=value)
            producer.flush()
            wait_until(lambda: _idle_rows(api, "early") == 45, 60, "the samples written, the job unknown yet")
            assert ok(api.get(PATH, headers=ALICE))["rows"] == []
            send_events(settings, _lifecycle("early", "squatter", START, None)[:2])  # submitted, running

            def flagged() -> list[dict[str, Any]]:
                rows: list[dict[str, Any]] = ok(api.get(PATH, headers=ALICE))["rows"]
                return rows

            rows = wait_until(flagged, 120, "the samples attributed and judged")
    assert [r["job_id"] for r in rows] == ["early"]
    letters = [DeadLetter.model_validate_json(v) for v in read_topic(settings, settings.dead_letter_topic, 3)]
    assert (
        sorted((d.stage, d.code, d.source_topic) for d in letters)
        == [("sample-writer", "contract", settings.gpu_samples_topic)] * 3
    )
    assert any("is not the record's" in d.reason for d in letters)
    assert (Decimal(rows[0]["idle_hours"]), Decimal(rows[0]["idle_gpu_hours"])) == (Decimal("0.75"), 6)
    assert rows[0]["ongoing"] is True and Decimal(rows[0]["gpu_hours"]) == 0  # running: nothing charged yet


@contextmanager
def _collecting(
    settings: Settings, url: str, node: str, interval_s: int
) -> Iterator[tuple[Collector, KafkaProducer, list[float]]]:
    """A collector of one exporter publishing to the broker, on a clock the test sets (`now[0]`)."""
    ensure_topics(settings)
    producer = make_producer(settings.kafka_bootstrap_servers)
    now = [float(START)]
    collector = Collector(
        [Target(url, node)], interval_s=interval_s, timeout_s=5,
        publish=kafka_publisher(producer, settings.gpu_samples_topic, 30), clock=lambda: now[0],
    )  # fmt: skip
    try:
        yield collector, producer, now
    finally:
        collector.close()
        producer.close(timeout=5)


@contextmanager
def _metering(settings: Settings, tmp_path: Path) -> Iterator[MeterWorker]:
    meter = MeterWorker(settings, tmp_path / "logs")
    try:
        meter.wait_ready()
        yield meter
    finally:
        meter.kill()


def producer_value(collector: Collector, job: str) -> bytes:
    """A record as the collector makes it for `job` (its node's GPUs), to send under a wrong key."""
    _, reads = collector.read()
    records, _ = records_of(reads[0].scrape, int(START), 60, "test")  # type: ignore[arg-type]
    return encode_gpu_samples(next(r for r in records if r.job_id == job))


def _idle_rows(api: Any, job: str) -> int:
    """The job's rows the API's sample writer has written (the store of the API under test)."""
    found = api.app.state.store.db.rows(
        "SELECT count() FROM {db}.gpu_idle FINAL WHERE job_id = {j:String}", {"j": job}
    )
    return int(found[0][0])
