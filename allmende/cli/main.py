"""The `allmende` command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from allmende.cli.admission import host_app, preempt
from allmende.cli.api_client import api_url as _api_url
from allmende.cli.api_client import call, local_admin_token, local_admin_token_file, token_for
from allmende.cli.budget import apply as budget_apply
from allmende.cli.budget import balance as budget_balance
from allmende.cli.budget import budget_app
from allmende.cli.collect import collect_app
from allmende.cli.dead_letters import dead_letters_app
from allmende.cli.fairshare import fairshare
from allmende.cli.kueue import kueue_app
from allmende.cli.login import login, logout
from allmende.cli.simulate import simulate
from allmende.cli.slurm import slurm_app
from allmende.core import supervisor
from allmende.core.paths import source_checkout
from allmende.core.settings import Settings

app = typer.Typer(
    help="Allmende: GPU-hour budgets and an exact ledger for shared GPU clusters.", no_args_is_help=True
)
kafka_app = typer.Typer(help="The local single-node Kafka broker (KRaft).", no_args_is_help=True)
app.add_typer(kafka_app, name="kafka")
app.add_typer(budget_app, name="budget")
app.add_typer(collect_app, name="collect")
app.add_typer(dead_letters_app, name="dead-letters")
app.command("fairshare")(fairshare)
app.add_typer(host_app, name="host")
app.add_typer(slurm_app, name="slurm")
app.add_typer(kueue_app, name="kueue")
app.command("preempt")(preempt)
app.command("simulate")(simulate)
app.command("login")(login)
app.command("logout")(logout)
console = Console()

# The demo's defaults come from a checkout (its examples/ and the shared traces beside it).
_CHECKOUT = source_checkout() or Path.cwd()
DEMO_TRACE = _CHECKOUT.parent / "shared" / "data" / "traces" / "elasticflow" / "raw-traces.tar.gz"
DEMO_PLAN = _CHECKOUT / "examples" / "plans" / "elasticflow-2021-q2.yaml"


def _settings() -> Settings:
    settings = Settings()
    from allmende.core.logs import configure_logging

    configure_logging(settings)
    return settings


def _broker(settings: Settings):  # type: ignore[no-untyped-def]
    from allmende.core.kafka_local import LocalBroker

    port = int(settings.kafka_bootstrap_servers.rsplit(":", 1)[1])
    return LocalBroker(settings.kafka_home, port=port, controller_port=port + 1)


@kafka_app.command("start")
def kafka_start(
    foreground: Annotated[
        bool,
        typer.Option(
            "--foreground",
            help="run the broker in this process, without a pid file, until it is stopped (for systemd:"
            " infra/systemd)",
        ),
    ] = False,
) -> None:
    """Start the local broker (fetching its jars with Maven the first time)."""
    broker = _broker(_settings())
    if foreground:
        broker.run_foreground()
    console.print(f"Kafka ready at [bold]{broker.start()}[/bold] (logs: {broker.home})")


@kafka_app.command("stop")
def kafka_stop() -> None:
    """Stop the local broker."""
    _broker(_settings()).stop()


@kafka_app.command("status")
def kafka_status() -> None:
    broker = _broker(_settings())
    pid = broker.running_pid()
    console.print(f"running, pid {pid}, {broker.bootstrap}" if pid else "not running")
    raise typer.Exit(0 if pid else 1)


@app.command()
def migrate() -> None:
    """Apply the ClickHouse migrations (idempotent)."""
    from allmende.core.clickhouse import Database

    s = _settings()
    done = Database(s.clickhouse_dsn, s.clickhouse_database).migrate()
    console.print(f"applied: {', '.join(done) or 'nothing (up to date)'}")


@app.command()
def worker() -> None:
    """Run a metering worker (faust); start several to share the partitions."""
    from allmende.streams.meter_worker import main

    main()


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (ALLMENDE_API_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (ALLMENDE_API_PORT)")] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(
            help="run only these roles beside HTTP (repeat): writer, fairshare, admission, alerts; "
            "reads: none, HTTP alone; default: as the settings say (all, one box)"
        ),
    ] = None,
) -> None:
    """Run the API process: HTTP, pages, and its roles (with embedded ClickHouse, the ledger writer)."""
    import uvicorn

    from allmende.topology import create_app, with_roles

    s = _settings()
    if role:
        try:
            s = with_roles(s, set(role))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--role") from None
    uvicorn.run(
        create_app(s), host=host or s.api_host, port=port or s.api_port, log_config=None, access_log=False
    )


@app.command()
def writer() -> None:
    """Run a standalone ledger writer (ClickHouse server mode; embedded mode runs it in `serve`)."""
    from allmende.topology import run_writer

    run_writer(_settings())


@app.command()
def replay(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="trace file")],
    format: Annotated[str, typer.Option("--format", "-f", help="elasticflow | philly | helios")],
    cluster: Annotated[
        str | None, typer.Option(help="one CSV of the ElasticFlow tarball, e.g. cluster10")
    ] = None,
    sample_every: Annotated[int, typer.Option(help="usage sample interval, seconds", min=1)] = 600,
    speed: Annotated[
        float | None, typer.Option(help="trace seconds per wall second (default: as fast as possible)")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="replay only the first N jobs", min=1)] = None,
    idle_share: Annotated[
        float,
        typer.Option(
            help="share of jobs replayed as idle placeholders (utilisation under 5 %)", min=0, max=1
        ),
    ] = 0.0,
    seed: Annotated[
        int, typer.Option(help="which jobs --idle-share picks (the same seed, the same jobs)")
    ] = 0,
) -> None:
    """Turn a real trace into job lifecycle events on Kafka."""
    from allmende.core.kafka_topics import ensure_topics
    from allmende.core.replay import make_producer, publish, timeline
    from allmende.core.trace_files import read_trace
    from allmende.domain.traces import TraceFormat, TraceStats, with_idle_placeholders

    try:
        fmt = TraceFormat(format)
    except ValueError:
        raise typer.BadParameter(f"unknown format {format!r}; one of elasticflow, philly, helios") from None
    s = _settings()
    ensure_topics(s)
    stats = TraceStats()
    jobs = list(
        with_idle_placeholders(
            read_trace(path, fmt, cluster=cluster, limit=limit, stats=stats), idle_share, seed
        )
    )
    if not jobs:
        raise typer.BadParameter(f"no jobs found in {path}" + (f" for cluster {cluster}" if cluster else ""))
    expected = sum(max(0, (j.duration_s - 1) // sample_every) + 3 for j in jobs)
    producer = make_producer(s.kafka_bootstrap_servers)
    t0 = time.monotonic()
    with Progress(
        TextColumn("[bold]replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("replay", total=expected)
        sent = publish(
            producer,
            s.job_events_topic,
            timeline(jobs, sample_every),
            speed,
            on_event=lambda _: bar.advance(task),
        )
    producer.close()
    seconds = time.monotonic() - t0
    gpu_seconds = sum(j.gpu_seconds for j in jobs)
    console.print(
        f"{len(jobs)} jobs, {sent} events in {seconds:.1f}s ({sent / max(seconds, 1e-9):,.0f}/s); "
        f"trace total {gpu_seconds:,} GPU-seconds ({gpu_seconds / 3600:,.1f} GPU-hours)"
        + (f"; skipped {stats.skipped_no_gpu} rows without GPUs" if stats.skipped_no_gpu else "")
        + (f"; {idle} idle placeholders" if (idle := sum(j.utilization < 1.0 for j in jobs)) else "")
    )


@app.command()
def usage(
    project: Annotated[str, typer.Argument(help="project name")],
    from_: Annotated[str | None, typer.Option("--from", help="first day, YYYY-MM-DD (UTC)")] = None,
    to: Annotated[str | None, typer.Option(help="last day, YYYY-MM-DD (UTC), inclusive")] = None,
    group_by: Annotated[str | None, typer.Option(help="user | cluster | gpu_type | priority_class")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
    plot: Annotated[Path | None, typer.Option(help="write a PNG chart of GPU-hours per day")] = None,
) -> None:
    """GPU-hours of a project per day and in total (asks the API: ALLMENDE_API_URL)."""
    s = Settings()
    params = {k: v for k, v in {"from": from_, "to": to, "group_by": group_by}.items() if v}
    body = call(s, "GET", f"/v1/projects/{project}/usage", params=params)
    if as_json:
        print(json.dumps(body, indent=2))
    else:
        table = Table(title=f"{project}: {body['first_day']} .. {body['last_day']} (UTC days)")
        table.add_column("day")
        if group_by:
            table.add_column(group_by)
        table.add_column("GPU-hours", justify="right")
        for d in body["days"]:
            table.add_row(d["day"], *([d["group"]] if group_by else []), f"{float(d['gpu_hours']):,.2f}")
        table.add_section()
        table.add_row("total", *([""] if group_by else []), f"{float(body['total_gpu_hours']):,.2f}")
        console.print(table)
    if plot is not None:
        from allmende.cli.plots import usage_chart

        usage_chart(body, plot)
        console.print(f"chart written to {plot}")


def _auth_headers(s: Settings) -> dict[str, str]:
    token = token_for(s)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _healthz(url: str, timeout: float = 3.0) -> tuple[int | None, Any]:
    """The API's /healthz: (HTTP status, body), or (None, the error) when it does not answer."""
    try:
        response = httpx.get(f"{url}/healthz", timeout=timeout)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _components(s: Settings) -> dict[str, tuple[str, Path]]:
    """What `allmende up` runs: name -> (what it is, its pid file)."""
    return {
        "broker": ("Kafka broker", _broker(s).pid_file),
        "worker": ("meter worker", supervisor.command_pid_file(s.run_dir, "worker")),
        "api": ("API (+ ledger writer)", supervisor.command_pid_file(s.run_dir, "api")),
    }


_NOT_RUNNING = {
    "dead": "is gone",
    "zombie": "is a zombie",
    "reused": "now belongs to another process",
    "unverified": "is recorded without its start time",
}


def _kept_or_started(name: str, before: supervisor.ProcessState, pid: int) -> str:
    """One line of `up`: kept as it was, started, or started again (and why)."""
    if before.running:
        return f"{name}: running (pid {pid}, up {_uptime(before.uptime_s)})"
    if before.state == "stopped":
        return f"{name}: started (pid {pid})"
    why = f"pid {before.pid} {_NOT_RUNNING[before.state]}"
    return f"{name}: [yellow]started again[/yellow] (pid {pid}; {why})"


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


@app.command()
def up(
    timeout: Annotated[
        float, typer.Option(help="seconds to wait for the broker, and for the API to be healthy")
    ] = 180,
) -> None:
    """Start the local platform in the background: Kafka, a metering worker, the API. Whatever runs
    is kept; whatever is not really running (no process, a zombie, a pid now another process's) is
    started again. Waits until the API's /healthz says ok, and says how long that took."""
    s = _settings()
    components = _components(s)
    before = {name: supervisor.inspect(pid_file) for name, (_, pid_file) in components.items()}
    broker = _broker(s)
    from allmende.core.kafka_local import BrokerError

    try:
        bootstrap = broker.start(timeout)
    except BrokerError as exc:
        console.print(f"[red]Kafka: {exc} (log: {broker.log_file})[/red]")
        raise typer.Exit(1) from None
    console.print(_kept_or_started(f"Kafka at {bootstrap}", before["broker"], broker.running_pid() or 0))
    from allmende.core.kafka_topics import ensure_topics

    ensure_topics(s)
    worker_pid = supervisor.start_command(s.run_dir, "worker", ["worker"])
    console.print(_kept_or_started("meter worker", before["worker"], worker_pid))
    # The local API gets an admin token of its own unless the environment names some.
    env = {} if s.admin_tokens else {"ALLMENDE_ADMIN_TOKENS": f"admin:{local_admin_token(s, create=True)}"}
    started = time.monotonic()
    api_pid = supervisor.start_command(s.run_dir, "api", ["serve"], env=env)
    console.print(_kept_or_started("API", before["api"], api_pid))
    url = _api_url(s)
    api_pid_file = components["api"][1]
    code: int | None = None
    body: Any = None
    while time.monotonic() - started < timeout:
        code, body = _healthz(url)
        if code == 200:
            break
        if supervisor.running(api_pid_file) is None:
            log = supervisor.command_log_file(s.run_dir, "api")
            console.print(f"[red]the API (pid {api_pid}) exited; the end of {log}:[/red]")
            console.print(log.read_text(errors="replace")[-3000:], markup=False, highlight=False)
            raise typer.Exit(1)
        time.sleep(0.25)
    took = time.monotonic() - started
    if code != 200:
        console.print(f"[red]the API at {url} is not healthy after {took:.0f} s: {code} {body}[/red]")
        raise typer.Exit(1)
    if before["api"].running:
        console.print(f"API healthy (already running, pid {api_pid}, up {_uptime(before['api'].uptime_s)})")
    else:
        console.print(f"API healthy in {took:.1f} s (pid {api_pid})")
    console.print(f"API: {url}  (docs: {url}/docs, logs: {s.run_dir})")
    down_now = [name for name, (_, pid_file) in components.items() if supervisor.running(pid_file) is None]
    if down_now:
        console.print(f"[red]exited meanwhile: {', '.join(down_now)} (logs: {s.run_dir})[/red]")
        raise typer.Exit(1)


@app.command()
def down() -> None:
    """Stop what `allmende up` started."""
    s = _settings()
    for name in ("api", "worker"):
        if supervisor.stop_command(s.run_dir, name):
            console.print(f"stopped {name}")
    _broker(s).stop()
    console.print("stopped kafka")


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Which of the processes `allmende up` starts run: pid, uptime, and the API's /healthz.
    Exits 1 if any is down or the API is not healthy."""
    s = Settings()
    report: dict[str, dict[str, Any]] = {}
    for name, (what, pid_file) in _components(s).items():
        found = supervisor.inspect(pid_file)
        report[name] = {
            "what": what,
            "running": found.running,
            "state": found.state,
            "pid": found.pid,
            "uptime_s": None if found.uptime_s is None else round(found.uptime_s, 1),
            "pid_file": str(pid_file),
        }
    report["broker"]["bootstrap"] = s.kafka_bootstrap_servers
    report["api"]["url"] = url = _api_url(s)
    code, body = _healthz(url)
    report["api"]["healthz"] = {"status_code": code, "body": body}
    report["api"]["healthy"] = code == 200
    ok = all(c["running"] for c in report.values()) and code == 200
    if as_json:
        print(json.dumps({"ok": ok, "components": report}, indent=2))
    else:
        table = Table(title=f"allmende: {s.state_dir}")
        for column in ("component", "state", "pid", "uptime", "where, health"):
            table.add_column(column)
        for name, c in report.items():
            state = "[green]running[/green]" if c["running"] else f"[red]{c['state']}[/red]"
            if name == "api":
                shown = body.get("status", body) if isinstance(body, dict) else body
                detail = f"{url}, /healthz: " + (f"{code} {shown}" if code is not None else "no answer")
            else:
                detail = c.get("bootstrap", "")
            uptime = _uptime(c["uptime_s"]) if c["running"] else "-"
            table.add_row(c["what"], state, str(c["pid"] or "-"), uptime, detail)
        console.print(table)
    raise typer.Exit(0 if ok else 1)


@app.command()
def demo(
    trace: Annotated[Path, typer.Option(help="ElasticFlow trace tarball")] = DEMO_TRACE,
    cluster: Annotated[str, typer.Option(help="which cluster CSV to replay")] = "cluster01",
    plan: Annotated[Path, typer.Option(help="the quarter plan to apply first")] = DEMO_PLAN,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the ledger")] = 600,
) -> None:
    """Start the platform, apply a quarter plan, replay a real trace, wait for the exact ledger."""
    from allmende.core.trace_files import read_trace
    from allmende.domain.traces import TraceFormat

    if not trace.exists():
        raise typer.BadParameter(f"trace {trace} not found (expected ../shared/data/traces)")
    if not plan.exists():
        raise typer.BadParameter(f"plan {plan} not found (give --plan)")
    up()
    console.rule("the quarter plan")
    budget_apply(plan)
    console.rule("the trace")
    # A few idle placeholders, so the dashboards have squatting to show.
    replay(trace, "elasticflow", cluster=cluster, sample_every=600, speed=None, limit=None, idle_share=0.05)
    s = Settings()
    project = f"ef-{cluster}"
    expected = sum(j.gpu_seconds for j in read_trace(trace, TraceFormat.ELASTICFLOW, cluster=cluster))
    deadline = time.monotonic() + timeout
    total = -1
    with console.status("waiting for the ledger to catch up"):
        while time.monotonic() < deadline:
            r = httpx.get(f"{_api_url(s)}/v1/projects/{project}/usage", headers=_auth_headers(s), timeout=30)
            total = r.json().get("total_gpu_seconds", -1) if r.status_code == 200 else -1
            if total == expected:
                break
            time.sleep(1)
    state = "[green]exact[/green]" if total == expected else "[red]incomplete[/red]"
    console.print(f"ledger total {total:,} GPU-seconds, trace {expected:,}: {state}")
    budget_balance(project, as_of=None, period=None, as_json=False, plot=None)
    for command in ("usage", "budget balance", "budget history"):
        console.print(f"Try: allmende {command} {project}")
    token = f"$(cat {local_admin_token_file(s)})"
    console.print(f'     curl -H "Authorization: Bearer {token}" {_api_url(s)}/v1/projects/{project}/balance')
    console.rule("the dashboards")
    console.print(
        f"Dashboards: {_api_url(s)}/ui/overview   (a project's page: {_api_url(s)}/ui/projects/{project})"
    )
    # The sign-in form takes the token once and keeps it in an HttpOnly cookie, never in a URL.
    console.print(f"Sign in with the local admin token: {token_for(s)}")
    console.print(f"API docs: {_api_url(s)}/docs   stop with: make down")


if __name__ == "__main__":
    app()
