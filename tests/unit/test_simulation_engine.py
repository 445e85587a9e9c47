"""The simulator's engine: exact schedules on tiny clusters, conservation, accounting, determinism."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from allmende.domain.admission_model import JobRequest
from allmende.domain.metering import JobMeter
from allmende.domain.simulation.baseline import BaselineConfig, BaselinePolicy
from allmende.domain.simulation.cluster import Cluster, host_name
from allmende.domain.simulation.engine import EngineConfig, Simulation
from allmende.domain.simulation.interfaces import ListSink, SimEvent, SimView
from allmende.domain.simulation.model import (
    ClusterSize,
    HostFailure,
    JobOutcome,
    Outcome,
    Queue,
    RunEnd,
    SimJob,
    SimulationError,
    SimulationResult,
    Start,
    Stop,
)
from allmende.domain.simulation.report import build_report
from allmende.schemas.events import (
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    PriorityClass,
)

T0 = 1_700_000_000  # any instant inside the event contract's bounds
HOUR = 3600
P, S, N = PriorityClass.PREEMPTIBLE, PriorityClass.STANDARD, PriorityClass.NON_PREEMPTIBLE


def job(
    job_id: str, gpus: int, at: int, seconds: int, cls: PriorityClass = S, project: str = "proj",
    cluster: str = "c1", placeholder: bool = False, utilization: float = 1.0,
) -> SimJob:  # fmt: skip
    return SimJob(
        job_id=job_id, project=project, user=f"u-{project}", cluster=cluster, gpu_type="H100", gpus=gpus,
        submit_at=T0 + at, duration_s=seconds, priority_class=cls, placeholder=placeholder,
        utilization=utilization,
    )  # fmt: skip


def simulate(
    jobs: list[SimJob], gpus: int = 8, protected: dict[tuple[str, str], int] | None = None,
    failures: tuple[HostFailure, ...] = (), **config: Any,
) -> tuple[SimulationResult, list[SimEvent]]:  # fmt: skip
    sink = ListSink()
    policy = BaselinePolicy(BaselineConfig(protected_gpus=protected or {}))
    sim = Simulation([ClusterSize("c1", gpus)], jobs, policy, sink, EngineConfig(**config), failures)
    return sim.run(), sink.events


def runs_of(result: SimulationResult) -> dict[str, list[tuple[int, int, RunEnd]]]:
    """job -> [(start, end, how)] as offsets from T0."""
    return {r.job.job_id: [(x.start - T0, x.end - T0, x.ended) for x in r.runs] for r in result.jobs}


F, PRE, CUT = RunEnd.FINISHED, RunEnd.PREEMPTED, RunEnd.CUT

# -- exact schedules, computed by hand ----------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "jobs", "protected", "config", "expected_runs", "expected_delays"),
    [
        (
            "a job that does not fit waits while a smaller one behind it backfills",
            [job("a", 4, 0, 100), job("b", 6, 10, 50), job("c", 4, 20, 30)],
            {},
            {},
            {"a": [(0, 100, F)], "b": [(100, 150, F)], "c": [(20, 50, F)]},
            {"a": 0, "b": 90, "c": 0},
        ),
        (
            "a top-class job inside its protected GPUs preempts preemptible work, which restarts",
            [job("p", 8, 0, 100, P, project="q"), job("h", 4, 10, 50, N, project="owner")],
            {("c1", "owner"): 8},
            {},
            {"p": [(0, 10, PRE), (60, 160, F)], "h": [(10, 60, F)]},
            {"p": 0, "h": 0},
        ),
        (
            "with progress kept, the preempted job only runs what it had left",
            [job("p", 8, 0, 100, P, project="q"), job("h", 4, 10, 50, N, project="owner")],
            {("c1", "owner"): 8},
            {"keep_progress_on_preemption": True},
            {"p": [(0, 10, PRE), (60, 150, F)], "h": [(10, 60, F)]},
            {"p": 0, "h": 0},
        ),
        (
            "without protected GPUs a top-class job waits for preemptible work to finish",
            [job("p", 8, 0, 100, P, project="q"), job("h", 4, 10, 50, N, project="owner")],
            {},
            {},
            {"p": [(0, 100, F)], "h": [(100, 150, F)]},
            {"p": 0, "h": 90},
        ),
        (
            "the queue goes by class before submission time",
            [job("big", 8, 0, 100), job("p1", 8, 1, 10, P), job("n1", 8, 2, 10, N), job("s1", 8, 3, 10, S)],
            {},
            {},
            {"big": [(0, 100, F)], "n1": [(100, 110, F)], "s1": [(110, 120, F)], "p1": [(120, 130, F)]},
            {"big": 0, "n1": 98, "s1": 107, "p1": 119},
        ),
        (
            "a job running past the end is cut there and still running",
            [job("a", 8, 0, 100), job("b", 8, 50, 100)],
            {},
            {"end_at": T0 + 150},
            {"a": [(0, 100, F)], "b": [(100, 150, CUT)]},
            {"a": 0, "b": 50},
        ),
        (
            "a job still queued at the end counts the time it waited",
            [job("a", 8, 0, 100), job("b", 8, 50, 100)],
            {},
            {"end_at": T0 + 80},
            {"a": [(0, 80, CUT)], "b": []},
            {"a": 0, "b": 30},
        ),
    ],
)
def test_tiny_scenarios_run_exactly_as_computed_by_hand(
    case: str, jobs: list[SimJob], protected: dict[tuple[str, str], int], config: dict[str, Any],
    expected_runs: dict[str, list[tuple[int, int, RunEnd]]], expected_delays: dict[str, int],
) -> None:  # fmt: skip
    result, _ = simulate(jobs, protected=protected, **config)
    assert runs_of(result) == expected_runs, case
    delays = {r.job.job_id: (r.first_start or result.end_at) - r.job.submit_at for r in result.jobs}
    assert delays == expected_delays, case


def test_the_backfill_scenario_reports_its_figures_exactly() -> None:
    result, _ = simulate([job("a", 4, 0, 100), job("b", 6, 10, 50), job("c", 4, 20, 30)])
    report = build_report(result)
    assert (result.start_at, result.end_at) == (T0, T0 + 150)
    assert report.capacity_gpu_seconds == 8 * 150
    assert report.busy_gpu_seconds == 4 * 100 + 6 * 50 + 4 * 30
    assert (report.queue_delay.p50_s, report.queue_delay.p90_s, report.queue_delay.p99_s) == (0, 90, 90)
    assert report.outcomes == {"finished": 3, "cancelled": 0, "queued": 0, "running": 0}


def test_a_preempted_run_without_checkpoint_is_lost_work() -> None:
    jobs = [job("p", 8, 0, 100, P, project="q"), job("h", 4, 10, 50, N, project="owner")]
    lost = build_report(simulate(jobs, protected={("c1", "owner"): 8})[0])
    kept = build_report(simulate(jobs, protected={("c1", "owner"): 8}, keep_progress_on_preemption=True)[0])
    assert (lost.lost_to_preemption_gpu_seconds, lost.preemptions, lost.busy_gpu_seconds) == (80, 1, 1080)
    assert (kept.lost_to_preemption_gpu_seconds, kept.busy_gpu_seconds) == (0, 1000)


def test_jobs_larger_than_the_cluster_or_on_an_unknown_cluster_are_cancelled() -> None:
    result, events = simulate([job("huge", 9, 0, 10), job("lost", 1, 0, 10, cluster="elsewhere")])
    assert {r.job.job_id: r.outcome for r in result.jobs} == {
        "huge": JobOutcome.CANCELLED,
        "lost": JobOutcome.CANCELLED,
    }
    finished = [e for e in events if isinstance(e, JobFinished)]
    assert [(e.job_id, e.status.value, e.started_at) for e in finished] == [
        ("huge", "cancelled", None),
        ("lost", "cancelled", None),
    ]


# -- host failures --------------------------------------------------------------------------------


def test_a_bad_host_requeues_standard_jobs_at_once_and_leaves_non_preemptible_ones_stuck() -> None:
    jobs = [job("n", 4, 0, 10 * HOUR, N), job("s", 4, 0, 10 * HOUR, S)]
    failure = HostFailure("c1", "c1-n001", T0 + HOUR)
    result, events = simulate(jobs, gpus=16, failures=(failure,), end_at=T0 + 12 * HOUR)
    assert runs_of(result) == {
        "n": [(0, 5 * HOUR, PRE), (5 * HOUR, 12 * HOUR, CUT)],
        "s": [(0, HOUR, PRE), (HOUR, 11 * HOUR, F)],
    }
    hosts = {(e.job_id, e.event_id.split(":")[3]): e.hosts for e in events if isinstance(e, JobStarted)}
    assert hosts == {
        ("n", "1"): ("c1-n001",),
        ("s", "1"): ("c1-n001",),
        ("s", "2"): ("c1-n002",),
        ("n", "2"): ("c1-n002",),
    }
    report = build_report(result)
    assert [(r.job_id, r.stuck_s, r.gpus) for r in report.stuck_runs] == [("n", 4 * HOUR, 4)]
    assert report.stuck_gpu_seconds == 4 * 4 * HOUR
    assert report.useful_gpu_seconds == report.busy_gpu_seconds - 4 * 4 * HOUR


def test_a_recovered_host_takes_jobs_again() -> None:
    jobs = [job("a", 8, 0, 2 * HOUR), job("b", 8, 2 * HOUR, HOUR)]
    failure = HostFailure("c1", "c1-n001", T0 + HOUR, recover_at=T0 + 4 * HOUR)
    result, _ = simulate(jobs, failures=(failure,))
    # a stops at the failure and waits for the host; b queues behind it (same class, later).
    assert runs_of(result) == {"a": [(0, HOUR, PRE), (4 * HOUR, 6 * HOUR, F)], "b": [(6 * HOUR, 7 * HOUR, F)]}


# -- the books balance ----------------------------------------------------------------------------


def mixed_workload() -> tuple[list[SimJob], tuple[HostFailure, ...]]:
    jobs = [
        job(f"j{i:02d}", gpus=1 + (i * 7) % 8, at=i * 600, seconds=1800 + (i * 977) % 7200,
            cls=(P, S, N)[i % 3], project=f"proj{i % 4}")
        for i in range(40)
    ]  # fmt: skip
    jobs.append(job("squat", 2, 0, 30 * HOUR, N, project="proj0", placeholder=True, utilization=0.01))
    return jobs, (HostFailure("c1", "c1-n002", T0 + 3 * HOUR, recover_at=T0 + 5 * HOUR),)


def implied_gpu_seconds(events: list[SimEvent]) -> dict[tuple[str, str], int]:
    """(job, run#) -> GPU-seconds the lifecycle events imply: started .. preempted or finished, or
    .. the last reading of a run that is still going, times the run's GPUs."""
    gpus: dict[tuple[str, str], int] = {}
    start: dict[tuple[str, str], int] = {}
    end: dict[tuple[str, str], int] = {}
    closed: set[tuple[str, str]] = set()
    for e in events:
        parts = e.event_id.split(":")
        if isinstance(e, JobSubmitted) or parts[-1] == "cancelled":
            continue
        key = (e.job_id, parts[3])
        assert key not in closed, f"{e.event_id} after the end of its run"
        if isinstance(e, JobStarted):
            gpus[key], start[key] = e.gpus, e.occurred_at
        elif isinstance(e, JobPreempted | JobFinished):
            assert e.started_at == start[key]
            end[key] = e.occurred_at
            closed.add(key)
        elif isinstance(e, JobUsageSample):
            assert e.gpus_in_use == gpus[key]
            end[key] = e.occurred_at
    return {key: gpus[key] * (end.get(key, start[key]) - start[key]) for key in gpus}


@pytest.mark.parametrize(
    ("case", "config"),
    [
        ("to the end, without samples", {}),
        ("to the end, with samples every 5 minutes", {"sample_every_s": 300}),
        ("cut at a fixed end", {"end_at": T0 + 6 * HOUR, "sample_every_s": 600}),
        ("with progress kept on preemption", {"keep_progress_on_preemption": True}),
    ],
)
def test_every_gpu_second_of_every_run_is_in_the_events_exactly_once(
    case: str, config: dict[str, Any]
) -> None:
    jobs, failures = mixed_workload()
    result, events = simulate(
        jobs, gpus=16, protected={("c1", "proj1"): 8, ("c1", "proj2"): 4}, failures=failures, **config
    )
    recorded = {(r.job.job_id, str(x.run_no)): x.gpu_seconds for r in result.jobs for x in r.runs}
    assert implied_gpu_seconds(events) == recorded, case
    # The real meter agrees, to the GPU-second.
    meters: dict[str, JobMeter] = {}
    for e in events:
        meters.setdefault(e.job_id, JobMeter(e.job_id)).apply(e)
    metered = sum(m.gpu_seconds() for m in meters.values())
    assert metered == build_report(result).busy_gpu_seconds == sum(recorded.values()), case
    assert build_report(result).preemptions > 0, "the workload should exercise preemption"


def test_every_job_is_accounted_for_exactly_once() -> None:
    jobs, failures = mixed_workload()
    jobs.append(job("too-big", 64, 100, 10))
    result, events = simulate(jobs, gpus=16, failures=failures, end_at=T0 + 5 * HOUR)
    assert sorted(r.job.job_id for r in result.jobs) == sorted(
        j.job_id for j in jobs if j.submit_at <= T0 + 5 * HOUR
    )
    assert sum(build_report(result).outcomes.values()) == len(result.jobs)
    kinds: dict[str, list[str]] = defaultdict(list)
    for e in events:
        kinds[e.job_id].append(e.type)
    for record in result.jobs:
        seen = kinds[record.job.job_id]
        assert seen.count("JobSubmitted") == 1
        assert seen.count("JobFinished") == (record.outcome in (JobOutcome.FINISHED, JobOutcome.CANCELLED))
        assert seen.count("JobStarted") == len(record.runs)
        assert seen.count("JobPreempted") == sum(r.ended is PRE for r in record.runs)
        if record.outcome is JobOutcome.RUNNING:
            assert record.runs[-1].ended is CUT
    outcomes = build_report(result).outcomes
    assert all(outcomes[o] > 0 for o in ("finished", "cancelled", "queued", "running")), outcomes


def test_events_reach_the_sink_in_simulated_time_order_with_unique_ids() -> None:
    jobs, failures = mixed_workload()
    _, events = simulate(jobs, gpus=16, failures=failures, sample_every_s=300, run_id="r1")
    times = [e.occurred_at for e in events]
    assert times == sorted(times)
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids))
    assert all(i.startswith("sim:r1:") for i in ids)
    assert "sim:r1:j00:1:started" in ids


def test_placeholder_samples_report_their_low_utilisation() -> None:
    jobs, _ = mixed_workload()
    _, events = simulate(jobs, gpus=16, sample_every_s=600)
    readings = {e.gpu_utilization for e in events if isinstance(e, JobUsageSample) and e.job_id == "squat"}
    assert readings == {0.01}


# -- deciding is not acting ---------------------------------------------------------------------


def test_deciding_and_host_hooks_do_not_change_the_engine() -> None:
    jobs = [
        job("p", 12, 0, 10 * HOUR, P, project="q"),
        job("s", 8, 10, HOUR, S, project="other"),
        job("x", 2, 20, HOUR, S, project="other"),
    ]
    policy = BaselinePolicy(BaselineConfig(protected_gpus={("c1", "owner"): 8}))
    sim = Simulation([ClusterSize("c1", 16)], jobs, policy, ListSink(), EngineConfig())
    while sim.now < T0 + 20 and sim.step():
        pass
    assert (sim.view.queue_length("c1"), sim.view.free_gpus("c1")) == (1, 2), "a busy cluster with a queue"
    before = sim.fingerprint()
    owner = job("h", 4, 30, HOUR, N, project="owner").request()
    answers = [policy.decide(r, sim.view, sim.now) for r in (owner, jobs[1].request(), jobs[2].request())]
    stops = [policy.on_host_health("c1", host, False, sim.view, sim.now) for host in ("c1-n001", "c1-n002")]
    assert answers[0] == Start(victims=("p",), reason="protected-gpus")
    assert [len(s) for s in stops] == [1, 2]
    assert sim.fingerprint() == before


class _GreedyPolicy:
    """Starts everything, always: the engine must refuse to place what does not fit."""

    name = "greedy"

    def decide(self, job: JobRequest, view: SimView, now: int) -> Outcome:
        return Start()

    def queue_key(self, job: JobRequest, submitted_at: int, now: int) -> tuple[int, ...]:
        return ()

    def on_host_health(
        self, cluster: str, host: str, healthy: bool, view: SimView, now: int
    ) -> tuple[Stop, ...]:
        return ()


def test_a_start_that_does_not_fit_is_a_policy_bug_unless_the_engine_is_told_to_tolerate_it() -> None:
    jobs = [job("a", 8, 0, 100), job("b", 8, 10, 100)]
    with pytest.raises(SimulationError, match="started b"):
        Simulation([ClusterSize("c1", 8)], jobs, _GreedyPolicy(), ListSink()).run()
    result = Simulation(
        [ClusterSize("c1", 8)], jobs, _GreedyPolicy(), ListSink(), EngineConfig(strict=False)
    ).run()
    assert result.misfits > 0
    assert runs_of(result)["b"] == [(100, 200, F)]


# -- the cluster ------------------------------------------------------------------------------------


def test_hosts_are_named_in_order_and_the_last_one_takes_the_remainder() -> None:
    cluster = Cluster("c1", 20)
    assert cluster.hosts == ("c1-n001", "c1-n002", "c1-n003")
    assert dict(cluster.host_free()) == {"c1-n001": 8, "c1-n002": 8, "c1-n003": 4}
    assert host_name("gpu", 999) == "gpu-n1000"


@pytest.mark.parametrize(
    ("case", "placed", "bad", "gpus", "expected"),
    [
        ("first fit fills the first host", [], [], 3, ("c1-n001",)),
        ("a job spans hosts when it must", [5], [], 6, ("c1-n001", "c1-n002")),
        ("a bad host is skipped", [], ["c1-n001"], 8, ("c1-n002",)),
        ("no room on healthy hosts: not placed", [8], ["c1-n002"], 1, None),
    ],
)
def test_first_fit_placement(
    case: str, placed: list[int], bad: list[str], gpus: int, expected: tuple[str, ...] | None
) -> None:
    from allmende.domain.admission_model import RunningJob

    cluster = Cluster("c1", 16)
    for i, n in enumerate(placed):
        cluster.place(RunningJob(f"x{i}", "p", "u", n, "standard", None, T0))
    for host in bad:
        cluster.set_health(host, False)
    assert cluster.place(RunningJob("new", "p", "u", gpus, "standard", None, T0)) == expected, case


def test_gpus_freed_on_a_bad_host_stay_out_of_use_until_it_recovers() -> None:
    from allmende.domain.admission_model import RunningJob

    cluster = Cluster("c1", 16)
    cluster.place(RunningJob("a", "p", "u", 12, "standard", None, T0))
    cluster.set_health("c1-n001", False)
    assert cluster.free_healthy == 4
    cluster.release("a")
    assert cluster.free_healthy == 8
    cluster.set_health("c1-n001", True)
    assert cluster.free_healthy == 16


# -- shortcuts that must not change a result ----------------------------------------------------


class _NoPromises:
    """The baseline without its promises to wait: asked about every queued job at every pass."""

    name = "baseline"

    def __init__(self, inner: BaselinePolicy) -> None:
        self.inner = inner

    def decide(self, job: JobRequest, view: SimView, now: int) -> Outcome:
        answer = self.inner.decide(job, view, now)
        return Queue(answer.reason) if isinstance(answer, Queue) else answer

    def queue_key(self, job: JobRequest, submitted_at: int, now: int) -> tuple[int, ...]:
        return self.inner.queue_key(job, submitted_at, now)

    def on_host_health(
        self, cluster: str, host: str, healthy: bool, view: SimView, now: int
    ) -> tuple[Stop, ...]:
        return self.inner.on_host_health(cluster, host, healthy, view, now)


@pytest.mark.parametrize(
    ("case", "config"),
    [
        ("the baseline's promises to wait", {}),
        ("periodic passes for a policy that reads only the state", {"reschedule_every_s": 60}),
    ],
)
def test_shortcuts_change_no_run_of_the_baseline(case: str, config: dict[str, Any]) -> None:
    jobs, failures = mixed_workload()
    baseline = BaselinePolicy(BaselineConfig(protected_gpus={("c1", "proj1"): 8}))
    plain = EngineConfig(reschedule_every_s=None, max_decisions_per_pass=10_000)
    reference = simulate_with(_NoPromises(baseline), jobs, failures, plain)
    shortcut = simulate_with(baseline, jobs, failures, EngineConfig(max_decisions_per_pass=10_000, **config))
    assert runs_of(shortcut) == runs_of(reference), case
    if not config:
        assert shortcut.decisions < reference.decisions, "the promises should save decisions"


def simulate_with(
    policy: BaselinePolicy | _NoPromises,
    jobs: list[SimJob],
    failures: tuple[HostFailure, ...],
    config: EngineConfig,
) -> SimulationResult:
    return Simulation([ClusterSize("c1", 16)], jobs, policy, ListSink(), config, failures).run()
