"""`allmende kueue ...`: the Kueue AdmissionCheck controller (integrations/kueue)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from allmende.cli.api_client import console

kueue_app = typer.Typer(
    help="Kubernetes clusters scheduled by Kueue: the AdmissionCheck controller that asks the platform.",
    no_args_is_help=True,
)


@kueue_app.command("controller")
def controller(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="the controller's YAML (default: $ALLMENDE_KUEUE_CONFIG; every key "
                     "also from ALLMENDE_KUEUE_<KEY>; docs/kubernetes.md)"),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="one pass over every workload, then exit")] = False,
) -> None:  # fmt: skip
    """Serve Allmende's AdmissionCheck: mark it active, answer each workload's pending check from the
    admission API (Ready, Retry, Rejected), evict the victims the API names, and meter each Job's
    runs (job events through a durable spool to Kafka). Runs until stopped."""
    from allmende.core.logs import configure_logging
    from allmende.core.metrics import serve_metrics
    from allmende.core.settings import Settings
    from allmende.integrations.kueue.config import ConfigError, load_config
    from allmende.integrations.kueue.controller import controller as build

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    settings = Settings()
    configure_logging(settings)
    running = build(cfg)
    if not once:
        serve_metrics(settings, "kueue", cfg.metrics_port)
        signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run(once=once)
    except KeyboardInterrupt:
        running.stop()
