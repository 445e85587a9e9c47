"""`allmende host ...` and `allmende preempt ...`: what on-call staff do instead of negotiating."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from allmende.cli.api_client import call, console
from allmende.core.settings import Settings

host_app = typer.Typer(
    help="Host health: an unhealthy host's jobs become preemption victims.", no_args_is_help=True
)


def _health(cluster: str, host: str, healthy: bool, reason: str) -> None:
    body = {"cluster": cluster, "host": host, "healthy": healthy, "reason": reason}
    event = call(Settings(), "POST", "/v1/hosts/health", json=body)
    console.print(f"{event['type']} recorded ({event['event_id']})")


@host_app.command("unhealthy")
def unhealthy(
    cluster: Annotated[str, typer.Argument(help="cluster name")],
    host: Annotated[str, typer.Argument(help="host name, as the scheduler reports it")],
    reason: Annotated[str, typer.Option(help="why, for the audit trail")] = "",
) -> None:
    """Report a host unhealthy: every job on it is a victim, whatever its class."""
    _health(cluster, host, False, reason)


@host_app.command("healthy")
def healthy(
    cluster: Annotated[str, typer.Argument(help="cluster name")],
    host: Annotated[str, typer.Argument(help="host name")],
) -> None:
    """Report a host healthy again."""
    _health(cluster, host, True, "")


def preempt(
    cluster: Annotated[str, typer.Argument(help="cluster name")],
    gpus: Annotated[int, typer.Option(min=0, help="GPUs to free (0: only the jobs on unhealthy hosts)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
) -> None:
    """Whom to stop, in order, and why: unhealthy hosts first, then opportunistic work."""
    body = call(Settings(), "POST", "/v1/preemption/plan", json={"cluster": cluster, "gpus": gpus})
    if as_json:
        console.print_json(data=body)
        return
    verdict = "enough" if body["enough"] else "NOT enough"
    table = Table(title=f"{cluster}: free {gpus} GPUs -> {body['gpus_freed']} freed ({verdict})")
    for column in ("#", "job", "project", "GPUs", "why"):
        table.add_column(column, justify="right" if column in ("#", "GPUs") else "left")
    for i, victim in enumerate(body["victims"], 1):
        table.add_row(str(i), victim["job_id"], victim["project"], str(victim["gpus"]), victim["reason"])
    console.print(table)
