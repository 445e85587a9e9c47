"""`allmende fairshare`: the fair-share tree, printed the way `sshare -l` prints it."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer
from rich.table import Table

from allmende.cli.api_client import call, console
from allmende.core.settings import Settings


def _number(value: Any, digits: int = 6) -> str:
    """A figure as sshare prints it; blank when null (not shown to this token: docs/security.md)."""
    if value is None:
        return ""
    if value == "inf":
        return "inf"
    return f"{float(value):,.0f}" if digits == 0 else f"{float(value):.{digits}f}"


def fairshare(
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
    leaves: Annotated[
        bool, typer.Option(help="only projects, by factor (the order jobs are favoured in)")
    ] = False,
) -> None:
    """The fair-share tree: shares, decayed usage, effective usage, level fair share and factor."""
    body = call(Settings(), "GET", "/v1/fairshare")
    if as_json:
        console.print_json(data=body)
        return
    nodes = body["nodes"]
    if leaves:
        nodes = sorted((n for n in nodes if n["is_leaf"]), key=lambda n: (-(n["factor"] or 0), n["node_id"]))
    as_of = dt.datetime.fromtimestamp(body["as_of"], dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    table = Table(
        title=f"fair share ({body['algorithm']}, half-life {body['half_life_s'] / 86400:g} d), as of {as_of}"
    )
    for column in (
        "Account",
        "RawShares",
        "NormShares",
        "RawUsage",
        "NormUsage",
        "EffectvUsage",
        "LevelFS",
        "FairShare",
    ):
        table.add_column(column, justify="left" if column == "Account" else "right")
    for n in nodes:
        indent = "" if leaves else " " * max(0, n["depth"] - 1)
        table.add_row(
            indent + n["node_id"], str(n["raw_shares"]), _number(n["norm_shares"]),
            _number(n["raw_usage"], 0), _number(n["norm_usage"]), _number(n["effective_usage"]),
            _number(n["level_fs"]), _number(n["factor"]),
        )  # fmt: skip
    console.print(table)
    if not body["caught_up"]:
        console.print("[yellow]the calculator is still reading the ledger stream: figures will move[/yellow]")
