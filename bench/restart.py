"""Restart: how long the API takes to admit again after `kill -9`, from its checkpoints and by a
full replay, in the same run, and again with the history doubled (issue 23, "Restart").

History: the ElasticFlow trace (all ten cluster files by default), in the order a cluster makes
it: every job asked for admission through the API first (its decision and hold on the admission
log, against a plan for the current quarter), then its job events on the job-event topic (a usage
sample every --sample-every s) and its ledger entries, metered here with the meter's own
`JobMeter` and published to the ledger-entry topic (bench/dashboard.py's way: the API's writer
posts them to chDB as in production), each job's followed by the meter's `retired` record (the
trace's jobs ended years ago: history, not live state). The API runs with a retention of
--retention s (60): the trace's jobs, decided minutes before, leave memory before the checkpoints
are taken, as a week-old history does under the default 7 days. Then, in turn:

  checkpoints  wait until both checkpoints (fair share, admission) cover the history, taken after
               it left memory; kill -9 the API; start it again; time until a new job's
               `POST /v1/admission` answers 200
  full replay  kill -9; start it with ALLMENDE_CHECKPOINT_EVERY_S=0; time the same way

Then (--double, the default) the trace goes in a second time (job ids suffixed, instants shifted
past the first copy's end) and both restarts are timed again: the checkpointed one should stay flat
while the replay grows. Target: admitting again within 5 s from checkpoints. Prints figures.

    .venv/bin/python bench/restart.py [--clusters cluster02,cluster03] [--sample-every 600] [--once]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import orjson
from admission import HttpxConnection, Pool, apply_plan, platform_env, wait_http
from dashboard import TRACE, publish_entries
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from rich.console import Console
from soak import kafka

from allmende.core.kafka_local import free_port
from allmende.core.settings import Settings
from allmende.core.supervisor import Child, python_module
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat, TraceJob, job_events
from allmende.schemas.events import encode_event

ADMIN_TOKEN, SCHEDULER_TOKEN = "restart-admin", "restart-scheduler"
HOURS = 10**6  # every project's allocation: room for the trace's admissions
CHECKPOINT_EVERY_S = 5  # often: the checkpoints cover the history soon after it is in
say = Console(highlight=False, soft_wrap=True)


def plan_yaml(jobs: list[TraceJob]) -> str:
    """The trace's clusters and projects, in the current quarter, each project a large allocation."""
    clusters: dict[str, tuple[str, int]] = {}
    for job in jobs:
        gpu_type, gpus = clusters.get(job.cluster, (job.gpu_type, 0))
        clusters[job.cluster] = (gpu_type, max(gpus, job.gpus))
    now = dt.datetime.now(dt.UTC)
    quarter = f"{now.year}-Q{(now.month - 1) // 3 + 1}"
    lines = [f"plan: restart-bench\nperiod: {quarter}\nclusters:"]
    lines += [
        f"  - {{name: {c}, gpu_type: {t}, gpus: {max(1024, g)}}}" for c, (t, g) in sorted(clusters.items())
    ]
    lines.append("organisation:\n  - {id: org, kind: organisation, shares: 100}")
    projects = sorted({j.project for j in jobs})
    lines += [f"  - {{id: {p}, parent: org, kind: project, shares: 10}}" for p in projects]
    lines += [
        "policy:\n  id: restart-bench-prices\n  effective_from: 2020-01-01T00:00:00Z",
        f"  gpu_type_weights: {{{', '.join(sorted({f'{t}: 1.00' for t, _ in clusters.values()}))}}}",
        "  priority_multipliers: {preemptible: 1.00, standard: 1.00, non-preemptible: 1.00}",
        "  interactive_rate: 1.00",
        "allocations:",
    ]
    lines += [f"  - {{project: {p}, gpu_hours: {HOURS}}}" for p in projects]
    return "\n".join(lines) + "\n"


def shifted(jobs: list[TraceJob], copy: int) -> list[TraceJob]:
    """The trace again, after itself: ids suffixed, instants moved past its last end."""
    if copy == 0:
        return jobs
    span = max(j.start_at + j.duration_s for j in jobs) - min(j.submit_at for j in jobs) + 86_400
    return [
        replace(j, job_id=f"{j.job_id}-c{copy}", submit_at=j.submit_at + copy * span,
                start_at=j.start_at + copy * span)
        for j in jobs
    ]  # fmt: skip


def publish_job_events(settings: Settings, jobs: list[TraceJob], sample_every: int) -> int:
    producer = KafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=20,
        batch_size=1 << 20, compression_type="lz4",
    )  # fmt: skip
    sent = 0
    for job in jobs:
        for event in job_events(job, sample_every):
            producer.send(settings.job_events_topic, key=job.job_id.encode(), value=encode_event(event))
            sent += 1
    producer.flush()
    producer.close()
    return sent


def request_of(job: TraceJob, job_id: str | None = None) -> dict[str, object]:
    return {
        "job_id": job_id or job.job_id, "project": job.project, "user": job.user, "cluster": job.cluster,
        "gpu_type": job.gpu_type, "gpus": job.gpus, "requested_hours": str(max(1, job.duration_s) / 3600),
    }  # fmt: skip


async def admit_all(url: str, jobs: list[TraceJob], connections: int = 16) -> dict[str, int]:
    """Ask for every job's admission; verdict (or status) -> count."""
    headers = {"Authorization": f"Bearer {SCHEDULER_TOKEN}"}
    pool = Pool(lambda: HttpxConnection(url, headers), connections)
    counts: dict[str, int] = {}
    queue: asyncio.Queue[TraceJob] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)

    async def worker() -> None:
        while not queue.empty():
            job = queue.get_nowait()
            for _ in range(20):  # 503: not recorded, no effect: ask again
                status, answer = await pool.call("POST", "/v1/admission", orjson.dumps(request_of(job)))
                if status != 503:
                    break
                await asyncio.sleep(0.5)
            key = orjson.loads(answer)["verdict"] if status == 200 else str(status)
            counts[key] = counts.get(key, 0) + 1

    await asyncio.gather(*(worker() for _ in range(connections)))
    await pool.close()
    return counts


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def checkpoint_covers(path: Path, topic: str, ends: dict[int, int], taken_after: float) -> bool:
    """The checkpoint covers the topic up to `ends` and was taken after `taken_after` (UTC s)."""
    if not path.exists():
        return False
    with path.open("rb") as f:
        header = orjson.loads(f.readline())
    held = {int(p): o for p, o in header["offsets"].get(topic, {}).items()}
    return header["taken_at"] >= taken_after and all(held.get(p, 0) >= end for p, end in ends.items())


@dataclass
class Api:
    env: dict[str, str]
    port: int
    logs: Path
    proc: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, checkpoints: bool = True) -> Child:
        env = {**self.env, "ALLMENDE_CHECKPOINT_EVERY_S": str(CHECKPOINT_EVERY_S if checkpoints else 0)}
        argv = python_module("allmende", "serve", "--port", str(self.port))
        self.proc = Child(argv, self.logs / f"api-{time.monotonic_ns()}.log", env, session=True)
        return self.proc

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL)

    def health(self) -> dict[str, object]:
        answer: dict[str, object] = httpx.get(f"{self.url}/healthz", timeout=10).json()
        return answer

    def time_to_admit(self, probe: TraceJob, timeout: float = 600) -> float:
        """Seconds from now until a new job's admission answers 200 (the API being started)."""
        started = time.monotonic()
        body = request_of(probe, f"probe-{uuid.uuid4().hex[:8]}")
        headers = {"Authorization": f"Bearer {SCHEDULER_TOKEN}"}
        while time.monotonic() - started < timeout:
            try:
                if (
                    httpx.post(f"{self.url}/v1/admission", json=body, headers=headers, timeout=2).status_code
                    == 200
                ):
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise SystemExit(f"the API did not admit within {timeout:.0f} s")


def load_history(api: Api, settings: Settings, jobs: list[TraceJob], sample_every: int) -> None:
    """Admissions first (a job is asked for before it runs), then its lifecycle and its usage."""
    t0 = time.monotonic()
    counts = asyncio.run(admit_all(api.url, jobs))
    say.print(f"  admissions: {counts} in {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    events = publish_job_events(settings, jobs, sample_every)
    say.print(f"  job events: {events:,} in {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    gpu_seconds = publish_entries(settings, jobs, sample_every, retire_after_s=settings.ended_job_retention_s)
    say.print(
        f"  ledger entries: {gpu_seconds / 3600:,.1f} GPU-hours metered in {time.monotonic() - t0:.0f} s"
    )
    t0 = time.monotonic()
    while not api.health().get("writer_caught_up"):
        time.sleep(2)
    say.print(f"  the ledger writer caught up {time.monotonic() - t0:.0f} s later")


def wait_checkpoints(settings: Settings, directory: Path, retention_s: int) -> None:
    """Until both checkpoints cover the history, admission's taken once the history has left its
    memory (a retention on; fair share let go of it at the meter's `retired` records, and writes
    a checkpoint only when its usage changed)."""
    t0 = time.monotonic()
    after = time.time() + retention_s + 2
    bootstrap = settings.kafka_bootstrap_servers
    wanted = [
        (directory / "fairshare-usage.ckpt", settings.ledger_entries_topic, 0.0),
        (directory / "admission.ckpt", settings.admission_topic, after),
    ]
    ends = {topic: end_offsets(bootstrap, topic) for _, topic, _ in wanted}
    while not all(checkpoint_covers(path, topic, ends[topic], taken) for path, topic, taken in wanted):
        if time.monotonic() - t0 > 600 + retention_s:
            raise SystemExit("the checkpoints did not cover the history within 600 s")
        time.sleep(1)
    say.print(f"  checkpoints cover the history ({time.monotonic() - t0:.0f} s)")


def restarts(api: Api, probe: TraceJob) -> tuple[float, float]:
    """(seconds to admit after kill -9 and a start from checkpoints, the same by full replay)."""
    api.kill()
    api.start(checkpoints=True)
    warm = api.time_to_admit(probe)
    api.kill()
    api.start(checkpoints=False)
    cold = api.time_to_admit(probe)
    api.kill()
    api.start(checkpoints=True)  # for what follows: checkpoints on again
    api.time_to_admit(probe)
    return warm, cold


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clusters", default="all", help="comma-separated cluster files (cluster02,...), or all"
    )
    parser.add_argument("--sample-every", type=int, default=600, help="usage sample interval (s)")
    parser.add_argument("--once", action="store_true", help="do not double the history")
    parser.add_argument(
        "--retention", type=int, default=60,
        help="the API's ALLMENDE_ENDED_JOB_RETENTION_S: the history, older than it, leaves memory as a "
        "week-old history does under the default 7 days",
    )  # fmt: skip
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    args = parser.parse_args()

    jobs = list(read_trace(TRACE, TraceFormat.ELASTICFLOW))
    if args.clusters != "all":
        wanted = {f"ef-{c}" for c in args.clusters.split(",")}
        jobs = [j for j in jobs if j.cluster in wanted]
    if not jobs:
        raise SystemExit(f"no jobs of {args.clusters} in {TRACE}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    tag = f"restart{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, float, float]] = []
    with ExitStack() as stack:
        bootstrap, _ = stack.enter_context(kafka(args.bootstrap, None, tmp))
        env = platform_env(
            bootstrap, tmp, tag, ADMIN_TOKEN, SCHEDULER_TOKEN, state_dir=str(tmp / "api-state"),
            startup_replay_timeout_s="900", log_json="false", ended_job_retention_s=str(args.retention),
        )  # fmt: skip
        api = Api(env, free_port(), tmp / "logs")
        stack.callback(api.kill)
        proc = api.start()
        wait_http(f"{api.url}/healthz", proc, proc.log_path)
        settings = Settings(
            kafka_bootstrap_servers=bootstrap, topic_prefix=tag, ended_job_retention_s=args.retention
        )
        apply_plan(api.url, plan_yaml(jobs), ADMIN_TOKEN)
        probe = jobs[0]
        copies = 1 if args.once else 2
        for copy in range(copies):
            label = "the trace" if copy == 0 else "the trace twice"
            say.print(f"{label}: {len(jobs) * (copy + 1):,} jobs in the ledger after this load ({tmp})")
            load_history(api, settings, shifted(jobs, copy), args.sample_every)
            wait_checkpoints(settings, tmp / "api-state" / "checkpoints" / tag, args.retention)
            entries = sum(end_offsets(bootstrap, settings.ledger_entries_topic).values())
            decisions = sum(end_offsets(bootstrap, settings.admission_topic).values())
            events = sum(end_offsets(bootstrap, settings.job_events_topic).values())
            warm, cold = restarts(api, probe)
            say.print(
                f"  {events:,} job events, {entries:,} ledger-entry records, {decisions:,} "
                f"admission records: admitting again {warm:.1f} s after a start from checkpoints, "
                f"{cold:.1f} s by full replay"
            )
            rows.append((label, warm, cold))
    say.print("\n| history | from checkpoints (s) | full replay (s) |\n|---|---|---|")
    for label, warm, cold in rows:
        say.print(f"| {label} | {warm:.1f} | {cold:.1f} |")
    if len(rows) == 2:
        (_, warm1, cold1), (_, warm2, cold2) = rows
        say.print(f"doubled history: from checkpoints x{warm2 / warm1:.2f}, full replay x{cold2 / cold1:.2f}")
    met = all(warm < 5 for _, warm, _ in rows)
    say.print(f"target (admitting within 5 s from checkpoints): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
