"""Reports: nearest-rank percentiles, deterministic dicts, tables, and two runs side by side."""

from __future__ import annotations

import json

import pytest

from allmende.cli.simulation_tables import render_comparison, render_report
from allmende.domain.simulation.model import (
    ClusterSize,
    JobOutcome,
    JobRecord,
    RunEnd,
    RunRecord,
    SimJob,
    SimulationResult,
)
from allmende.domain.simulation.render import compare_reports, report_rows
from allmende.domain.simulation.report import DelayStats, ProjectBudget, build_report, nearest_rank
from allmende.schemas.events import PriorityClass

T0 = 1_700_000_000


@pytest.mark.parametrize(
    ("case", "values", "percent", "expected"),
    [
        ("no values have no percentile", [], 50, None),
        ("one value is every percentile", [7], 99, 7),
        ("the median of four is the second", [1, 2, 3, 4], 50, 2),
        ("p90 of ten is the ninth", list(range(1, 11)), 90, 9),
        ("p99 of a hundred is the 99th", list(range(1, 101)), 99, 99),
        ("p99 of ten is the largest", list(range(1, 11)), 99, 10),
        ("p50 of three is the second", [0, 0, 90], 50, 0),
    ],
)
def test_nearest_rank_percentiles(case: str, values: list[int], percent: int, expected: int | None) -> None:
    assert nearest_rank(values, percent) == expected, case


def record(
    job_id: str, project: str, runs: list[tuple[int, int, RunEnd, int]], outcome: JobOutcome,
    *, gpus: int = 2, placeholder: bool = False, interactive: bool = False,
    cls: PriorityClass = PriorityClass.STANDARD, stalled_at: int | None = None, utilization: float = 1.0,
) -> JobRecord:  # fmt: skip
    job = SimJob(
        job_id=job_id, project=project, user="u", cluster="c1", gpu_type="H100", gpus=gpus, submit_at=T0,
        duration_s=1000, priority_class=cls, interactive=interactive, placeholder=placeholder,
        utilization=utilization,
    )  # fmt: skip
    return JobRecord(
        job,
        outcome,
        tuple(
            RunRecord(
                n + 1, T0 + s, T0 + e, gpus, ("c1-n001",), how, progress, stalled_at if n == 0 else None
            )
            for n, (s, e, how, progress) in enumerate(runs)
        ),
    )


def result(*jobs: JobRecord, run_id: str = "r", policy: str = "baseline") -> SimulationResult:
    return SimulationResult(
        run_id=run_id, policy=policy, start_at=T0, end_at=T0 + 1000, clusters=(ClusterSize("c1", 8),),
        jobs=tuple(jobs), decisions=len(jobs), events_processed=0,
    )  # fmt: skip


def sample_result() -> SimulationResult:
    pre, fin, cut = RunEnd.PREEMPTED, RunEnd.FINISHED, RunEnd.CUT
    top = PriorityClass.NON_PREEMPTIBLE
    return result(
        record("a", "alpha", [(0, 100, pre, 0), (200, 700, fin, 500)], JobOutcome.FINISHED),
        record(
            "idle",
            "alpha",
            [(0, 1000, cut, 1000)],
            JobOutcome.RUNNING,
            placeholder=True,
            utilization=0.01,
            cls=top,
        ),
        record("stuck", "beta", [(100, 900, pre, 0)], JobOutcome.QUEUED, stalled_at=T0 + 300, cls=top),
        record("i", "beta", [(400, 500, fin, 100)], JobOutcome.FINISHED, interactive=True, gpus=1),
        record("never", "beta", [], JobOutcome.QUEUED),
        record("no", "gamma", [], JobOutcome.CANCELLED),
    )


def test_a_report_adds_up_the_records_exactly() -> None:
    report = build_report(sample_result())
    assert report.capacity_gpu_seconds == 8 * 1000
    assert report.busy_gpu_seconds == 2 * 100 + 2 * 500 + 2 * 1000 + 2 * 800 + 100
    assert report.placeholder_held_gpu_seconds == 2000
    assert report.placeholder_idle_gpu_seconds == 1980
    assert report.stuck_gpu_seconds == 2 * 600
    assert report.useful_gpu_seconds == report.busy_gpu_seconds - 1980 - 1200
    assert report.lost_to_preemption_gpu_seconds == 2 * 100 + 2 * 800
    assert report.preemptions == 2
    assert (report.jobs, report.top_class_jobs) == (6, 2)
    assert report.outcomes == {"finished": 2, "cancelled": 1, "queued": 2, "running": 1}
    # Delays: a 0, idle 0, stuck 100, i 400, never 1000 (waited to the end); the cancelled job none.
    assert report.queue_delay == DelayStats(5, 100, 1000, 1000, 1000)
    assert report.queue_delay_by_project["beta"] == DelayStats(3, 400, 1000, 1000, 1000)
    assert "gamma" not in report.queue_delay_by_project
    assert report.queue_delay_interactive == DelayStats(1, 400, 400, 400, 400)
    assert [(r.job_id, r.stuck_s) for r in report.stuck_runs] == [("stuck", 600)]


def test_to_dict_gives_the_same_json_bytes_for_the_same_records() -> None:
    first = json.dumps(build_report(sample_result()).to_dict()).encode()
    again = json.dumps(build_report(sample_result()).to_dict()).encode()
    assert first == again
    data = json.loads(first)
    assert data["busy_gpu_seconds"] == 4900
    assert data["budgets"] is None
    assert list(data["queue_delay_by_project"]) == ["alpha", "beta"]


def test_budgets_from_the_ledger_join_the_report() -> None:
    report = build_report(sample_result()).with_budgets(
        {"beta": ProjectBudget(charged_units=150, allocated_units=100), "alpha": ProjectBudget(50, 0)}
    )
    assert report.to_dict()["budgets"] == {
        "alpha": {"charged_units": 50, "allocated_units": 0, "ratio": None},
        "beta": {"charged_units": 150, "allocated_units": 100, "ratio": 1.5},
    }
    rows = dict(report_rows(report))
    assert rows["budget charged / allocated, beta"] == "150.0 %"
    assert rows["budget charged / allocated, alpha"] == "-"


def test_the_table_shows_every_row() -> None:
    report = build_report(sample_result())
    text = render_report(report)
    for name, value in report_rows(report):
        assert name in text and value in text
    assert render_report(report) == text


def test_two_reports_side_by_side_line_up_metrics_and_mark_what_one_lacks() -> None:
    a = build_report(sample_result())
    b = build_report(
        result(
            record("x", "delta", [(0, 10, RunEnd.FINISHED, 10)], JobOutcome.FINISHED),
            run_id="r2",
            policy="platform",
        )
    )
    rows = {name: (left, right) for name, left, right in compare_reports(a, b)}
    assert rows["policy"] == ("baseline", "platform")
    assert rows["jobs"] == ("6", "1")
    assert rows["queue delay p50/p90/p99 (s), alpha"] == ("0 / 0 / 0 (2 jobs)", "-")
    assert rows["queue delay p50/p90/p99 (s), delta"] == ("-", "0 / 0 / 0 (1 jobs)")
    names = [name for name, _, _ in compare_reports(a, b)]
    assert names.index("queue delay p50/p90/p99 (s), alpha") < names.index(
        "queue delay p50/p90/p99 (s), delta"
    )
    text = render_comparison(a, b, labels=("quarter A", "quarter B"))
    assert "quarter A" in text and "quarter B" in text
