"""`allmende simulate`: a quarter's plan on a real trace, under every policy, as tables and a page.

The trace's jobs get the field behaviours (seeded), the plan gives the clusters, each registered
policy (domain/simulation/policies.py) runs the same workload, and the reports come out as
terminal tables, a JSON file and a self-contained HTML page. With two plans every policy runs on
both and the reports are shown side by side. Nothing here reads the wall clock or the network:
the same inputs and seed give the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from allmende.cli.simulation_tables import render_comparison, render_report
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.plan_file import Plan, PlanInvalid, parse_plan
from allmende.domain.simulation.behaviours import Behaviours, workload
from allmende.domain.simulation.cluster import host_name
from allmende.domain.simulation.engine import Simulation
from allmende.domain.simulation.from_plan import clusters_from_plan
from allmende.domain.simulation.interfaces import Policy, SimEvent, Sink
from allmende.domain.simulation.model import HostFailure, SimJob, SimulationError
from allmende.domain.simulation.policies import POLICIES, PolicyArgs, class_prices, engine_config
from allmende.domain.simulation.report import SimulationReport, build_report
from allmende.domain.traces import TraceFormat, TraceJob, TraceStats
from allmende.schemas.events import JobFinished

HOUR_S = 3600
PROGRESS_EVERY_STEPS = 2048  # redraws cost more than steps: update the bar every so many events
_BAD_HOST = re.compile(
    r"^(?:(?P<cluster>[^/@]+)/)?(?P<host>[^/@]+)@(?P<at>\d+(?:\.\d+)?)(?:\+(?P<hours>\d+(?:\.\d+)?))?$"
)

progress_console = Console(stderr=True)


@dataclass(frozen=True)
class PlanInput:
    label: str  # the plan's id; the file's name when two plans share an id
    path: Path
    plan: Plan


@dataclass(frozen=True)
class Run:
    label: str
    plan: PlanInput
    policy: str
    report: SimulationReport


class _JobsDone:
    """Counts jobs that are done (finished or cancelled) for the progress bar; passes events on."""

    def __init__(self, inner: Sink | None = None) -> None:
        self.done = 0
        self.inner = inner

    def emit(self, event: SimEvent) -> None:
        if isinstance(event, JobFinished):
            self.done += 1
        if self.inner is not None:
            self.inner.emit(event)


def _platform(plan: Plan, args: PolicyArgs) -> Policy:
    """The platform: the admission service's own decisions (services/simulated_platform.py)."""
    from allmende.simulator.platform import PlatformPolicy

    return PlatformPolicy(plan, Settings())


# The platform runs the admission service (a service module): registered here, not in domain/.
POLICIES.setdefault("platform", _platform)


@dataclass(frozen=True)
class ThroughPipeline:
    """Runs go through Kafka, the meter worker and the ledger writer, each on topics and a
    database of its own under `work`."""

    base: Settings
    work: Path


# -- inputs --------------------------------------------------------------------------------------


def detect_format(path: Path) -> TraceFormat:
    """The trace's format from its name and header: ElasticFlow has its own columns; Philly and
    Helios share theirs, so the file's path must name one of them."""
    if path.name.endswith((".tar.gz", ".tgz")):
        return TraceFormat.ELASTICFLOW
    with path.open(encoding="utf-8") as fh:
        header = fh.readline().strip().lower()
    columns = set(header.split(","))
    if {"job_id", "submission_time", "duration", "num_gpu"} <= columns:
        return TraceFormat.ELASTICFLOW
    if {"u_id", "user", "gpu_num", "interval", "run_time"} <= columns:
        named = [f for f in (TraceFormat.PHILLY, TraceFormat.HELIOS) if f.value in str(path).lower()]
        if len(named) == 1:
            return named[0]
    raise typer.BadParameter(f"cannot tell the format of {path}; pass --format elasticflow|philly|helios")


def _read_plan(path: Path) -> Plan:
    try:
        plan = parse_plan(path.read_text(encoding="utf-8"))
    except (PlanInvalid, ValueError) as e:
        raise typer.BadParameter(f"{path}: {e}") from None
    if not plan.clusters:
        raise typer.BadParameter(f"{path}: the plan has no clusters to simulate")
    return plan


def _plan_inputs(paths: Sequence[Path]) -> list[PlanInput]:
    plans = [_read_plan(p) for p in paths]
    ids = [p.plan for p in plans]
    if len(set(ids)) == len(ids):
        labels = ids
    elif len({p.stem for p in paths}) == len(paths):
        labels = [p.stem for p in paths]
    else:
        labels = [f"plan {i + 1}" for i in range(len(paths))]
    return [PlanInput(label, path, plan) for label, path, plan in zip(labels, paths, plans, strict=True)]


def parse_cluster_map(entries: Sequence[str]) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for entry in entries:
        trace_cluster, sep, plan_cluster = entry.partition("=")
        if not sep or not trace_cluster.strip() or not plan_cluster.strip():
            raise typer.BadParameter(f"--cluster-map wants trace_cluster=plan_cluster, got {entry!r}")
        mapping[trace_cluster.strip()] = plan_cluster.strip()
    return mapping


def cluster_mapping(plan: Plan, trace_clusters: Sequence[str], explicit: dict[str, str]) -> dict[str, str]:
    """Every trace cluster onto a plan cluster: as `--cluster-map` says, else the plan cluster of
    the same name, else the plan's first cluster."""
    names = [c.name for c in plan.clusters]
    for target in explicit.values():
        if target not in names:
            raise typer.BadParameter(
                f"--cluster-map names {target!r}, which plan {plan.plan} lacks (it has {', '.join(names)})"
            )
    return {
        c: explicit.get(c, c if c in names else names[0]) for c in sorted(set(trace_clusters) | set(explicit))
    }


def parse_bad_hosts(entries: Sequence[str], plan: Plan, start_at: int) -> tuple[HostFailure, ...]:
    """`[cluster/]host@offset_hours[+hours]`: the host goes bad that many hours after the first
    submission, and recovers after `hours` (never without). The host is a name or a number (1 is
    the cluster's first host); the cluster defaults to the plan's first."""
    failures = []
    for entry in entries:
        m = _BAD_HOST.match(entry.strip())
        if m is None:
            raise typer.BadParameter(f"--bad-host wants CLUSTER/HOST@H+D (e.g. 3@12+6), got {entry!r}")
        cluster = m["cluster"] or plan.clusters[0].name
        host = host_name(cluster, int(m["host"]) - 1) if m["host"].isdigit() else m["host"]
        at = start_at + round(float(m["at"]) * HOUR_S)
        recover = None if m["hours"] is None else at + max(1, round(float(m["hours"]) * HOUR_S))
        failures.append(HostFailure(cluster, host, at, recover))
    return tuple(failures)


# -- running -------------------------------------------------------------------------------------


def _simulate(
    bar: Progress,
    label: str,
    plan: Plan,
    policy_name: str,
    jobs: list[SimJob],
    failures: tuple[HostFailure, ...],
    args: PolicyArgs,
    sample_every_s: int,
    through: ThroughPipeline | None,
) -> SimulationReport:
    from allmende.simulator.platform import Accounting, ObservingSink, PlanAdmin, PlatformPolicy

    try:
        policy = POLICIES[policy_name](plan, args)
        config = engine_config(policy_name, _run_id(label), sample_every_s)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    platform = policy if isinstance(policy, PlatformPolicy) else None
    # The run's charges: the platform meters as it decides; any other policy is metered beside.
    accounting = platform.accounting if platform is not None else Accounting(PlanAdmin(plan))
    task = bar.add_task(label, total=len(jobs))
    counter = _JobsDone()
    steps = [0]

    def simulation(sink: Sink) -> Simulation:
        counter.inner = sink
        return Simulation(clusters_from_plan(plan), jobs, policy, counter, config, failures)

    def on_step(_: Simulation) -> None:
        steps[0] += 1
        if steps[0] % PROGRESS_EVERY_STEPS == 0:
            bar.update(task, completed=counter.done)

    try:
        if through is None:
            sim = simulation(accounting if platform is None else ObservingSink(platform))
            while sim.step():
                on_step(sim)
            report = build_report(sim.result()).with_budgets(accounting.budgets())
        else:
            from allmende.simulator.pipeline import run_settings, simulate_through_pipeline

            work = through.work / _run_id(label)
            settings = run_settings(through.base, work, _run_id(label))
            build = simulation if platform else (lambda s: simulation(ObservingSink(accounting, s)))
            admin = PlanAdmin(plan).state
            try:
                run = simulate_through_pipeline(
                    settings, work, build, admin, platform=platform, on_step=on_step
                )
            except (SimulationError, typer.Exit):
                raise
            except Exception as e:  # the broker, the database, the meter worker: say which, no trace
                progress_console.print(
                    f"[red]{label}: the pipeline failed: {type(e).__name__}: {e}\n"
                    f"Kafka: {settings.kafka_bootstrap_servers}, ClickHouse: {settings.clickhouse_dsn} "
                    "(ALLMENDE_CLICKHOUSE_DSN, KAFKA_BOOTSTRAP_SERVERS); --in-memory runs without them."
                )
                raise typer.Exit(1) from None
            if not run.check.exact:
                progress_console.print(
                    f"[red]{label}: the ledger holds {run.check.ledger_gpu_seconds:,} GPU-seconds, the "
                    f"simulation ran {run.check.gpu_seconds:,} ({len(run.check.mismatched)} jobs differ)"
                )
                raise typer.Exit(2)
            progress_console.print(
                f"{label}: ledger exact: {run.check.gpu_seconds:,} GPU-seconds of {run.check.jobs:,} jobs, "
                f"{run.events:,} events on {settings.job_events_topic}"
            )
            report = build_report(run.result).with_budgets(accounting.budgets(charged=run.charges))
    except SimulationError as e:
        progress_console.print(f"[red]simulation {label} broke an invariant: {e}")
        raise typer.Exit(2) from None
    bar.update(task, completed=len(jobs))
    return report


def _through_pipeline(stack: contextlib.ExitStack) -> ThroughPipeline:
    """A work directory (the runs' chDB and meter state) and a broker, both gone at the end."""
    from allmende.core.kafka_local import broker_for_run
    from allmende.core.logs import configure_logging

    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="allmende-simulate-")))
    bootstrap = stack.enter_context(broker_for_run(work / "kafka", progress_console.print))
    # A ClickHouse server (or a chDB directory) named in ALLMENDE_CLICKHOUSE_DSN is used; else the
    # runs get a chDB of their own (embedded chDB has one owner: not the API's directory).
    dsn = os.environ.get("ALLMENDE_CLICKHOUSE_DSN") or f"chdb://{work / 'chdb'}"
    base = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=dsn, log_json=False, log_level="WARNING"
    )
    configure_logging(base)  # the writer's and migrations' info lines would bury the progress bars
    return ThroughPipeline(base, work)


def _run_id(label: str) -> str:
    """A run's id in event ids, topic and database names: letters, digits, `_` only."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower()[:60] or "run"


def payload(
    trace: dict[str, Any],
    behaviours: dict[str, Any],
    plans: Sequence[PlanInput],
    mappings: dict[str, dict[str, str]],
    runs: Sequence[Run],
) -> dict[str, Any]:
    """The document `--json` writes and the HTML page embeds: plain values in a fixed order."""
    return {
        "trace": trace,
        "behaviours": behaviours,
        "plans": [
            {
                "label": p.label,
                "plan": p.plan.plan,
                "file": p.path.name,
                "clusters": [
                    {"name": c.name, "gpus": c.gpus, "gpu_type": c.gpu_type}
                    for c in clusters_from_plan(p.plan)
                ],
                "cluster_map": mappings[p.label],
            }
            for p in plans
        ],
        "runs": [
            {"label": r.label, "plan": r.plan.label, "policy": r.policy, "report": r.report.to_dict()}
            for r in runs
        ],
    }


def terminal_tables(plans: Sequence[PlanInput], policies: Sequence[str], runs: Sequence[Run]) -> list[str]:
    """Two plans: each policy's reports side by side. One plan: the first policy beside each of
    the others, or one report on its own."""
    by_key = {(r.plan.label, r.policy): r for r in runs}
    if len(plans) == 2:
        a, b = plans
        return [
            render_comparison(
                by_key[(a.label, p)].report,
                by_key[(b.label, p)].report,
                (f"{p} · {a.label}", f"{p} · {b.label}"),
            )
            for p in policies
        ]
    only = plans[0]
    if len(policies) >= 2:  # the first policy (the baseline, by default) beside each of the others
        first = by_key[(only.label, policies[0])].report
        return [
            render_comparison(
                first,
                by_key[(only.label, other)].report,
                (f"{policies[0]} · {only.label}", f"{other} · {only.label}"),
            )
            for other in policies[1:]
        ]
    return [render_report(by_key[(only.label, p)].report) for p in policies]


def simulate(
    plan: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the quarter's plan (YAML)")],
    trace: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="a trace of ../shared/data/traces")
    ],
    plan2: Annotated[
        Path | None,
        typer.Argument(exists=True, dir_okay=False, help="a second plan: both side by side"),
    ] = None,
    format: Annotated[
        str | None,
        typer.Option("--format", "-f", help="elasticflow | philly | helios (default: from the file)"),
    ] = None,
    trace_cluster: Annotated[
        str | None, typer.Option(help="one CSV of the ElasticFlow tarball, e.g. cluster01")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N jobs of the trace", min=1)] = None,
    cluster_map: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TRACE=PLAN",
            help="trace_cluster=plan_cluster (repeatable); a trace cluster not named goes to the plan "
            "cluster of the same name, else to the plan's first cluster",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the behaviours (the same seed, the same report)")] = 0,
    placeholder_users: Annotated[
        float, typer.Option(help="share of users who park idle placeholder jobs", min=0, max=1)
    ] = 0.1,
    inflating_users: Annotated[
        float, typer.Option(help="share of users who submit every job at the top class", min=0, max=1)
    ] = 0.3,
    price_tolerance: Annotated[
        float,
        typer.Option(
            help="those users keep the top class while it costs at most N times their own class "
            "(each user's N drawn between 1 and this; only where classes are priced: the platform)",
            min=1,
        ),
    ] = 3.0,
    interactive_share: Annotated[
        float, typer.Option(help="share of small, short jobs that are interactive sessions", min=0, max=1)
    ] = 0.1,
    bad_host: Annotated[
        list[str] | None,
        typer.Option(
            metavar="CLUSTER/HOST@H+D",
            help="repeatable: the host (a name, or 1 for the first) goes bad H hours "
            "after the first submission and recovers D hours later; CLUSTER/ (default: the plan's first) "
            "and +D (default: never) may be left out, e.g. 3@12+6",
        ),
    ] = None,
    on_call_hours: Annotated[
        float,
        typer.Option(help="baseline: hours until the on-call requeues a job stuck on a bad host", min=0),
    ] = 4.0,
    protected_percent: Annotated[
        int,
        typer.Option(
            help="baseline: share of every cluster's GPUs protected per project, split by plan shares",
            min=0,
            max=100,
        ),
    ] = 50,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME", help=f"policy to run (repeatable): {' | '.join(POLICIES)} (default: all)"
        ),
    ] = None,
    pipeline: Annotated[
        bool,
        typer.Option(
            "--pipeline/--in-memory",
            help="send every run's events through Kafka, the meter and the ledger (topics and a database "
            "of the run's own; KAFKA_BOOTSTRAP_SERVERS or a local broker) and check the ledger against "
            "the simulation; --in-memory: the same metering logic in this process only",
        ),
    ] = True,
    sample_every: Annotated[
        int, typer.Option(help="usage samples of running jobs every N simulated seconds", min=60)
    ] = 3600,
    report: Annotated[Path | None, typer.Option("--report", help="write a self-contained HTML page")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the reports as JSON")] = None,
) -> None:
    """What-if: simulate a plan (or two, side by side) on a real trace under every policy."""
    policies = list(dict.fromkeys(policy or POLICIES))
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {', '.join(unknown)}; one of {', '.join(POLICIES)}")
    if format is None:
        fmt = detect_format(trace)
    else:
        try:
            fmt = TraceFormat(format)
        except ValueError:
            raise typer.BadParameter(
                f"unknown format {format!r}; one of elasticflow, philly, helios"
            ) from None
    plans = _plan_inputs([plan] if plan2 is None else [plan, plan2])
    explicit = parse_cluster_map(cluster_map or [])

    stats = TraceStats()
    trace_jobs: list[TraceJob] = list(read_trace(trace, fmt, cluster=trace_cluster, limit=limit, stats=stats))
    if not trace_jobs:
        raise typer.BadParameter(
            f"no jobs in {trace}" + (f" for cluster {trace_cluster}" if trace_cluster else "")
        )
    start_at = min(j.submit_at for j in trace_jobs)
    behaviours = Behaviours(
        seed=seed,
        placeholder_user_share=placeholder_users,
        inflating_user_share=inflating_users,
        max_price_tolerance=price_tolerance,
        interactive_share=interactive_share,
    )
    args = PolicyArgs(
        seed=seed,
        on_call_hours=on_call_hours,
        protected_percent=protected_percent,
        projects=tuple(sorted({j.project for j in trace_jobs})),
    )
    trace_clusters = sorted({j.cluster for j in trace_jobs})

    runs: list[Run] = []
    mappings: dict[str, dict[str, str]] = {}
    failures_by_plan: dict[str, tuple[HostFailure, ...]] = {}
    placeholders = 0
    with (
        contextlib.ExitStack() as stack,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs"),
            TimeElapsedColumn(),
            console=progress_console,
        ) as bar,
    ):
        through = _through_pipeline(stack) if pipeline else None
        for p in plans:
            mapping = cluster_mapping(p.plan, trace_clusters, explicit)
            mappings[p.label] = mapping
            failures = parse_bad_hosts(bad_host or [], p.plan, start_at)
            failures_by_plan[p.label] = failures
            for name in policies:
                # Users pick their classes knowing what the policy charges for them.
                prices = class_prices(name, p.plan)
                jobs = workload(trace_jobs, behaviours, cluster_for=mapping, prices=prices)
                placeholders = sum(j.placeholder for j in jobs)
                label = f"{p.label}:{name}"
                rep = _simulate(bar, label, p.plan, name, jobs, failures, args, sample_every, through)
                runs.append(Run(label, p, name, rep))

    trace_info: dict[str, Any] = {
        "file": trace.name,
        "format": fmt.value,
        "trace_cluster": trace_cluster,
        "limit": limit,
        "jobs": len(trace_jobs),
        "skipped_rows": stats.skipped_no_gpu,
    }
    behaviour_info: dict[str, Any] = {
        "seed": seed,
        "placeholder_users": placeholder_users,
        "inflating_users": inflating_users,
        "price_tolerance": price_tolerance,
        "interactive_share": interactive_share,
        "placeholder_jobs": placeholders,
        "on_call_hours": on_call_hours,
        "protected_percent": protected_percent,
        "bad_hosts": {
            label: [
                {"cluster": f.cluster, "host": f.host, "at": f.at, "recover_at": f.recover_at}
                for f in failures
            ]
            for label, failures in failures_by_plan.items()
        },
    }
    document = payload(trace_info, behaviour_info, plans, mappings, runs)

    for p in plans:
        moves = ", ".join(f"{src} -> {dst}" for src, dst in mappings[p.label].items())
        typer.echo(f"plan {p.label}: clusters {moves}")
    typer.echo(
        f"{trace.name} ({fmt.value}): {len(trace_jobs):,} jobs and {placeholders:,} placeholders, "
        f"seed {seed}, policies {', '.join(policies)}"
    )
    for table in terminal_tables(plans, policies, runs):
        typer.echo(table, nl=False)

    if json_out is not None:
        json_out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        progress_console.print(f"JSON written to {json_out}")
    if report is not None:
        from allmende.cli.simulate_html import write_report

        write_report(report, document, [(r.label, r.report) for r in runs])
        progress_console.print(f"report written to {report}")
