"""Simulation reports as terminal tables, laid out with rich at a fixed width, so the text is the
same on every terminal. The rows are the domain's (`allmende.domain.simulation.render`)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from allmende.domain.simulation.render import compare_reports, report_rows
from allmende.domain.simulation.report import SimulationReport

TABLE_WIDTH = 120


def _render(table: Table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=TABLE_WIDTH, color_system=None, force_terminal=False).print(table)
    return buffer.getvalue()


def render_report(report: SimulationReport) -> str:
    table = Table(title=f"simulation {report.run_id}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report_rows(report):
        table.add_row(name, value)
    return _render(table)


def render_comparison(a: SimulationReport, b: SimulationReport, labels: tuple[str, str] | None = None) -> str:
    left, right = labels or (f"{a.policy} ({a.run_id})", f"{b.policy} ({b.run_id})")
    table = Table(title="simulations side by side")
    table.add_column("metric")
    table.add_column(left, justify="right")
    table.add_column(right, justify="right")
    for row in compare_reports(a, b):
        table.add_row(*row)
    return _render(table)
