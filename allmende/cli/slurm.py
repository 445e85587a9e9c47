"""`allmende slurm ...`: the Slurm integration's spool, configuration and agent (integrations/slurm)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer

from allmende.cli.api_client import console

if TYPE_CHECKING:
    from types import ModuleType

slurm_app = typer.Typer(
    help="The Slurm integration: flush its event spool, check its configuration, run the agent.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="allmende.json (default: $ALLMENDE_SLURM_CONFIG, next to $SLURM_CONF, "
                 "/etc/slurm/allmende.json)"),
]  # fmt: skip


def _integration(module: str) -> ModuleType:
    """Imported when a command needs it: `allmende --help` stays fast."""
    import importlib

    return importlib.import_module(f"allmende.integrations.slurm.{module}")


def _spool_module() -> ModuleType:
    """The durable event spool (shared with the Kueue controller)."""
    import importlib

    return importlib.import_module("allmende.integrations.spool")


def _config(path: Path | None) -> Any:
    config = _integration("config")
    try:
        return config.load_config(path)
    except config.ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


@slurm_app.command("flush")
def flush(config: ConfigOption = None) -> None:
    """Send the job events the hooks spooled while Kafka was away (exit 1 if some are left)."""
    cfg = _config(config)
    spool = _spool_module().Spool(cfg.spool_dir)
    sent, left = spool.flush(cfg.bootstrap, cfg.send_timeout_s)
    console.print(f"sent {sent}, left in spool {left} ({cfg.spool_dir})")
    if left:
        raise typer.Exit(1)


@slurm_app.command("check")
def check(config: ConfigOption = None) -> None:
    """Show the configuration in use, ask the API's health and count the spooled events."""
    cfg = _config(config)
    console.print(f"config        {cfg.path}")
    token = "set" if cfg.token else "[red]missing[/red]"
    console.print(
        f"api           {cfg.api_url} (timeout {cfg.timeout_s} s, fail_open={cfg.fail_open}, "
        f"dry_run={cfg.dry_run}, token {token})"
    )
    instances = ", ".join(cfg.api_urls) if cfg.api_urls else cfg.api_url
    submit = "set" if cfg.submit_token else "[red]missing: cli_filter cannot ask[/red]"
    console.print(f"cli_filter    asks {instances} (submit token {submit})")
    key = cfg.ticket_key_file
    try:
        readable = key is not None and bool(key.read_text().strip())
    except OSError:
        readable = False
    console.print(
        f"job_submit    ticket key {key or '[red]missing[/red]'}"
        + ("" if readable else " [red](unreadable or empty: every GPU job is held for the agent)[/red]")
    )
    console.print(f"kafka         {cfg.bootstrap} -> {cfg.job_events_topic()}")
    pending = _spool_module().Spool(cfg.spool_dir).pending()
    console.print(f"spool         {cfg.spool_dir}: {len(pending)} event(s) waiting")
    try:
        health = httpx.get(f"{cfg.api_url.rstrip('/')}/healthz", timeout=cfg.timeout_s)
        console.print(f"api health    HTTP {health.status_code}")
    except httpx.HTTPError as exc:
        console.print(f"api health    [red]unreachable: {exc!r}[/red]")
        raise typer.Exit(1) from None


@slurm_app.command("agent")
def agent(
    config: ConfigOption = None,
    interval: Annotated[
        float | None,
        typer.Option("--interval", min=0.1, help="seconds between passes (default: agent_interval_s)"),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="one pass, then exit")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only log what it would do")] = False,
) -> None:
    """Make Slurm follow the platform: drained/down nodes as host reports (their jobs requeued),
    the API's preemption plans carried out, queued jobs asked about again in fair-share order
    (released, cancelled or left held), pending jobs' Nice from fair share. Runs until stopped."""
    code = _integration("agent").run_agent(config, interval, once, dry_run)
    if code:
        raise typer.Exit(code)


@slurm_app.command("demo")
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="leave the platform and Slurm running")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="stop what a run with --keep left running")] = False,
) -> None:
    """`make slurm-demo`: Slurm on localhost with the plugin, hooks and agent, the platform with this
    quarter's plan, a mixed workload, and what happened to each job (integrations/slurm/demo.py)."""
    code = _integration("demo").main([*(["--keep"] if keep else []), *(["--stop"] if stop else [])])
    if code:
        raise typer.Exit(code)
