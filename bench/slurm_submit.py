"""Slurm submission benchmark: what Allmende's Slurm integration costs `sbatch` and slurmctld.

On one real local Slurm 22.05 (infra/slurm/start.sh in a temporary state directory on free
ports, as tests/slurm starts it) and the platform (the API served over real HTTP, in this process,
with tests/slurm's plan applied, its cluster declared large enough that every submission is
admitted; on KAFKA_BOOTSTRAP_SERVERS or a local broker; embedded chDB), it times `sbatch` in
three ways, in the same run:

- "none": no integration. The client's slurm.conf has no CliFilterPlugins and slurmctld's
  job_submit.lua returns slurm.SUCCESS at once (same Lua plugin machinery, nothing asked).
- "job_submit": Allmende's job_submit.lua, and every job carries an admission ticket fetched from
  the API beforehand, as cli_filter.lua fetches it: what runs under slurmctld's job write lock
  (the ticket checked with HMAC-SHA256, the id remembered, the job tagged). The targets of issue 23
  are about this: every submission on the cluster waits behind it.
- "cli_filter": the whole path a user's sbatch takes: cli_filter.lua asks `POST /v1/admission`
  (decision recorded on Kafka before the answer) from inside sbatch, then job_submit.lua checks
  the ticket. The difference to "job_submit" is the user's own wait for the API, outside the lock.

Submission phases: `--jobs` held jobs (`sbatch --hold -A rich --gres=gpu:h100:1 -t 5 --wrap
true`, nothing scheduled) from `--workers` threads, and `--sequential` from one; rate = jobs /
wall time; each call's wall time a latency sample (p50/p99, nearest rank). Order: parallel none,
job_submit, cli_filter; sequential cli_filter, job_submit, none (so jobs slurmctld still remembers
after scancel weigh on both ends alike).

Start phase: `--starts` jobs that run (`--wrap true`, 1 of 8 GPUs, one at a time, 0.5 s apart),
once without the integration and once with cli_filter; the time from submission to start is
sacct's Start - Submit (whole seconds), p50/p99 per way.

Targets (issue 23): job_submit rate >= 90 % of none, with 1 and with 4 submitters; p50 overhead
(job_submit - none, sequential) under 1 ms; p99 submission-to-start with the integration within
1 s of none. Prints figures, asserts nothing.

    .venv/bin/python bench/slurm_submit.py [--jobs 300] [--workers 4] [--sequential 100] [--starts 30]

Needs root and Debian's Slurm packages (infra/slurm/install.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from allmende.core.kafka_local import broker_for_run
from allmende.core.settings import Settings
from allmende.integrations.slurm.local import SUBMIT_TOKEN
from allmende.integrations.slurm.local import plan_text as quarter_plan
from allmende.testing.budget_harness import ADMIN, ok, serving, with_tokens
from allmende.testing.slurm_harness import (
    JOB_SUBMIT_LUA,
    PLATFORM_CLUSTER,
    SLURMCTLD,
    SlurmCluster,
    running_slurm,
)
from allmende.topology import create_app

ROOT = Path(__file__).resolve().parents[1]
NOOP_LUA = """-- bench/slurm_submit.py: admits every job without asking anything
function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
return slurm.SUCCESS
"""
JOB = ("-A", "rich", "--gres=gpu:h100:1", "-t", "5", "-J", "bench")
HELD = ("--hold", *JOB, "--wrap", "true")
WARMUP = 5
MODES = ("none", "job_submit", "cli_filter")


@dataclass
class Phase:
    mode: str
    workers: int
    latencies: list[float]
    wall_s: float
    failed: int
    verdicts: dict[str, int]

    def pct(self, q: float) -> float:
        return nearest_rank(self.latencies, q) * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The tests' local Slurm (allmende/testing/slurm_harness.py), without the lifecycle hooks."""
    state = Path(tempfile.mkdtemp(prefix="bslurm-"))  # short: the munge socket path has a limit
    log("starting Slurm (infra/slurm/start.sh)")
    try:
        with running_slurm(state, hooks=False) as cluster:
            try:
                yield cluster
            finally:
                log("stopping Slurm (infra/slurm/stop.sh)")
    finally:
        shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def platform(bootstrap: str, work: Path, gpus: int, ticket_key: Path) -> Iterator[tuple[Settings, str]]:
    """The API over real HTTP with the tests' plan applied (the cluster declared with `gpus`
    GPUs), signing tickets with the Slurm side's key: its settings and URL."""
    tag = f"b{uuid.uuid4().hex[:10]}"
    settings = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=2, writer_group=f"{tag}-writer", log_json=False,
        admission_ticket_key_file=ticket_key,
    )  # fmt: skip
    app = create_app(with_tokens(settings))
    with serving(app) as url:
        plan = quarter_plan(dt.datetime.now(dt.UTC), "bench-slurm").replace("gpus: 8}", f"gpus: {gpus}}}")
        body = {"text": plan}
        ok(httpx.post(f"{url}/v1/admin/plan/apply", json=body, headers=ADMIN, timeout=60))
        yield settings, url


@dataclass
class Bench:
    slurm: SlurmCluster
    url: str
    bare_env: dict[str, str]  # the client's environment without cli_filter
    tickets: list[str]
    mode: str = ""

    def switch(self, mode: str) -> None:
        """job_submit.lua: Allmende's or the no-op one (slurmctld sees a newer mtime)."""
        self.mode = mode
        target = self.slurm.etc / "job_submit.lua"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(NOOP_LUA if mode == "none" else JOB_SUBMIT_LUA.read_text())
        os.replace(tmp, target)
        time.sleep(1.1)
        os.utime(target)  # whole-second mtime strictly newer than any earlier load

    def fetch_tickets(self, count: int) -> None:
        """Tickets for `count` jobs as cli_filter.lua would ask: one POST per job, in advance."""
        headers = {"Authorization": f"Bearer {SUBMIT_TOKEN}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            for n in range(count):
                body = {
                    "job_id": f"slurm-{PLATFORM_CLUSTER}-{int(time.time())}-b{n}-{uuid.uuid4().hex[:6]}",
                    "project": "rich", "user": "root", "cluster": PLATFORM_CLUSTER, "gpu_type": "H100",
                    "gpus": 1, "priority_class": "standard", "interactive": False,
                    "requested_hours": "0.083333333",
                }  # fmt: skip
                self.tickets.append(ok(client.post("/v1/admission", json=body))["ticket"])

    def sbatch(self, *args: str) -> tuple[float, str | None, str]:
        if self.mode == "cli_filter":
            command, env = ["sbatch", "--parsable", "-o", "/dev/null", *args], self.slurm.env
        else:
            extra = (
                ["--comment", f"allmende-ticket:{self.tickets.pop()}"] if self.mode == "job_submit" else []
            )
            command, env = ["sbatch", "--parsable", "-o", "/dev/null", *extra, *args], self.bare_env
        t0 = time.perf_counter()
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        elapsed = time.perf_counter() - t0
        job = result.stdout.strip().split(";")[0] if result.returncode == 0 else None
        if job is None:
            log(f"sbatch failed: {result.stderr.strip()}")
        return elapsed, job, result.stderr

    def phase(self, mode: str, jobs: int, workers: int) -> Phase:
        self.switch(mode)
        if mode == "job_submit":
            self.fetch_tickets(jobs + WARMUP)
        warm = [self.sbatch(*HELD)[1] for _ in range(WARMUP)]
        if None in warm:
            raise SystemExit(f"{mode}: a warm-up submission failed")
        seen = admin_comment(self.slurm, warm[-1] or "")
        if (mode != "none") != seen.startswith("AdminComment=allmende:"):
            raise SystemExit(f"{mode}: the wrong job_submit.lua answered ({seen!r})")
        log(f"{mode}: {jobs} sbatch from {workers} worker(s) ({seen.split(' ')[0][:40]} on warm-up)")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda _: self.sbatch(*HELD), range(jobs)))
        wall = time.perf_counter() - t0
        ids = [job for _, job, _ in results if job]
        counts = verdicts(self.slurm, ids) if mode != "none" else {"untouched": len(ids)}
        cancel_all(self.slurm)
        latencies = [elapsed for elapsed, job, _ in results if job]
        return Phase(mode, workers, latencies, wall, jobs - len(ids), counts)

    def starts(self, mode: str, jobs: int) -> list[int]:
        """Seconds from submission to start (sacct) of `jobs` jobs that run, one at a time."""
        self.switch(mode)
        ids = []
        for _ in range(jobs):
            _, job, said = self.sbatch(*JOB, "--wrap", "true")
            if job is None:
                raise SystemExit(f"starts ({mode}): sbatch failed: {said}")
            ids.append(job)
            time.sleep(0.5)
        log(f"starts ({mode}): {jobs} jobs submitted; waiting for sacct")
        waits: list[int] = []
        deadline = time.monotonic() + 300
        while len(waits) < jobs and time.monotonic() < deadline:
            waits = [w for job in ids if (w := start_wait(self.slurm, job)) is not None]
            time.sleep(1)
        if len(waits) < jobs:
            raise SystemExit(f"starts ({mode}): {jobs - len(waits)} jobs never started")
        return waits


def verdicts(slurm: SlurmCluster, jobs: list[str]) -> dict[str, int]:
    """How the jobs went in (`scontrol show job -o`): admitted (AdminComment allmende:<id>, not
    held by the plugin), queued (held by the plugin: `allmende: queued` in the comment), untouched
    (no admission id)."""
    out = slurm.run("scontrol", "show", "job", "-o", timeout=120).stdout
    lines = {m.group(1): line for line in out.splitlines() if (m := re.match(r"JobId=(\d+) ", line))}
    counts: dict[str, int] = {}
    for job in jobs:
        line = lines.get(job, "")
        if "Comment=allmende: queued" in line:
            kind = "queued"
        elif "AdminComment=allmende:" in line:
            kind = "admitted"
        else:
            kind = "untouched" if line else "?"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def admin_comment(slurm: SlurmCluster, job: str) -> str:
    line = slurm.run("scontrol", "show", "job", job, "-o").stdout
    return next((f for f in line.split() if f.startswith("AdminComment=")), "AdminComment=")


def cancel_all(slurm: SlurmCluster) -> None:
    slurm.run("scancel", "-u", "root", "--name", "bench", timeout=300)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = slurm.run("squeue", "-h", "-u", "root", "-t", "PD,R", "-o", "%i").stdout.strip()
        if not out:
            return
        time.sleep(0.5)


def start_wait(slurm: SlurmCluster, job: str) -> int | None:
    """sacct's Start - Submit of the job, in seconds, once it has started."""
    out = slurm.run("sacct", "-j", job, "-X", "-n", "-P", "-o", "Submit,Start").stdout.strip()
    submit, _, start = out.partition("|")
    if not start or start in {"Unknown", "None"}:
        return None
    began = dt.datetime.fromisoformat(start) - dt.datetime.fromisoformat(submit)
    return int(began.total_seconds())


def report(phases: list[Phase], starts: dict[str, list[int]]) -> None:
    print()
    print(f"{'phase':<26} {'jobs':>5} {'failed':>6} {'subm/s':>8} {'p50 ms':>8} {'p99 ms':>8}  verdicts")
    for p in phases:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(p.verdicts.items()))
        label = f"{p.mode} ({p.workers} worker{'s' if p.workers > 1 else ''})"
        print(
            f"{label:<26} {len(p.latencies):>5} {p.failed:>6} {p.rate:>8.1f} "
            f"{p.pct(0.5):>8.2f} {p.pct(0.99):>8.2f}  {kinds}"
        )
    by = {(p.mode, p.workers > 1): p for p in phases}
    print()
    for parallel, what in ((True, "4 submitters" if by[("none", True)].workers == 4 else "parallel"),
                           (False, "1 submitter")):  # fmt: skip
        none, checked, full = (by[(m, parallel)] for m in MODES)
        ratio = checked.rate / none.rate
        verdict = "met" if ratio >= 0.9 else "NOT met"
        print(f"rate job_submit / none, {what}: {ratio:6.1%}  (target >= 90 %: {verdict}); "
              f"cli_filter / none: {full.rate / none.rate:6.1%}")  # fmt: skip
    seq_none, seq_checked, seq_full = (by[(m, False)] for m in MODES)
    overhead = seq_checked.pct(0.5) - seq_none.pct(0.5)
    print(f"p50 overhead under slurmctld's lock (job_submit - none, 1 submitter): {overhead:+.2f} ms  "
          f"(target < 1 ms: {'met' if overhead < 1 else 'NOT met'})")  # fmt: skip
    print(f"p50 wait of a user's sbatch for the API (cli_filter - job_submit): "
          f"{seq_full.pct(0.5) - seq_checked.pct(0.5):+.2f} ms (outside the lock)")  # fmt: skip
    if starts:
        p99 = {mode: nearest_rank([float(w) for w in waits], 0.99) for mode, waits in starts.items()}
        p50 = {mode: nearest_rank([float(w) for w in waits], 0.5) for mode, waits in starts.items()}
        gap = p99["cli_filter"] - p99["none"]
        print(f"submission to start (sacct, whole s): none p50 {p50['none']:.0f} s / "
              f"p99 {p99['none']:.0f} s; cli_filter p50 {p50['cli_filter']:.0f} s / "
              f"p99 {p99['cli_filter']:.0f} s: p99 {gap:+.0f} s "
              f"(target within 1 s: {'met' if gap <= 1 else 'NOT met'})")  # fmt: skip


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--jobs", type=int, default=300, help="submissions per parallel phase (default 300)")
    add("--workers", type=int, default=4, help="parallel submitters (default 4)")
    add("--sequential", type=int, default=100, help="submissions per sequential phase (default 100)")
    add("--starts", type=int, default=30, help="jobs that run, per way, for the start times (0: none)")
    args = parser.parse_args()
    if not SLURMCTLD.exists() or shutil.which("sbatch") is None:
        raise SystemExit("Slurm is not installed: infra/slurm/install.sh")
    if os.geteuid() != 0:
        raise SystemExit("infra/slurm/start.sh runs the Slurm daemons as root")

    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="allmende-bench-slurm-"))
        stack.callback(shutil.rmtree, work, True)
        bootstrap = stack.enter_context(broker_for_run(work / "kafka", log))
        slurm = stack.enter_context(slurm_cluster())
        # Admitted jobs keep their GPUs until the start deadline (1 h), even when cancelled: the
        # platform's cluster is declared large enough that every submission is admitted.
        total = 2 * (args.jobs + args.sequential + 2 * WARMUP) * 3 + args.starts
        gpus = max(1024, -(-total // 8) * 8)
        settings, url = stack.enter_context(platform(bootstrap, work, gpus, slurm.ticket_key_file))
        slurm.configure(api_url=url, kafka_bootstrap_servers=bootstrap, topic_prefix=settings.topic_prefix)
        bare = work / "bare"
        bare.mkdir()
        conf = (slurm.etc / "slurm.conf").read_text().splitlines()
        (bare / "slurm.conf").write_text(
            "\n".join(ln for ln in conf if not ln.startswith("CliFilterPlugins"))
        )
        bench = Bench(slurm, url, {**slurm.env, "SLURM_CONF": str(bare / "slurm.conf")}, [])
        phases = [bench.phase(mode, args.jobs, args.workers) for mode in MODES]
        phases += [bench.phase(mode, args.sequential, 1) for mode in reversed(MODES)]
        starts = (
            {mode: bench.starts(mode, args.starts) for mode in ("none", "cli_filter")} if args.starts else {}
        )
    report(phases, starts)
    print(f"\nwhole run (Slurm and platform start and stop included): {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
