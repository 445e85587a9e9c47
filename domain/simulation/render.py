"""Reports as rows of text: one run, or two side by side (pure, easy to test).

The terminal tables that lay them out are the CLI's (`allmende.cli.simulation_tables`).
"""

from __future__ import annotations

from allmende.domain.simulation.report import DelayStats, SimulationReport

MISSING = "-"


def gpu_hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / 3600:,.1f}"


def percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def delays(stats: DelayStats | None) -> str:
    if stats is None or stats.jobs == 0:
        return MISSING
    return f"{stats.p50_s:,} / {stats.p90_s:,} / {stats.p99_s:,} ({stats.jobs:,} jobs)"


def report_rows(report: SimulationReport) -> list[tuple[str, str]]:
    """(metric, value) in a fixed order; per-project rows last, by project."""
    rows = [
        ("policy", report.policy),
        ("jobs", f"{report.jobs:,}"),
        *((f"jobs {outcome}", f"{count:,}") for outcome, count in sorted(report.outcomes.items())),
        ("GPU utilisation, busy", percent(report.busy_utilization)),
        ("GPU utilisation, useful", percent(report.useful_utilization)),
        ("GPU-hours run", gpu_hours(report.busy_gpu_seconds)),
        ("GPU-hours capacity", gpu_hours(report.capacity_gpu_seconds)),
        ("GPU-hours lost to preemption", gpu_hours(report.lost_to_preemption_gpu_seconds)),
        ("preemptions", f"{report.preemptions:,}"),
        ("GPU-hours held by placeholders", gpu_hours(report.placeholder_held_gpu_seconds)),
        ("idle GPU-hours held by placeholders", gpu_hours(report.placeholder_idle_gpu_seconds)),
        ("jobs at the top priority class", percent(report.top_class_share)),
        ("runs stuck on a bad host", f"{len(report.stuck_runs):,}"),
        ("stuck on a bad host, longest (s)", f"{report.stuck_seconds_max:,}"),
        ("GPU-hours stuck on a bad host", gpu_hours(report.stuck_gpu_seconds)),
        ("queue delay p50/p90/p99 (s), all", delays(report.queue_delay)),
        ("queue delay p50/p90/p99 (s), interactive", delays(report.queue_delay_interactive)),
    ]
    rows += [
        (f"queue delay p50/p90/p99 (s), {p}", delays(s))
        for p, s in sorted(report.queue_delay_by_project.items())
    ]
    if report.budgets is not None:
        for project, budget in sorted(report.budgets.items()):
            ratio = budget.ratio
            rows.append(
                (f"budget charged / allocated, {project}", MISSING if ratio is None else percent(ratio))
            )
    rows += [(name, f"{value:,}") for name, value in sorted(report.extra.items())]
    return rows


def compare_reports(a: SimulationReport, b: SimulationReport) -> list[tuple[str, str, str]]:
    """(metric, value in a, value in b): the rows of both, in a's order, then b's own rows."""
    left, right = dict(report_rows(a)), dict(report_rows(b))
    names = [name for name, _ in report_rows(a)]
    names += [name for name, _ in report_rows(b) if name not in left]
    return [(name, left.get(name, MISSING), right.get(name, MISSING)) for name in names]
