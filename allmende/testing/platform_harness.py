"""The real platform for the browser tests and `make screenshots`: the API (uvicorn, with its
ledger writer, fair-share calculator and admission service), a meter worker process, a small
quarter plan with two projects led by two leads, and a slice of the ElasticFlow trace replayed
through Kafka, waited on until the ledger holds exactly the slice's GPU-seconds.

Start-up is about half a minute: the meter worker's start and the metering of ~9,000 events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from allmende.core.replay import make_producer, publish, timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat, TraceJob
from allmende.schemas.events import (
    FinishStatus,
    JobEvent,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)
from allmende.testing.budget_harness import live_api, plan_text
from allmende.testing.harness import MeterWorker, wait_until
from allmende.testing.tagged_settings import tagged_settings

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "elasticflow" / "raw-traces.tar.gz"
ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN = "admin-secret", "alice-secret", "bob-secret"  # with_tokens()
SCHEDULER_TOKEN = "sched-secret"
SAMPLE_EVERY_S = 1800
Q2 = 1_617_235_200  # 2021-04-01T00:00:00Z
CLOCK = 1_620_000_000  # 2021-05-03T00:00:00Z, after the slice's last job: the admin services' clock

# alice leads ef-cluster01, bob ef-cluster10; nobody but the admins reads sandbox.
PLAN = plan_text(
    """
    plan: browser-2021-q2
    period: 2021-Q2
    clusters:
      - {name: ef-cluster01, gpu_type: V100, gpus: 384}
      - {name: ef-cluster10, gpu_type: V100, gpus: 128}
    organisation:
      - {id: institute, kind: organisation, shares: 100}
      - {id: msr-itp, parent: institute, kind: group, shares: 70}
      - {id: ef-cluster01, parent: msr-itp, kind: project, shares: 60, leads: [alice]}
      - {id: ef-cluster10, parent: msr-itp, kind: project, shares: 40, leads: [bob]}
      - {id: sandbox, parent: institute, kind: project, shares: 30}
    policy:
      id: prices-2021
      effective_from: 2021-01-01T00:00:00Z
      gpu_type_weights: {V100: 0.50, A100: 0.80, H100: 1.00}
      default_gpu_type_weight: 1.00
      priority_multipliers: {preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}
      interactive_rate: 1.25
    allocations:
      - {project: ef-cluster01, gpu_hours: 800, cluster: ef-cluster01}
      - {project: ef-cluster01, gpu_hours: 1700}
      - {project: ef-cluster10, gpu_hours: 2400}
      - {project: sandbox, gpu_hours: 100}
    agreements:
      - id: ef10-weeknights
        project: ef-cluster10
        cluster: ef-cluster10
        gpus: 32
        weekly: {days: [mon, tue, wed, thu, fri], start: "20:00", hours: 10, time_zone: America/Los_Angeles}
    """
)


def trace_slice(tarball: Path = TRACE) -> list[TraceJob]:
    """About 560 jobs over April 2021: all of cluster10, every fifth of cluster01 from 29 March."""
    ten = list(read_trace(tarball, TraceFormat.ELASTICFLOW, cluster="cluster10"))
    one = [
        j
        for j in read_trace(tarball, TraceFormat.ELASTICFLOW, cluster="cluster01")
        if j.submit_at >= Q2 - 3 * 86_400
    ]
    return ten + one[::5]


def parked_job() -> list[JobEvent]:
    """A job on ef-cluster10 that holds 4 GPUs at 1% utilisation for 3 h: the squatting table's row."""
    common: dict[str, str] = {"producer": "browser-tests", "job_id": "ef-cluster10-parked"}
    start, every, samples = 1_619_000_000, 600, 18  # 2021-04-21T10:13:20Z
    events: list[JobEvent] = [
        JobSubmitted(
            event_id="parked:sub", occurred_at=start, project="ef-cluster10", user="squatter",
            cluster="ef-cluster10", gpu_type="V100", gpus=4, priority_class="standard",
            requested_seconds=every * samples, **common,
        ),
        JobStarted(event_id="parked:start", occurred_at=start, gpus=4, **common),
    ]  # fmt: skip
    events += [
        JobUsageSample(
            event_id=f"parked:u{i}",
            occurred_at=start + every * (i + 1),
            gpus_in_use=4,
            gpu_utilization=0.01,
            **common,
        )
        for i in range(samples)
    ]
    events.append(
        JobFinished(
            event_id="parked:fin",
            occurred_at=start + every * samples,
            status=FinishStatus.SUCCEEDED,
            **common,
        )
    )
    return events


PARKED_GPU_SECONDS = 4 * 600 * 18
# Admitted at the services' clock and not started yet: the running-jobs and holds tables' rows.
ADMITTED = [
    {"job_id": "ef10-train-7b", "project": "ef-cluster10", "user": "bob", "cluster": "ef-cluster10",
     "gpu_type": "V100", "gpus": 16, "priority_class": "standard", "requested_hours": 12},
    {"job_id": "ef10-sweep-3", "project": "ef-cluster10", "user": "mia", "cluster": "ef-cluster10",
     "gpu_type": "V100", "gpus": 8, "priority_class": "preemptible", "requested_hours": 6},
]  # fmt: skip


@dataclass
class Platform:
    url: str
    settings: Settings
    projects: dict[str, int]  # project -> GPU-seconds the ledger holds for it

    def client(self, token: str = ADMIN_TOKEN) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def platform_settings(kafka_bootstrap: str, chdb_dsn: str, workdir: Path) -> Settings:
    return tagged_settings(kafka_bootstrap, chdb_dsn, workdir, prefix="b")


def _usage(client: httpx.Client, project: str) -> int:
    r = client.get(f"/v1/projects/{project}/usage")
    return int(r.json().get("total_gpu_seconds", -1)) if r.status_code == 200 else -1


@contextmanager
def running_platform(
    kafka_bootstrap: str, chdb_dsn: str, workdir: Path, timeout: float = 180
) -> Iterator[Platform]:
    """Start everything, apply the plan, replay the slice; yield once the ledger is exact."""
    settings = platform_settings(kafka_bootstrap, chdb_dsn, workdir)
    jobs = trace_slice()
    expected: dict[str, int] = {}
    for job in jobs:
        expected[job.project] = expected.get(job.project, 0) + job.gpu_seconds
    expected["ef-cluster10"] += PARKED_GPU_SECONDS
    meter = MeterWorker(settings, workdir / "logs")
    try:
        with live_api(settings, CLOCK) as (url, _clock):
            platform = Platform(url, settings, expected)
            with platform.client() as admin:
                applied = admin.post("/v1/admin/plan/apply", json={"text": PLAN})
                assert applied.status_code == 200, applied.text
                meter.wait_ready()
                producer = make_producer(settings.kafka_bootstrap_servers)
                try:
                    publish(producer, settings.job_events_topic, timeline(jobs, SAMPLE_EVERY_S))
                    publish(producer, settings.job_events_topic, parked_job())
                finally:
                    producer.close()
                wait_until(
                    lambda: all(_usage(admin, p) == n for p, n in expected.items()),
                    timeout,
                    f"the ledger to hold {expected} GPU-seconds",
                    every=0.5,
                )
                _settle_fairshare(admin)
            with platform.client(SCHEDULER_TOKEN) as scheduler:
                for request in ADMITTED:
                    decided = scheduler.post("/v1/admission", json=request)
                    assert decided.status_code == 200 and decided.json()["verdict"] == "admit", decided.text
            yield platform
    finally:
        meter.stop()


def _settle_fairshare(admin: httpx.Client) -> None:
    """The fair-share calculator follows the ledger entries: wait until its tree stops changing."""
    last: list[object] = []

    def settled() -> bool:
        nonlocal last
        rows = admin.get("/v1/dashboard/fairshare").json().get("rows", [])
        used = any(r["effective_usage"] for r in rows)
        same = rows == last
        last = rows
        if not (used and same):
            time.sleep(0.5)
        return used and same

    wait_until(settled, 60, "the fair-share tree to settle")
