"""What a simulated run costs beside a plain replay of its events, through the same pipeline.

The Philly cut (15,000 jobs, `../shared/data/traces/philly/philly_jobs_15000.csv`) with the field
behaviours, under the platform policy (examples/plans/philly-2017.yaml), through Kafka, the meter
worker and the ledger writer on topics and a chDB database of its own, until the ledger holds
every GPU-second the simulation ran. Then, in the same run, the very same events are sent as they
are (no engine, no decisions) through a fresh pipeline of the same kind, until the ledger is
exact again. The ratio of the two wall times is what simulating adds to moving the events.

    .venv/bin/python bench/simulate.py [--limit 15000] [--sample-every 3600] [--seed 0]

Uses KAFKA_BOOTSTRAP_SERVERS if set, else starts a local broker in a temporary directory. Prints
how much of the machine's CPU other processes took meanwhile (this VM is shared).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from allmende.core.kafka_local import broker_for_run
from allmende.core.logs import configure_logging
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.plan_file import parse_plan
from allmende.domain.simulation.behaviours import Behaviours, workload
from allmende.domain.simulation.engine import Simulation
from allmende.domain.simulation.from_plan import clusters_from_plan
from allmende.domain.simulation.interfaces import SimEvent, Sink
from allmende.domain.simulation.policies import class_prices, engine_config
from allmende.domain.traces import TraceFormat
from allmende.schemas.events import JobFinished
from allmende.simulator.pipeline import (
    replay_through_pipeline,
    run_settings,
    simulate_through_pipeline,
)
from allmende.simulator.platform import PlanAdmin, PlatformPolicy

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly" / "philly_jobs_15000.csv"
PLAN = ROOT / "examples" / "plans" / "philly-2017.yaml"


class Recording:
    """Keeps every event (for the replay) and counts jobs done (for the progress bar)."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.events: list[SimEvent] = []
        self.done = 0

    def emit(self, event: SimEvent) -> None:
        self.events.append(event)
        self.done += isinstance(event, JobFinished)
        self.inner.emit(event)


def busy_jiffies() -> int:
    """CPU time the whole machine spent busy since boot (all cores), in clock ticks."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


def own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the meter workers, once they exited
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=15_000, help="jobs of the Philly cut")
    parser.add_argument("--sample-every", type=int, default=3600, help="usage samples, simulated seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    plan = parse_plan(PLAN.read_text())
    admin = PlanAdmin(plan).state
    trace = list(read_trace(TRACE, TraceFormat.PHILLY, limit=args.limit))
    jobs = workload(trace, Behaviours(seed=args.seed), prices=class_prices("platform", plan))
    work = Path(tempfile.mkdtemp(prefix="bench-simulate-"))
    ticks = 100  # os.sysconf("SC_CLK_TCK") on Linux
    with broker_for_run(work / "kafka") as bootstrap:
        base = Settings(
            kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", log_json=False,
            log_level="WARNING",
        )  # fmt: skip
        configure_logging(base)
        busy0, own0, wall0 = busy_jiffies(), own_cpu_s(), time.perf_counter()

        policy = PlatformPolicy(plan, base)
        recording: Recording | None = None

        def simulation(sink: Sink) -> Simulation:
            nonlocal recording
            recording = Recording(sink)
            config = engine_config("platform", "bench", args.sample_every)
            return Simulation(clusters_from_plan(plan), jobs, policy, recording, config)

        with Progress(TextColumn("[bold]simulation"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs"),
                      TimeElapsedColumn()) as bar:  # fmt: skip
            task = bar.add_task("simulation", total=len(jobs))
            steps = [0]

            def on_step(_: Simulation) -> None:
                steps[0] += 1
                if steps[0] % 4096 == 0 and recording is not None:
                    bar.update(task, completed=recording.done)

            run = simulate_through_pipeline(
                run_settings(base, work / "sim", "bench_sim"), work / "sim", simulation, admin,
                platform=policy, on_step=on_step,
            )  # fmt: skip
            bar.update(task, completed=len(jobs))
        assert recording is not None
        expected = {r.job.job_id: sum(x.gpu_seconds for x in r.runs) for r in run.result.jobs}
        print(f"replaying the same {len(recording.events):,} events through a fresh pipeline ...")
        check, replay_s = replay_through_pipeline(
            run_settings(base, work / "replay", "bench_replay"),
            work / "replay",
            recording.events,
            admin,
            expected,
        )
        wall = time.perf_counter() - wall0
        busy = (busy_jiffies() - busy0) / ticks
        own = own_cpu_s() - own0

    gpu_hours = run.check.gpu_seconds / 3600
    ratio = run.exact_s / replay_s
    others = max(0.0, busy - own)
    lines = [
        f"trace: Philly cut, {len(jobs):,} jobs (with placeholders), plan {plan.plan}, seed {args.seed}",
        f"events: {run.events:,} lifecycle events; {len(policy.recorded):,} admission events",
        f"simulation: engine and decisions {run.simulated_s:.1f} s "
        f"({len(jobs) / run.simulated_s:,.0f} simulated jobs/s); ledger exact after {run.exact_s:.1f} s",
        f"plain replay of the same events: ledger exact after {replay_s:.1f} s",
        f"ledger exact: simulation {run.check.exact}, replay {check.exact}; {gpu_hours:,.1f} GPU-hours",
        f"ratio simulation / plain replay (to an exact ledger): {ratio:.2f}x (target: at most 1.5x)",
        f"machine: {busy:,.0f} CPU-s busy in {wall:,.0f} s (all cores); this bench and its workers "
        f"{own:,.0f} CPU-s, other processes {others:,.0f} CPU-s",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
