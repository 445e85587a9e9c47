"""`allmende budget ...`: the quarterly workflow and the balances, through the API."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from allmende.cli.api_client import call, console
from allmende.core.settings import Settings

budget_app = typer.Typer(
    help="Budgets: plan and apply a quarter, read balances and the audit trail (ALLMENDE_TOKEN).",
    no_args_is_help=True,
)

PlanFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the plan file (YAML)")]
_ACTION_STYLE = {"declare": "cyan", "grant": "green", "change": "yellow", "adjust": "yellow", "revoke": "red"}


def _utc(instant: int) -> str:
    return dt.datetime.fromtimestamp(instant, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _changes_table(title: str, changes: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for column in ("action", "what", "detail"):
        table.add_column(column)
    for c in changes:
        style = _ACTION_STYLE.get(c["action"], "")
        table.add_row(f"[{style}]{c['action']}[/{style}]", c["target"], c["detail"])
    return table


@budget_app.command("plan")
def plan(path: PlanFile) -> None:
    """Show what applying the plan would change (grants, changes, revocations); changes nothing."""
    body = call(Settings(), "POST", "/v1/admin/plan/diff", json={"text": path.read_text()})
    if not body["changes"]:
        console.print("nothing to change: the state is what the plan describes")
        return
    console.print(
        _changes_table(f"{path.name}: {len(body['changes'])} changes (not applied)", body["changes"])
    )


@budget_app.command("apply")
def apply(path: PlanFile) -> None:
    """Apply the plan: emit the events that make the state what it describes. Twice is once."""
    body = call(Settings(), "POST", "/v1/admin/plan/apply", json={"text": path.read_text()})
    if not body["changes"]:
        console.print("nothing to change: the state is what the plan describes")
        return
    console.print(_changes_table(f"{path.name}: {len(body['changes'])} changes applied", body["changes"]))


@budget_app.command("history")
def history(
    project: Annotated[str, typer.Argument(help="project name")],
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
) -> None:
    """The audit trail of a project: who did what to it, when and why."""
    events = call(Settings(), "GET", f"/v1/projects/{project}/history")
    if as_json:
        console.print_json(data=events)
        return
    table = Table(title=f"{project}: {len(events)} events")
    for column in ("when (UTC)", "event", "by", "via", "what", "why"):
        table.add_column(column)
    for e in events:
        data = e["data"]
        what = ", ".join(
            f"{k}={v}" for k, v in data.items() if k not in ("project",) and v not in (None, [], {})
        )
        table.add_row(_utc(e["occurred_at"]), e["type"], e["actor"], e["source"], what[:80], e["reason"])
    console.print(table)


@budget_app.command("balance")
def balance(
    project: Annotated[str, typer.Argument(help="project name")],
    as_of: Annotated[str | None, typer.Option(help="an instant, e.g. 2027-02-01T00:00:00Z")] = None,
    period: Annotated[str | None, typer.Option(help="only this period, e.g. 2027-Q1")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
    plot: Annotated[Path | None, typer.Option(help="write a PNG chart: allocated vs charged")] = None,
) -> None:
    """Allocated, charged, held and remaining GPU-hours per allocation (weighted by the policy)."""
    params = {k: v for k, v in {"as_of": as_of, "period": period}.items() if v}
    body = call(Settings(), "GET", f"/v1/projects/{project}/balance", params=params)
    if as_json:
        console.print_json(data=body)
    else:
        table = Table(title=f"{project}: balance as of {_utc(body['as_of'])} UTC (weighted GPU-hours)")
        for column in ("allocation", "period", "scope", "allocated", "charged", "held", "remaining"):
            left = column in ("allocation", "period", "scope")
            table.add_column(column, justify="left" if left else "right")
        for line in body["allocations"]:
            hours = [float(line[f"{k}_gpu_hours"]) for k in ("allocated", "charged", "held", "remaining")]
            period_text = line["period"] + (" (expired)" if line["expired"] else "")
            cells = [f"{h:,.2f}" for h in hours]
            if hours[3] < 0:
                cells[3] = f"[red]{cells[3]}[/red]"
            table.add_row(line["allocation_id"], period_text, line["scope"], *cells)
        table.add_section()
        over = f"{float(body['over_budget_gpu_hours']):,.2f}"
        table.add_row("over budget", "", "no allocation paid for it", "", f"[red]{over}[/red]", "", "")
        console.print(table)
    if plot is not None:
        from allmende.cli.plots import balance_chart

        balance_chart(body, plot)
        console.print(f"chart written to {plot}")


@budget_app.command("expire")
def expire() -> None:
    """Expire the allocations whose period has ended now (the API also does this every minute)."""
    body = call(Settings(), "POST", "/v1/admin/expiry")
    for e in body["applied"]:
        console.print(f"expired {e['data']['allocation_id']}: {e['data']['unused_units']} units unused")
    if not body["applied"]:
        console.print("nothing has ended")
