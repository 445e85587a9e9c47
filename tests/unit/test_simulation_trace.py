"""The simulator on slices of real traces and a real plan: fast, reproducible, and the old
system's failure modes show in its report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from allmende.core.trace_files import read_trace
from allmende.domain.capacity import peak_in_use
from allmende.domain.metering import JobMeter
from allmende.domain.plan_file import parse_plan
from allmende.domain.simulation.baseline import BaselineConfig, BaselinePolicy, protected_by_shares
from allmende.domain.simulation.behaviours import Behaviours, inflates, workload
from allmende.domain.simulation.engine import EngineConfig, Simulation
from allmende.domain.simulation.from_plan import clusters_from_plan, project_shares
from allmende.domain.simulation.interfaces import ListSink, SimEvent
from allmende.domain.simulation.model import TOP_CLASS, ClusterSize, HostFailure, RunEnd, SimulationResult
from allmende.domain.simulation.report import SimulationReport, build_report
from allmende.domain.traces import TraceFormat, TraceJob

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "data" / "traces"
PHILLY = TRACES / "philly" / "philly_jobs_15000.csv"
ELASTICFLOW = TRACES / "elasticflow" / "raw-traces.tar.gz"
PLAN = ROOT / "examples" / "plans" / "elasticflow-2021-q2.yaml"
HOUR, DAY = 3600, 86_400
ON_CALL_S = 4 * HOUR
WALL_LIMIT_S = 5.0  # a 300-job slice takes well under a second; the margin is for a busy machine

needs_traces = pytest.mark.skipif(not PHILLY.exists(), reason="needs ../shared/data/traces")


def philly_slice() -> list[TraceJob]:
    """300 jobs from a busy stretch of the Philly cut (about 3 hours of submissions)."""
    return list(read_trace(PHILLY, TraceFormat.PHILLY, limit=5_300))[5_000:]


def run_baseline(
    trace: list[TraceJob], seed: int, gpus: int = 64
) -> tuple[SimulationResult, list[SimEvent], Behaviours]:
    first = trace[0].submit_at
    behaviours = Behaviours(
        seed=seed,
        placeholder_user_share=0.2,
        inflating_user_share=0.3,
        interactive_share=0.2,
        host_failures=(HostFailure("philly", "philly-n001", first + HOUR, recover_at=first + 2 * HOUR),),
    )
    jobs = workload(trace, behaviours)
    protected = protected_by_shares({"philly": gpus}, {j.project: 1 for j in jobs}, percent=50)
    policy = BaselinePolicy(BaselineConfig(protected_gpus=protected, on_call_delay_s=ON_CALL_S))
    sink = ListSink()
    config = EngineConfig(run_id=f"philly-{seed}", sample_every_s=HOUR)
    sim = Simulation([ClusterSize("philly", gpus)], jobs, policy, sink, config, behaviours.host_failures)
    return sim.run(), sink.events, behaviours


@needs_traces
def test_a_300_job_slice_of_a_real_trace_simulates_in_well_under_a_few_seconds() -> None:
    trace = philly_slice()
    began = time.perf_counter()
    result, _, _ = run_baseline(trace, seed=1)
    report = build_report(result)
    elapsed = time.perf_counter() - began
    assert elapsed < WALL_LIMIT_S, f"{elapsed:.2f} s"
    assert len(trace) == 300 and report.jobs > 300  # the placeholders come on top
    assert report.outcomes["finished"] > 250


@needs_traces
def test_the_same_seed_gives_the_same_report_byte_for_byte_and_another_seed_another() -> None:
    trace = philly_slice()
    first, events_1, _ = run_baseline(trace, seed=1)
    again, events_2, _ = run_baseline(trace, seed=1)
    other, _, _ = run_baseline(trace, seed=2)

    def as_bytes(report: SimulationReport) -> bytes:
        return json.dumps(report.to_dict()).encode()

    assert as_bytes(build_report(first)) == as_bytes(build_report(again))
    assert [e.model_dump() for e in events_1] == [e.model_dump() for e in events_2]
    assert build_report(other).to_dict() != build_report(first).to_dict()


@needs_traces
def test_a_real_slice_conserves_every_gpu_second_through_the_meter() -> None:
    result, events, _ = run_baseline(philly_slice(), seed=1)
    meters: dict[str, JobMeter] = {}
    for e in events:
        meters.setdefault(e.job_id, JobMeter(e.job_id)).apply(e)
    report = build_report(result)
    assert sum(m.gpu_seconds() for m in meters.values()) == report.busy_gpu_seconds
    assert sum(report.outcomes.values()) == len(result.jobs) == len({e.job_id for e in events})


@needs_traces
def test_the_baseline_shows_placeholders_priority_inflation_and_jobs_stuck_on_a_bad_host() -> None:
    result, _, behaviours = run_baseline(philly_slice(), seed=1)
    report = build_report(result)
    # Placeholders hold GPUs and leave them idle.
    assert report.placeholder_idle_gpu_seconds > 0
    stuck_placeholders = sum(x.stuck_gpu_seconds for r in result.jobs if r.job.placeholder for x in r.runs)
    working = report.placeholder_held_gpu_seconds - stuck_placeholders  # stuck time counts as stuck
    assert report.placeholder_idle_gpu_seconds == pytest.approx(0.99 * working, abs=len(result.jobs))
    assert report.useful_gpu_seconds < report.busy_gpu_seconds
    # Priority inflation: every job of an inflating user is at the top class, on top of the mix.
    inflated = drawn_top = 0
    for r in result.jobs:
        if not r.job.placeholder and inflates(behaviours, r.job.user):
            inflated += 1
        elif not r.job.placeholder and r.job.priority_class is TOP_CLASS:
            drawn_top += 1
    placeholders = sum(1 for r in result.jobs if r.job.placeholder)
    assert report.top_class_jobs == inflated + drawn_top + placeholders
    assert report.top_class_share > 0.3
    # Non-preemptible jobs on the bad host wait for the on-call; the others are requeued at once.
    stuck = {r.job_id: r for r in report.stuck_runs}
    assert stuck, "the bad host should hold non-preemptible work"
    by_id = {r.job.job_id: r.job for r in result.jobs}
    assert {by_id[j].priority_class for j in stuck} == {TOP_CLASS}
    assert {r.stuck_s for r in stuck.values()} == {ON_CALL_S}
    assert all(r.ended is RunEnd.PREEMPTED for r in stuck.values())


def test_the_example_plan_gives_clusters_shares_and_protected_gpus() -> None:
    plan = parse_plan(PLAN.read_text())
    clusters = clusters_from_plan(plan)
    assert [(c.name, c.gpus, c.gpu_type) for c in clusters] == [
        ("ef-cluster01", 384, "V100"),
        ("ef-cluster02", 384, "V100"),
        ("ef-cluster10", 128, "V100"),
    ]
    shares = project_shares(plan)
    assert shares == {"ef-cluster01": 50, "ef-cluster02": 30, "ef-cluster10": 20, "sandbox": 30}
    protected = protected_by_shares({c.name: c.gpus for c in clusters}, shares, percent=50)
    assert protected[("ef-cluster01", "ef-cluster01")] == 384 * 50 * 50 // (100 * 130)
    assert all(sum(n for (c, _), n in protected.items() if c == cl.name) <= cl.gpus // 2 for cl in clusters)


@pytest.mark.skipif(not ELASTICFLOW.exists(), reason="needs ../shared/data/traces")
def test_the_example_plan_holds_what_its_trace_runs_at_once() -> None:
    """The replay starts each job at its submission; no cluster may then run more GPUs than the
    plan declares (the meter would take that for impossible usage)."""
    declared = {c.name: c for c in clusters_from_plan(parse_plan(PLAN.read_text()))}
    runs: dict[str, list[tuple[int, int, int]]] = {name: [] for name in declared}
    for job in read_trace(ELASTICFLOW, TraceFormat.ELASTICFLOW):
        if job.cluster in runs:
            assert job.gpu_type == declared[job.cluster].gpu_type
            runs[job.cluster].append((job.start_at, job.start_at + job.duration_s, job.gpus))
    peaks = {name: peak_in_use(r) for name, r in runs.items()}
    assert all(runs.values()), "every declared cluster has a trace file"
    assert peaks["ef-cluster02"] > 256, "the trace's own peak, which the plan once did not hold"
    for name, peak in peaks.items():
        gpus = declared[name].gpus
        assert peak <= gpus, f"{name} runs {peak} GPUs at once, the plan declares {gpus}"


@pytest.mark.skipif(not ELASTICFLOW.exists(), reason="needs ../shared/data/traces")
def test_a_real_plan_runs_a_slice_of_its_own_trace() -> None:
    plan = parse_plan(PLAN.read_text())
    trace = list(read_trace(ELASTICFLOW, TraceFormat.ELASTICFLOW, cluster="cluster01", limit=300))
    jobs = workload(trace, Behaviours(seed=0))
    sink = ListSink()
    result = Simulation(
        clusters_from_plan(plan), jobs, BaselinePolicy(), sink, EngineConfig(run_id="ef")
    ).run()
    report = build_report(result)
    assert report.outcomes["finished"] == report.jobs
    assert report.busy_gpu_seconds == sum(j.gpus * j.duration_s for j in jobs)  # nothing preempted
    assert 0.0 < report.busy_utilization < 1.0
