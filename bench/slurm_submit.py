"""Slurm submission benchmark: what Allmende's job_submit.lua costs `sbatch`.

On one real local Slurm 22.05 (infra/slurm/start.sh in a temporary state directory on free
ports, exactly as tests/slurm starts it) and the platform (the API served over real HTTP, in this
process, with tests/slurm's plan applied, its cluster declared with at least 1024 GPUs so that
every submission is admitted rather than queued for lack of GPUs; on KAFKA_BOOTSTRAP_SERVERS or
a local broker; embedded chDB), it times `sbatch` in four phases of the same run:

- "plugin": JobSubmitPlugins=lua with integrations/slurm/job_submit.lua, which asks the real
  admission API (`POST /v1/admission`, decision recorded on Kafka before the answer) per job;
- "no plugin": JobSubmitPlugins=lua with a job_submit.lua whose slurm_job_submit returns
  slurm.SUCCESS without asking anything (same slurmctld, same plugin machinery; so the
  difference is what the Allmende plugin itself costs: config read, HTTP round trip, decision).

The plugin is switched by rewriting `<state>/etc/job_submit.lua` (then `sleep 1; touch`:
slurmctld reloads it on the next submission when its mtime is newer, in whole seconds); a warm-up
submission after each switch checks which plugin answered (the Allmende one sets
`AdminComment=allmende:<id>`). Every job is `sbatch --hold -A rich --gres=gpu:h100:1 -t 5 --wrap
true`: an in-budget GPU job (so the plugin takes the realistic admit path), held so nothing is
ever scheduled; each phase's jobs are cancelled (`scancel`) before the next phase.

Parallel phases submit `--jobs` jobs from `--workers` threads as fast as they can (rate = jobs /
wall time of the phase); sequential phases submit `--sequential` jobs one after another (1
worker). Each sbatch call's wall time is one latency sample (p50/p99, nearest rank). Order:
parallel without, parallel with, sequential with, sequential without (ABBA, so the jobs
slurmctld still remembers after scancel (MinJobAge) weigh on both sides alike).

Targets from the issue: the rate with the plugin at least 50 % of the rate without it; the p50
overhead (sequential p50 with minus without) under 10 ms. Prints figures, asserts nothing.

    .venv/bin/python bench/slurm_submit.py [--jobs 300] [--workers 4] [--sequential 100]

Needs root and Debian's Slurm packages (infra/slurm/install.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import shutil
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
from allmende.testing.budget_harness import ADMIN, ok, plan_text, serving, with_tokens
from allmende.testing.slurm_harness import (
    JOB_SUBMIT_LUA,
    PLAN,
    PLATFORM_CLUSTER,
    SLURMCTLD,
    SlurmCluster,
    current_quarter,
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
JOB = ("--hold", "-A", "rich", "--gres=gpu:h100:1", "-t", "5", "-J", "bench", "--wrap", "true")
WARMUP = 5


@dataclass
class Phase:
    name: str
    plugin: bool
    workers: int
    latencies: list[float]
    wall_s: float
    failed: int
    verdicts: dict[str, int]

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The tests' local Slurm (tests/slurm/slurm_harness.py), without the lifecycle hooks."""
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
def platform(bootstrap: str, work: Path, gpus: int) -> Iterator[tuple[Settings, str]]:
    """The API over real HTTP with the tests' plan applied (the cluster declared with `gpus`
    GPUs): its settings and URL."""
    tag = f"b{uuid.uuid4().hex[:10]}"
    settings = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=2, writer_group=f"{tag}-writer", log_json=False,
    )  # fmt: skip
    app = create_app(with_tokens(settings))
    with serving(app) as url:
        period = current_quarter(dt.datetime.now(dt.UTC))
        plan = PLAN.format(period=period, cluster=PLATFORM_CLUSTER).replace("gpus: 8}", f"gpus: {gpus}}}")
        body = {"text": plan_text(plan)}
        ok(httpx.post(f"{url}/v1/admin/plan/apply", json=body, headers=ADMIN, timeout=60))
        yield settings, url


def switch_plugin(slurm: SlurmCluster, plugin: bool) -> None:
    """Install the Allmende plugin or the no-op one; make slurmctld see a newer mtime."""
    target = slurm.etc / "job_submit.lua"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(JOB_SUBMIT_LUA.read_text() if plugin else NOOP_LUA)
    os.replace(tmp, target)
    time.sleep(1.1)
    os.utime(target)  # whole-second mtime strictly newer than any earlier load


def submit(slurm: SlurmCluster) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    result = slurm.sbatch(*JOB)
    elapsed = time.perf_counter() - t0
    job = result.stdout.strip().split(";")[0] if result.returncode == 0 else None
    if job is None:
        log(f"sbatch failed: {result.stderr.strip()}")
    return elapsed, job


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


def run_phase(slurm: SlurmCluster, name: str, plugin: bool, jobs: int, workers: int) -> Phase:
    switch_plugin(slurm, plugin)
    warm = [submit(slurm)[1] for _ in range(WARMUP)]
    if None in warm:
        raise SystemExit(f"{name}: a warm-up submission failed")
    seen = admin_comment(slurm, warm[-1] or "")
    if plugin != seen.startswith("AdminComment=allmende:"):
        raise SystemExit(f"{name}: the wrong job_submit.lua answered ({seen!r})")
    log(f"{name}: {jobs} sbatch from {workers} worker(s) ({seen.split(' ')[0][:40]} on warm-up)")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda _: submit(slurm), range(jobs)))
    wall = time.perf_counter() - t0
    ids = [job for _, job in results if job]
    counts = verdicts(slurm, ids) if plugin else {"untouched": len(ids)}
    cancel_all(slurm)
    latencies = [elapsed for elapsed, job in results if job]
    return Phase(name, plugin, workers, latencies, wall, jobs - len(ids), counts)


def report(phases: list[Phase]) -> None:
    print()
    print(f"{'phase':<34} {'jobs':>5} {'failed':>6} {'subm/s':>8} {'p50 ms':>8} {'p99 ms':>8}  verdicts")
    for p in phases:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(p.verdicts.items()))
        label = f"{p.name} ({p.workers} worker{'s' if p.workers > 1 else ''})"
        print(
            f"{label:<34} {len(p.latencies):>5} {p.failed:>6} {p.rate:>8.1f} "
            f"{p.pct(0.5):>8.1f} {p.pct(0.99):>8.1f}  {kinds}"
        )
    by = {(p.plugin, p.workers > 1): p for p in phases}
    par_with, par_without = by[(True, True)], by[(False, True)]
    seq_with, seq_without = by[(True, False)], by[(False, False)]
    ratio = par_with.rate / par_without.rate
    seq_ratio = seq_with.rate / seq_without.rate
    overhead = seq_with.pct(0.5) - seq_without.pct(0.5)
    par_overhead = par_with.pct(0.5) - par_without.pct(0.5)
    p99_overhead = seq_with.pct(0.99) - seq_without.pct(0.99)
    print()
    print(
        f"rate with / without plugin, parallel:   {ratio:6.1%}  (target >= 50 %: "
        f"{'met' if ratio >= 0.5 else 'NOT met'})"
    )
    print(f"rate with / without plugin, sequential: {seq_ratio:6.1%}")
    print(
        f"p50 overhead, sequential (with - without): {overhead:+.1f} ms  (target < 10 ms: "
        f"{'met' if overhead < 10 else 'NOT met'})"
    )
    print(f"p50 overhead, parallel:                    {par_overhead:+.1f} ms")
    print(f"p99 overhead, sequential:                  {p99_overhead:+.1f} ms")


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
        gpus = max(1024, -(-2 * (args.jobs + args.sequential + 2 * WARMUP) // 8) * 8)
        settings, url = stack.enter_context(platform(bootstrap, work, gpus))
        slurm.configure(
            api_url=url,
            kafka_bootstrap_servers=bootstrap,
            topic_prefix=settings.topic_prefix,
        )
        phases = [
            run_phase(slurm, "no plugin", False, args.jobs, args.workers),
            run_phase(slurm, "plugin", True, args.jobs, args.workers),
            run_phase(slurm, "plugin", True, args.sequential, 1),
            run_phase(slurm, "no plugin", False, args.sequential, 1),
        ]
    report(phases)
    print(f"\nwhole run (Slurm and platform start and stop included): {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
