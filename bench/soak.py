"""Soak: memory bounded by what is live, not by history (issue 29).

The whole life cycle of every job through the real platform, at a steady rate, for as long as it
takes to see whether memory follows what is live or what has been:

  API      the real API process (`python -m allmende serve`: admission, ledger writer, decision
           writer, fair share, alerts; embedded chDB) with a fresh topic prefix, database and state
           directory, and a plan of one cluster with room for twice the jobs live at once (at most
           100,000 GPUs) and budgets no run can use up (bench/admission.py's): every request is
           admitted
  meter    one meter worker process (`python -m allmende.streams.meter_worker`)
  broker   a local Kafka broker started for the run (or the one at --bootstrap)

all with ALLMENDE_ENDED_JOB_RETENTION_S = --retention (seconds, where production keeps 7 days),
so that an ended job leaves every process's memory shortly after it ends.

The load generator is this process, on asyncio, open loop: job n is due at n / --rate seconds.
Per job, `POST /v1/admission` (the scheduler's token; latency counts from the instant the job was
due, answered or not, so a stalled server cannot hide its queue: no coordinated omission); once
admitted, `JobSubmitted` and `JobStarted` on the job-events topic (key: the job id; instants: the
wall clock, UTC seconds), and `JobFinished` --run-seconds later. At most --run-seconds x --rate
jobs are live at once (2,000 by default); at most --max-in-flight admission requests are
outstanding (past that the generator falls behind its schedule, which the latencies then show, and
the achieved rate says so).

Every --sample-s the resident memory (VmRSS) of the API, the meter worker and the broker is
sampled (--csv writes the samples). At each of --checkpoints (jobs admitted so far) a row: the
resident memory of each process, the admission p50/p99 over the jobs since the previous
checkpoint, the jobs live (started, not finished), and the jobs each of the API's admission and the
meter still holds: admitted so far less those it has let go of (its `*_retired_jobs_total`), which
should stay near the jobs live plus --rate x --retention.
At the end, the ledger (per project, `GET /v1/projects/{project}/usage`) is awaited until it holds
exactly the sum of the runs (GPUs x run seconds of every admitted job), or the difference is
printed; then the verdict.

Targets (the issue): each process's memory after 200,000 jobs within 10 % of its memory after
20,000; admission p99 not worse; the ledger equal to the sum of the runs. The figures are printed;
nothing is asserted. The broker is the JVM (heap up to its -Xmx): shown, not part of the target.

    .venv/bin/python bench/soak.py [--rate 100] [--jobs 200000] [--checkpoints 20000,200000]
                                   [--retention 5] [--run-seconds 20]

A short check: --jobs 3000 --checkpoints 1000,3000 --rate 50. Starts a local broker in a
temporary directory unless --bootstrap names a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import math
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from admission import (
    ADMIN_TOKEN,
    CLIENTS,
    PROJECTS,
    SCHEDULER_TOKEN,
    Pool,
    _interrupt,
    apply_plan,
    broker_answers,
    cpu_seconds,
    delete_topics,
    plan_yaml,
    platform_env,
    quarter,
    wait_http,
)
from kafka import KafkaProducer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from allmende.core.kafka_local import LocalBroker, free_port
from allmende.core.replay import make_producer
from allmende.core.settings import Settings
from allmende.core.supervisor import Child, python_module
from allmende.schemas.events import (
    MAX_GPUS,
    FinishStatus,
    JobFinished,
    JobStarted,
    JobSubmitted,
    PriorityClass,
)
from allmende.schemas.events import encode_event as encode
from allmende.topology import MeterProcess

CLUSTER, GPU_TYPE = "bench", "H100"  # plan_yaml's one cluster
GPUS = (1, 2, 1, 4, 1, 8)  # GPUs of job n: GPUS[n % 6]; the projects take turns (PROJECTS[n % 4])
HOSTS = 512
PRODUCER = "bench-soak"
MEMORY_TARGET = 0.10
PROCESSES = ("API", "meter", "broker")


# -- processes -----------------------------------------------------------------------------------
def rss_mb(pid: int | None) -> float:
    """Resident memory of a process in MB (VmRSS); NaN when unknown or gone."""
    if pid is None:
        return math.nan
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def listening_pid(port: int) -> int | None:
    """The process listening on a local TCP port (for a broker this run did not start), from /proc:
    best effort, only processes this user may look into."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


@contextmanager
def kafka(
    bootstrap: str | None, broker_pid: int | None, tmp: Path
) -> Iterator[tuple[str, int | None, Path | None]]:
    """(bootstrap, broker pid, its GC log): the broker at `bootstrap` (GC log unknown), or a local one
    started for the run."""
    if bootstrap:
        if not broker_answers(bootstrap):
            raise SystemExit(f"no Kafka broker answers at {bootstrap}")
        yield bootstrap, broker_pid or listening_pid(int(bootstrap.split(",")[0].rsplit(":", 1)[1])), None
        return
    broker = LocalBroker(tmp / "kafka", port=free_port(), controller_port=free_port())
    try:
        started = broker.start()
        yield started, broker.running_pid(), broker.gc_log
    finally:
        broker.stop()


@contextmanager
def child(argv: list[str], env: dict[str, str], log: Path) -> Iterator[Child]:
    """A subprocess in its own session, stopped with SIGINT (uvicorn's graceful stop) on the way out."""
    process = Child(argv, log, env, session=True)
    try:
        yield process
    finally:
        process.stop(signal.SIGINT, timeout=30)


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set) in a /metrics page; NaN if absent."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values) if values else math.nan


def bucket(text: str, name: str, bound: str) -> float:
    """A histogram's observations at or under `bound` (a bucket's `le`; "+Inf": all), every label set."""
    pattern = rf'^{name}_bucket{{(?:[^}}]*,)?le="{re.escape(bound)}"[^}}]*}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


# Where a window's tail may come from, read off the API's /metrics at each checkpoint: group commits
# (every answer waits for one: the broker's acknowledgement) and garbage-collector pauses (the
# event loop stopped) longer than SLOW_BOUND, and the API's CPU per job (native work in its process:
# chDB's merges and queries).
SLOW_BOUND = "0.02"  # a bucket bound of both histograms (allmende.core.metrics)
TAIL_HISTOGRAMS = {"commits": "allmende_group_commit_seconds", "gc": "allmende_gc_pause_seconds"}


# A pause in the JVM's unified GC log (-Xlog:gc): "... GC(12) Pause Young (Normal) ... 3.456ms".
GC_PAUSE = re.compile(r"\bPause\b.* (\d+(?:\.\d+)?)ms$", re.M)


def broker_pauses(gc_log: Path | None) -> float:
    """The broker's GC pauses over SLOW_BOUND so far (NaN: a broker this run did not start)."""
    if gc_log is None or not gc_log.exists():
        return math.nan
    text = gc_log.read_text(errors="replace")
    return sum(1 for m in GC_PAUSE.finditer(text) if float(m.group(1)) > 1000 * float(SLOW_BOUND))


def tail_counts(page: str) -> dict[str, tuple[float, float]]:
    """Per TAIL_HISTOGRAMS: (observations up to SLOW_BOUND, all observations)."""
    return {
        k: (bucket(page, name, SLOW_BOUND), bucket(page, name, "+Inf")) for k, name in TAIL_HISTOGRAMS.items()
    }


# A problem in a process's log: an error or warning of structlog (JSON or console) or of faust, a
# traceback, a failed round. The meter's structlog lines reach its log through faust's stdout
# redirect, which labels each one [WARNING] whatever its level: those are not counted.
PROBLEM = re.compile(
    r'"level": "(warning|error|critical)"|\[(warning|error|critical) *\]|\[(ERROR|CRITICAL)\]'
    r"|\[WARNING\] (?!\d{4}-\d\d-\d\dT)|Traceback|_failed\b"
)


def log_problems(path: Path, limit: int = 3) -> tuple[int, list[str]]:
    """Lines of a process's log that report a problem (PROBLEM), and the first few."""
    found = [line for line in path.read_text(errors="replace").splitlines() if PROBLEM.search(line)]
    return len(found), [line[:240] for line in found[:limit]]


# -- the run -------------------------------------------------------------------------------------
@dataclass
class Row:
    label: str
    jobs: int
    elapsed_s: float
    rate: float
    rss: dict[str, float]
    p50_ms: float
    p99_ms: float
    errors: int
    live: int
    retired_api: float
    retired_meter: float
    admitted: int  # jobs admitted so far: less those retired, what each process still holds
    slow_commits: float  # the window's share of group commits over SLOW_BOUND
    slow_gc: float  # the window's garbage-collector pauses over SLOW_BOUND
    slow_broker_gc: float  # the same in the broker's JVM
    api_cpu_ms: float  # the API's CPU per job in the window


@dataclass
class Soak:
    args: argparse.Namespace
    api_url: str
    meter_metrics_url: str
    pids: dict[str, int | None]
    broker_gc: Path | None  # the local broker's GC log
    producer: KafkaProducer
    topic: str
    say: Console
    progress: Progress
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    latencies_s: array[float] = field(default_factory=lambda: array("d"))
    answered: bytearray = field(default_factory=bytearray)
    contiguous: int = 0  # jobs 0 .. contiguous-1 have all been answered
    errors: dict[str, int] = field(default_factory=dict)
    send_failures: int = 0
    live: int = 0
    admitted: int = 0
    finished: int = 0
    expected_gpu_seconds: int = 0
    max_behind_s: float = 0.0  # the most the generator started a request after its due instant
    rows: list[Row] = field(default_factory=list)
    samples: list[tuple[float, int, dict[str, float]]] = field(default_factory=list)
    t0: float = 0.0
    cpu0: dict[str, float] = field(default_factory=dict)
    ledger: int = -1  # GPU-seconds in the ledger at the end
    tail: dict[str, tuple[float, float]] = field(default_factory=dict)  # tail_counts at the last row
    api_cpu: float = 0.0  # the API's CPU seconds at the last row
    broker_slow_gc: float = 0.0  # broker_pauses at the last row

    def __post_init__(self) -> None:
        self.latencies_s = array("d", [math.nan]) * self.args.jobs
        self.answered = bytearray(self.args.jobs)

    def send(self, event: JobSubmitted | JobStarted | JobFinished) -> None:
        future = self.producer.send(self.topic, key=event.job_id.encode(), value=encode(event))
        future.add_errback(self._send_failed)

    def _send_failed(self, exc: BaseException) -> None:
        self.send_failures += 1

    # -- per job ---------------------------------------------------------------------------------
    async def job(self, pool: Pool, n: int, due: float, finishes: deque[tuple[int, str, int]]) -> None:
        try:
            await self._admit_and_start(pool, n, due, finishes)
        finally:
            self.answered[n] = 1
            while self.contiguous < self.args.jobs and self.answered[self.contiguous]:
                self.contiguous += 1

    async def _admit_and_start(
        self, pool: Pool, n: int, due: float, finishes: deque[tuple[int, str, int]]
    ) -> None:
        job_id, gpus = f"soak-{self.run_id}-{n}", GPUS[n % len(GPUS)]
        project = PROJECTS[n % len(PROJECTS)]
        body = {"job_id": job_id, "project": project, "user": "bench", "cluster": CLUSTER,
                "gpu_type": GPU_TYPE, "gpus": gpus, "requested_hours": 1}  # fmt: skip
        problem: str | None = None
        try:
            status, answer = await pool.call("POST", "/v1/admission", orjson.dumps(body))
            if status != 200:
                problem = f"HTTP {status}"
            elif (verdict := orjson.loads(answer)["verdict"]) != "admit":
                problem = f"verdict {verdict}"
        except Exception as exc:  # refused, reset, timed out: counted, and the run goes on
            problem = type(exc).__name__
        if problem is None:
            self.latencies_s[n] = time.perf_counter() - due
            at = int(time.time())
            common = {"producer": PRODUCER, "job_id": job_id}
            self.send(JobSubmitted(
                event_id=f"{job_id}:sub", occurred_at=at, project=project, user="bench", cluster=CLUSTER,
                gpu_type=GPU_TYPE, gpus=gpus, priority_class=PriorityClass.STANDARD, requested_seconds=3600,
                **common,
            ))  # fmt: skip
            host = f"soak-node-{n % HOSTS:03d}"
            self.send(
                JobStarted(event_id=f"{job_id}:start", occurred_at=at, gpus=gpus, hosts=(host,), **common)
            )
            finishes.append((at, job_id, gpus))  # answers come in time order: the deque stays sorted
            self.admitted += 1
            self.live += 1
        else:
            self.errors[problem] = self.errors.get(problem, 0) + 1

    async def finisher(self, finishes: deque[tuple[int, str, int]], generating: asyncio.Event) -> None:
        """`JobFinished` of each admitted job --run-seconds after its start, when the clock is there."""
        run_s = self.args.run_seconds
        while generating.is_set() or finishes:
            now = time.time()
            while finishes and finishes[0][0] + run_s <= now:
                started, job_id, gpus = finishes.popleft()
                self.send(JobFinished(
                    event_id=f"{job_id}:fin", occurred_at=started + run_s, producer=PRODUCER, job_id=job_id,
                    status=FinishStatus.SUCCEEDED, started_at=started,
                ))  # fmt: skip
                self.expected_gpu_seconds += gpus * run_s
                self.finished += 1
                self.live -= 1
            await asyncio.sleep(0.05)

    # -- measuring -------------------------------------------------------------------------------
    def rss(self) -> dict[str, float]:
        return {name: rss_mb(pid) for name, pid in self.pids.items()}

    async def sampler(self) -> None:
        while True:
            self.samples.append((time.perf_counter() - self.t0, self.contiguous, self.rss()))
            await asyncio.sleep(self.args.sample_s)

    async def scrape(self, client: httpx.AsyncClient) -> tuple[str, str]:
        """The /metrics pages of the API and the meter worker ("" where one did not answer)."""
        pages = []
        for url in (f"{self.api_url}/metrics/", self.meter_metrics_url):
            try:
                pages.append((await client.get(url)).text)
            except httpx.HTTPError:
                pages.append("")
        return pages[0], pages[1]

    async def row(self, client: httpx.AsyncClient, label: str, first: int, last: int) -> Row:
        elapsed = time.perf_counter() - self.t0
        window = sorted(x for x in self.latencies_s[first:last] if not math.isnan(x))

        def pct(q: float) -> float:
            return 1000 * window[min(len(window) - 1, int(q * len(window)))] if window else math.nan

        rss = self.rss()
        api_page, meter_page = await self.scrape(client)
        # what each process has let go of so far (their metrics)
        api = metric(api_page, "allmende_admission_retired_jobs_total")
        meter = metric(meter_page, "allmende_meter_retired_jobs_total")
        tail = tail_counts(api_page)
        slow = {k: (n - self.tail[k][1]) - (fast - self.tail[k][0]) for k, (fast, n) in tail.items()}
        commits = tail["commits"][1] - self.tail["commits"][1]
        pid = self.pids.get("API")
        cpu = math.nan if pid is None else cpu_seconds(pid)
        cpu_per_job = math.nan if first == last else 1000 * (cpu - self.api_cpu) / (last - first)
        pauses = broker_pauses(self.broker_gc)
        slow_broker_gc, self.broker_slow_gc = pauses - self.broker_slow_gc, pauses
        self.tail, self.api_cpu = tail, cpu
        errors = last - first - len(window)
        rate = math.nan if first == last else last / elapsed
        row = Row(
            label,
            last,
            elapsed,
            rate,
            rss,
            pct(0.5),
            pct(0.99),
            errors,
            self.live,
            api,
            meter,
            self.admitted,
            slow["commits"] / commits if commits else math.nan,
            slow["gc"],
            slow_broker_gc,
            cpu_per_job,
        )
        self.rows.append(row)
        self.say.print(render(row))
        return row

    async def reporter(self, client: httpx.AsyncClient, checkpoints: list[int]) -> None:
        previous = 0
        for checkpoint in checkpoints:
            while self.contiguous < checkpoint:
                await asyncio.sleep(0.02)
            await self.row(client, f"{checkpoint:,}", previous, checkpoint)
            previous = checkpoint

    # -- the run ---------------------------------------------------------------------------------
    async def run(self, checkpoints: list[int]) -> None:
        args = self.args
        scheduler = {"Authorization": f"Bearer {SCHEDULER_TOKEN}"}
        make = CLIENTS[args.client]
        pool = Pool(lambda: make(self.api_url, scheduler), args.connections)
        in_flight = asyncio.Semaphore(args.max_in_flight)
        finishes: deque[tuple[int, str, int]] = deque()
        generating = asyncio.Event()
        generating.set()
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=30) as client:
            self.t0 = time.perf_counter()
            self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.cpu_pids().items()}
            self.api_cpu = self.cpu0.get("API", math.nan)
            self.tail = tail_counts((await self.scrape(client))[0])
            self.broker_slow_gc = broker_pauses(self.broker_gc)
            helpers = [
                asyncio.create_task(self.finisher(finishes, generating)),
                asyncio.create_task(self.sampler()),
            ]
            reporter = asyncio.create_task(self.reporter(client, checkpoints))
            task = self.progress.add_task("jobs", total=args.jobs)

            async def one(n: int, due: float) -> None:
                try:
                    await self.job(pool, n, due, finishes)
                finally:
                    in_flight.release()

            try:
                for n in range(args.jobs):
                    due = self.t0 + n / args.rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await in_flight.acquire()
                    self.max_behind_s = max(self.max_behind_s, time.perf_counter() - due)
                    started = asyncio.create_task(one(n, due))
                    tasks.add(started)
                    started.add_done_callback(tasks.discard)
                    if n % 50 == 0:
                        self.progress.update(task, completed=n, description=f"jobs ({self.live:,} live)")
                await reporter
                self.progress.update(task, completed=args.jobs)
                generating.clear()
                await helpers[0]  # the last runs finished
            finally:
                for helper in (*helpers, reporter):
                    helper.cancel()
                await pool.close()
            await asyncio.to_thread(self.producer.flush, 60)
            self.say.print(f"all {args.jobs:,} jobs sent and finished ({self.admitted:,} admitted), "
                           f"{time.perf_counter() - self.t0:,.0f} s; waiting for the ledger")  # fmt: skip
            await self.await_ledger(client)
            settle = args.retention + 2 * args.sample_s
            await asyncio.sleep(settle)  # the last jobs past their retention too (where a clock moves)
            await self.row(client, f"end +{settle:g}s", args.jobs, args.jobs)

    def cpu_pids(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids.items() if pid is not None}

    async def ledger_total(self, client: httpx.AsyncClient) -> int:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        total = 0
        for project in PROJECTS:
            answer = await client.get(f"{self.api_url}/v1/projects/{project}/usage", headers=admin)
            if answer.status_code == 200:
                total += int(answer.json()["total_gpu_seconds"])
            elif answer.status_code != 404:  # 404: nothing recorded for the project yet
                raise RuntimeError(f"usage of {project}: HTTP {answer.status_code} {answer.text[:300]}")
        return total

    async def await_ledger(self, client: httpx.AsyncClient) -> None:
        t = time.perf_counter()
        deadline = t + self.args.ledger_timeout
        total = await self.ledger_total(client)
        while total != self.expected_gpu_seconds and time.perf_counter() < deadline:
            await asyncio.sleep(1)
            total = await self.ledger_total(client)
        self.ledger = total
        waited = time.perf_counter() - t
        if total == self.expected_gpu_seconds:
            self.say.print(f"ledger: {total:,} GPU-s = the sum of the runs, exactly (after {waited:.1f} s)")
        else:
            self.say.print(
                f"ledger: {total:,} GPU-s, the runs {self.expected_gpu_seconds:,} GPU-s: difference "
                f"{total - self.expected_gpu_seconds:+,} GPU-s after waiting {waited:.0f} s: MISMATCH"
            )


# -- report --------------------------------------------------------------------------------------
HEAD = (
    f"{'jobs':>13}  {'elapsed s':>9}  {'jobs/s':>6}  {'API MB':>7}  {'meter MB':>8}  {'broker MB':>9}  "
    f"{'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}  {'live':>5}  {'held API':>8}  {'held meter':>10}"
    f"  {'commits >20ms':>13}  {'GC >20ms':>7}  {'broker GC >20':>13}  {'API CPU/job':>10}"
)


def render(r: Row) -> str:
    api, meter, broker = (r.rss[name] for name in PROCESSES)
    rate = "-" if math.isnan(r.rate) else f"{r.rate:.1f}"
    return (
        f"{r.label:>13}  {r.elapsed_s:>9,.0f}  {rate:>6}  {api:>7,.0f}  {meter:>8,.0f}  "
        f"{broker:>9,.0f}  {r.p50_ms:>7.2f}  {r.p99_ms:>7.2f}  {r.errors:>6,}  {r.live:>5,}  "
        f"{r.admitted - r.retired_api:>8,.0f}  {r.admitted - r.retired_meter:>10,.0f}  "
        f"{r.slow_commits:>13.2%}  {r.slow_gc:>7,.0f}  {r.slow_broker_gc:>13,.0f}  {r.api_cpu_ms:>10.2f}"
    )


def verdict(soak: Soak, logs: dict[str, Path]) -> bool:
    """Print the verdict; True if nothing odd was seen (errors, ledger, logs)."""
    args, say = soak.args, soak.say
    checkpoints = [r for r in soak.rows if not r.label.startswith("end")]
    first, last = checkpoints[0], checkpoints[-1]
    wall = time.perf_counter() - soak.t0
    say.print()
    behind_ms = soak.max_behind_s * 1000
    say.print(f"rate asked {args.rate:g} jobs/s; achieved {last.rate:.1f} jobs/s to the last checkpoint; "
              f"the generator started a request at most {behind_ms:,.0f} ms after it was due")  # fmt: skip
    if last.rate < 0.95 * args.rate or soak.max_behind_s > 1.0:
        say.print("  note: the generator did not keep the rate (see above): the load was lighter than asked")
    cpu = ", ".join(
        f"{name} {(cpu_seconds(pid) - soak.cpu0.get(name, 0.0)) / wall:.0%}"
        for name, pid in soak.cpu_pids().items()
    )
    say.print(f"CPU over the run (of one core): {cpu}, load generator {time.process_time() / wall:.0%}; "
              f"{os.cpu_count()} cores")  # fmt: skip
    sound = True
    if soak.errors or soak.send_failures:
        sound = False
        say.print(f"  note: admission errors {soak.errors}, job events not sent {soak.send_failures}")
    if soak.ledger != soak.expected_gpu_seconds:
        sound = False
    for name, path in logs.items():
        count, lines = log_problems(path)
        if count:
            sound = False
            say.print(f"  note: {name} log ({path}): {count} lines with a warning or an error, first:")
            for line in lines:
                say.print(f"    {line}")
    say.print()
    say.print(f"memory, after {last.jobs:,} jobs against after {first.jobs:,} (target within "
              f"{MEMORY_TARGET:.0%}; the broker is shown, not targeted):")  # fmt: skip
    for name in PROCESSES:
        a, b = first.rss[name], last.rss[name]
        change = (b - a) / a if a else math.nan
        target = "" if name == "broker" else (" yes" if abs(change) <= MEMORY_TARGET else " NO")
        say.print(f"  {name:<7} {a:>8,.0f} MB -> {b:>8,.0f} MB  {change:>+7.1%}{target}")
    better = "yes" if last.p99_ms <= first.p99_ms else "NO"
    say.print(
        f"admission p99 not worse: {better} ({first.p99_ms:.2f} ms after {first.jobs:,} jobs, "
        f"{last.p99_ms:.2f} ms after {last.jobs:,}; p50 {first.p50_ms:.2f} -> {last.p50_ms:.2f} ms)"
    )
    if len(checkpoints) >= 3:
        # One window's p99 wanders with whatever else the machine does: the slope over every
        # window tells a tail that grows with history from one that only wanders.
        p99s = [r.p99_ms for r in checkpoints]
        slope = statistics.linear_regression([r.jobs for r in checkpoints], p99s).slope
        series = ", ".join(f"{p:.0f}" for p in p99s)
        say.print(
            f"admission p99 per window (ms): {series}; trend {slope * 100_000:+.1f} ms per 100,000 jobs "
            f"(min {min(p99s):.1f}, max {max(p99s):.1f})"
        )
    window = last.live + args.rate * args.retention
    say.print(
        f"jobs held at the last checkpoint: admission {last.admitted - last.retired_api:,.0f}, meter "
        f"{last.admitted - last.retired_meter:,.0f}; live + rate x retention = {window:,.0f}"
    )
    match = "yes" if soak.ledger == soak.expected_gpu_seconds else "NO"
    say.print(
        f"ledger = sum of the runs: {match} ({soak.ledger:,} against {soak.expected_gpu_seconds:,} GPU-s)"
    )
    return sound


def write_csv(path: Path, soak: Soak) -> None:
    with path.open("w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["elapsed_s", "jobs_answered", *(f"{n}_rss_mb" for n in PROCESSES)])
        for elapsed, jobs, rss in soak.samples:
            w.writerow([f"{elapsed:.1f}", jobs, *(f"{rss[n]:.1f}" for n in PROCESSES)])


# -- main ----------------------------------------------------------------------------------------
def checkpoint_list(text: str, jobs: int) -> list[int]:
    values = sorted({int(x.replace("_", "")) for x in text.split(",") if x.strip()})
    if not values or values[0] < 1 or values[-1] > jobs or len(values) < 2:
        raise ValueError(f"need at least two checkpoints between 1 and --jobs ({jobs:,})")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=100.0, help="jobs admitted per second (open loop)")
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs in all")
    parser.add_argument(
        "--checkpoints", default="20000,200000",
        help="comma-separated job counts at which a row is printed; the first and last are compared",
    )  # fmt: skip
    parser.add_argument(
        "--retention", type=int, default=5,
        help="ALLMENDE_ENDED_JOB_RETENTION_S of every process: seconds an ended job stays in memory",
    )  # fmt: skip
    parser.add_argument("--run-seconds", type=int, default=20, help="each job's run, start to finish")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument(
        "--client", choices=sorted(CLIENTS), default="raw",
        help="raw HTTP/1.1 over asyncio streams (a few microseconds per request) or httpx (about 1 ms of "
        "CPU per request): bench/admission.py's clients",
    )  # fmt: skip
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections to the API")
    parser.add_argument(
        "--max-in-flight", type=int, default=1000,
        help="admission requests outstanding at most; past it the generator waits (and falls behind)",
    )  # fmt: skip
    parser.add_argument(
        "--ledger-timeout", type=float, default=600.0,
        help="seconds to wait at the end for the ledger to hold every run",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", default=None,
        help="a running Kafka broker to use (default: start a local one for the run, so that its memory "
        "is this run's alone)",
    )  # fmt: skip
    parser.add_argument(
        "--broker-pid", type=int, default=None,
        help="with --bootstrap: the broker's pid, for its memory (default: whoever listens on its port)",
    )  # fmt: skip
    parser.add_argument(
        "--api-log-level", default="WARNING",
        help="the API process's ALLMENDE_LOG_LEVEL (INFO shows when admission lets go of jobs)",
    )  # fmt: skip
    parser.add_argument("--csv", type=Path, default=None, help="write every memory sample to this CSV file")
    parser.add_argument(
        "--keep", action="store_true",
        help="keep the temporary directory (logs, chDB, meter state); kept anyway if something was odd",
    )  # fmt: skip
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none without a terminal)"
    )
    args = parser.parse_args()
    try:
        checkpoints = checkpoint_list(args.checkpoints, args.jobs)
    except ValueError as exc:
        parser.error(str(exc))
    if args.rate <= 0 or args.jobs < 2 or args.retention < 1 or args.run_seconds < 1 or args.sample_s <= 0:
        parser.error("need --rate > 0, --jobs >= 2, --retention >= 1, --run-seconds >= 1, --sample-s > 0")

    signal.signal(signal.SIGTERM, _interrupt)  # ends the run like Ctrl-C, through the `finally` blocks
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    tag = f"soak{uuid.uuid4().hex[:8]}"
    say = Console(highlight=False, soft_wrap=True)
    keep = args.keep
    try:
        with ExitStack() as stack:
            bootstrap, broker_pid, broker_gc = stack.enter_context(
                kafka(args.bootstrap, args.broker_pid, tmp)
            )
            stack.callback(delete_topics, bootstrap, tag)  # after the processes stop, before the broker
            api_port = free_port()
            api_env = platform_env(
                bootstrap, tmp, tag, state_dir=str(tmp / "api-state"), log_level=args.api_log_level,
                ended_job_retention_s=str(args.retention),
            )  # fmt: skip
            api_log = tmp / "api.log"
            api_argv = python_module("allmende", "serve", "--port", str(api_port))
            api = stack.enter_context(child(api_argv, api_env, api_log))
            api_url = f"http://127.0.0.1:{api_port}"
            wait_http(f"{api_url}/healthz", api, api_log)
            period = quarter(dt.datetime.now(dt.UTC))
            # Room for twice the jobs live at once, were each of them the largest.
            cluster_gpus = min(MAX_GPUS, max(1024, math.ceil(2 * args.rate * args.run_seconds * max(GPUS))))
            apply_plan(api_url, plan_yaml(period, cluster_gpus))

            settings = Settings(
                state_dir=tmp / "meter-state", kafka_bootstrap_servers=bootstrap, topic_prefix=tag,
                meter_app_id=f"{tag}-meter", ended_job_retention_s=args.retention,
            )  # fmt: skip
            meter_port = free_port()
            meter = MeterProcess(settings, tmp / "logs", metrics_port=meter_port)
            stack.callback(meter.stop, signal.SIGTERM, 30)
            meter.wait_ready(120)
            producer = make_producer(bootstrap)
            stack.callback(producer.close, 30)

            say.print(
                f"API {api_url} (pid {api.pid}), meter worker (pid {meter.pid}), broker {bootstrap} "
                f"(pid {broker_pid if broker_pid is not None else 'unknown'}); topics {tag}.*, {tmp}\n"
                f"plan {period}: 1 cluster of {cluster_gpus:,} GPUs, {len(PROJECTS)} projects; retention "
                f"{args.retention} s; {args.jobs:,} jobs at {args.rate:g}/s, each run {args.run_seconds} s "
                f"on {GPUS} GPUs in turn: about {args.rate * args.run_seconds:,.0f} live"
            )
            progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=say, disable=args.no_progress or not say.is_terminal, transient=True,
            )  # fmt: skip
            soak = Soak(
                args=args, api_url=api_url, meter_metrics_url=f"http://127.0.0.1:{meter_port}/metrics",
                pids={"API": api.pid, "meter": meter.pid, "broker": broker_pid}, broker_gc=broker_gc,
                producer=producer, topic=settings.job_events_topic, say=say, progress=progress,
            )  # fmt: skip
            say.print(HEAD)
            say.print("-" * len(HEAD))
            with progress:
                asyncio.run(soak.run(checkpoints))
            if args.csv is not None:
                write_csv(args.csv, soak)
            if not verdict(soak, {"API": api_log, "meter": meter.log_path}):
                keep = True
    except KeyboardInterrupt:
        print("interrupted: processes stopped", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if keep:
            print(f"kept {tmp} (logs: api.log, logs/meter-*.log)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
