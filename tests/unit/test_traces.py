"""Reading the real cluster traces, checked against independent reads of the same files."""

from __future__ import annotations

import csv
import io
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import accumulate, islice
from pathlib import Path

import pytest

from allmende.core.trace_files import read_trace
from allmende.domain.metering import JobMeter
from allmende.domain.traces import (
    EPOCHS,
    PROJECTS_PER_TRACE,
    TraceFormat,
    TraceJob,
    TraceStats,
    job_events,
    project_for_user,
    with_idle_placeholders,
)
from allmende.schemas.events import (
    FinishStatus,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    encode_event,
    parse_job_event,
)

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
ELASTICFLOW = TRACES / "elasticflow" / "raw-traces.tar.gz"
PHILLY = TRACES / "philly" / "philly_jobs_15000.csv"
HELIOS = TRACES / "helios" / "helios_jobs_15000.csv"
SAMPLED = {TraceFormat.ELASTICFLOW: ELASTICFLOW, TraceFormat.PHILLY: PHILLY, TraceFormat.HELIOS: HELIOS}


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"trace file not available at {path} (the shared trace folder is not mounted)")
    return path


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with _need(path).open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _tar_rows(cluster: str) -> list[dict[str, str]]:
    with tarfile.open(_need(ELASTICFLOW), "r:gz") as tar:
        (member,) = [m for m in tar.getmembers() if Path(m.name).name == f"{cluster}.csv"]
        raw = tar.extractfile(member)
        assert raw is not None
        return list(csv.DictReader(io.StringIO(raw.read().decode("utf-8"))))


def _midnight(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp())


# -- ElasticFlow --------------------------------------------------------------------------------


def test_elasticflow_cluster10_total_equals_an_independent_sum_over_the_tar_member() -> None:
    rows = _tar_rows("cluster10")
    jobs = list(read_trace(ELASTICFLOW, TraceFormat.ELASTICFLOW, cluster="cluster10"))
    independent = sum(int(r["num_gpu"]) * int(r["duration"]) for r in rows)
    assert independent > 0
    assert sum(job.gpu_seconds for job in jobs) == independent
    assert [job.job_id for job in jobs] == [f"ef-cluster10-{r['job_id']}" for r in rows]


def test_elasticflow_jobs_start_on_submission_relative_to_2021_03_04() -> None:
    rows = _tar_rows("cluster10")
    jobs = list(read_trace(ELASTICFLOW, TraceFormat.ELASTICFLOW, cluster="cluster10"))
    epoch = _midnight(2021, 3, 4)
    assert [(j.submit_at, j.start_at) for j in jobs] == [
        (epoch + int(r["submission_time"]),) * 2 for r in rows
    ]
    assert {(j.project, j.user, j.cluster) for j in jobs} == {("ef-cluster10",) * 3}
    assert {j.status for j in jobs} == {FinishStatus.SUCCEEDED}


def test_the_whole_elasticflow_tarball_matches_its_published_size_and_total() -> None:
    stats = TraceStats()
    jobs = list(read_trace(_need(ELASTICFLOW), TraceFormat.ELASTICFLOW, stats=stats))
    # From the trace's README: 69,351 jobs in 10 clusters, 1,632,719.7 GPU-hours.
    assert stats.rows == 69_351
    assert len(jobs) + stats.skipped_no_gpu == 69_351
    assert len({job.cluster for job in jobs}) == 10
    assert sum(job.gpu_seconds for job in jobs) / 3600 == pytest.approx(1_632_719.7, abs=0.05)


def test_a_limit_yields_the_first_jobs_in_file_order() -> None:
    everything = list(read_trace(_need(ELASTICFLOW), TraceFormat.ELASTICFLOW, cluster="cluster10"))
    assert (
        list(read_trace(ELASTICFLOW, TraceFormat.ELASTICFLOW, cluster="cluster10", limit=7)) == everything[:7]
    )


def test_an_unknown_cluster_yields_no_jobs() -> None:
    assert list(read_trace(_need(ELASTICFLOW), TraceFormat.ELASTICFLOW, cluster="cluster99")) == []


# -- Philly and Helios --------------------------------------------------------------------------


def test_helios_skips_exactly_the_rows_without_gpus() -> None:
    rows = _csv_rows(HELIOS)
    cpu_only = [r for r in rows if int(r["gpu_num"]) == 0]
    assert cpu_only, "the Helios cut is known to contain CPU-only rows"
    stats = TraceStats()
    jobs = list(read_trace(HELIOS, TraceFormat.HELIOS, stats=stats))
    assert stats.rows == len(rows)
    assert stats.skipped_no_gpu == len(cpu_only)
    assert [j.job_id for j in jobs] == [f"helios-{r['u_id']}" for r in rows if int(r["gpu_num"]) != 0]
    assert all(j.gpus >= 1 for j in jobs)


SUBMISSIONS = [
    (
        "philly submission times are the running sum of interval from 2017-08-01",
        TraceFormat.PHILLY,
        PHILLY,
        (2017, 8, 1),
    ),
    (
        "helios submission times count the intervals of skipped CPU rows too",
        TraceFormat.HELIOS,
        HELIOS,
        (2020, 4, 1),
    ),
]


@pytest.mark.parametrize(
    ("fmt", "path", "epoch_day"), [c[1:] for c in SUBMISSIONS], ids=[c[0] for c in SUBMISSIONS]
)
def test_submission_times_accumulate_interval(
    fmt: TraceFormat, path: Path, epoch_day: tuple[int, int, int]
) -> None:
    rows = _csv_rows(path)
    epoch = _midnight(*epoch_day)
    submit = {
        f"{fmt.value}-{r['u_id']}": epoch + t
        for r, t in zip(rows, accumulate(int(r["interval"]) for r in rows), strict=True)
    }
    jobs = list(read_trace(path, fmt))
    assert jobs
    assert all(j.submit_at == submit[j.job_id] == j.start_at for j in jobs)
    assert [j.submit_at for j in jobs] == sorted(j.submit_at for j in jobs), "intervals are never negative"


@pytest.mark.parametrize("fmt", [TraceFormat.PHILLY, TraceFormat.HELIOS], ids=["philly rows", "helios rows"])
def test_philly_style_rows_keep_gpus_run_time_status_and_user(fmt: TraceFormat) -> None:
    path = SAMPLED[fmt]
    by_id = {f"{fmt.value}-{r['u_id']}": r for r in _csv_rows(path)}
    status = {"Pass": FinishStatus.SUCCEEDED, "Failed": FinishStatus.FAILED, "Killed": FinishStatus.CANCELLED}
    for job in read_trace(path, fmt):
        row = by_id[job.job_id]
        assert (job.gpus, job.duration_s, job.status) == (
            int(row["gpu_num"]),
            int(row["run_time"]),
            status[row["new_status"]],
        )
        assert job.user == f"{fmt.value}-u{row['user']}"
        assert job.project == project_for_user(fmt, job.user)
        assert job.cluster == fmt.value


@pytest.mark.parametrize(
    "fmt", [TraceFormat.PHILLY, TraceFormat.HELIOS], ids=["philly users", "helios users"]
)
def test_project_for_user_is_deterministic_and_within_sixteen_projects(fmt: TraceFormat) -> None:
    users = {f"{fmt.value}-u{r['user']}" for r in _csv_rows(SAMPLED[fmt])}
    allowed = {f"{fmt.value}-team-{n:02d}" for n in range(16)}
    assert PROJECTS_PER_TRACE == 16
    projects = {user: project_for_user(fmt, user) for user in users}
    assert set(projects.values()) <= allowed
    assert len(set(projects.values())) > 1, "users are spread over several projects"
    assert all(project_for_user(fmt, user) == project for user, project in projects.items())


def test_the_same_user_gets_the_same_team_number_in_every_format() -> None:
    for user in ("u1", "someone", "x" * 50):
        philly, helios = (
            project_for_user(TraceFormat.PHILLY, user),
            project_for_user(TraceFormat.HELIOS, user),
        )
        assert philly.startswith("philly-team-") and helios.startswith("helios-team-")
        assert philly.rsplit("-", 1)[1] == helios.rsplit("-", 1)[1]


def test_the_documented_epochs_are_utc_midnights_of_the_collection_starts() -> None:
    collection_starts = {
        TraceFormat.ELASTICFLOW: _midnight(2021, 3, 4),
        TraceFormat.PHILLY: _midnight(2017, 8, 1),
        TraceFormat.HELIOS: _midnight(2020, 4, 1),
    }
    assert collection_starts == EPOCHS


# -- job_events ---------------------------------------------------------------------------------

JOB_SAMPLES = [
    ("elasticflow cluster10 jobs sampled every five minutes", TraceFormat.ELASTICFLOW, "cluster10", 300),
    ("philly jobs sampled every hour", TraceFormat.PHILLY, None, 3600),
    ("helios jobs sampled every ten minutes", TraceFormat.HELIOS, None, 600),
]


def _first_jobs(fmt: TraceFormat, cluster: str | None, n: int = 60) -> list[TraceJob]:
    return list(read_trace(_need(SAMPLED[fmt]), fmt, cluster=cluster, limit=n))


def _events(jobs: list[TraceJob], every: int) -> Iterator[tuple[TraceJob, list]]:
    for job in jobs:
        yield job, list(job_events(job, every))


@pytest.mark.parametrize(
    ("fmt", "cluster", "every"), [c[1:] for c in JOB_SAMPLES], ids=[c[0] for c in JOB_SAMPLES]
)
def test_job_events_round_trip_through_the_contract(
    fmt: TraceFormat, cluster: str | None, every: int
) -> None:
    for _, events in _events(_first_jobs(fmt, cluster), every):
        for event in events:
            assert parse_job_event(encode_event(event)) == event


@pytest.mark.parametrize(
    ("fmt", "cluster", "every"), [c[1:] for c in JOB_SAMPLES], ids=[c[0] for c in JOB_SAMPLES]
)
def test_job_event_ids_are_unique_and_deterministic(
    fmt: TraceFormat, cluster: str | None, every: int
) -> None:
    jobs = _first_jobs(fmt, cluster)
    ids = [e.event_id for _, events in _events(jobs, every) for e in events]
    assert len(ids) == len(set(ids))
    assert ids == [e.event_id for _, events in _events(jobs, every) for e in events]
    assert [encode_event(e) for e in job_events(jobs[0], every)] == [
        encode_event(e) for e in job_events(jobs[0], every)
    ]


@pytest.mark.parametrize(
    ("fmt", "cluster", "every"), [c[1:] for c in JOB_SAMPLES], ids=[c[0] for c in JOB_SAMPLES]
)
def test_job_events_tell_the_whole_run_with_samples_strictly_inside(
    fmt: TraceFormat, cluster: str | None, every: int
) -> None:
    for job, events in _events(_first_jobs(fmt, cluster), every):
        end = job.start_at + job.duration_s
        submitted, start, *samples, finish = events
        assert isinstance(submitted, JobSubmitted) and submitted.gpus == job.gpus
        assert submitted.project == job.project and submitted.occurred_at == job.submit_at
        assert isinstance(start, JobStarted) and (start.occurred_at, start.gpus) == (job.start_at, job.gpus)
        assert isinstance(finish, JobFinished)
        assert (finish.occurred_at, finish.started_at, finish.status) == (end, job.start_at, job.status)
        assert all(isinstance(s, JobUsageSample) and s.gpus_in_use == job.gpus for s in samples)
        times = [s.occurred_at for s in samples]
        assert all(job.start_at < t < end for t in times)
        assert [t - job.start_at for t in times] == list(range(every, job.duration_s, every))
        assert {e.job_id for e in events} == {job.job_id}


@pytest.mark.parametrize(
    ("fmt", "cluster", "every"), [c[1:] for c in JOB_SAMPLES], ids=[c[0] for c in JOB_SAMPLES]
)
def test_metering_replayed_trace_jobs_charges_gpus_times_run_time(
    fmt: TraceFormat, cluster: str | None, every: int
) -> None:
    for job, events in _events(_first_jobs(fmt, cluster), every):
        meter = JobMeter(job.job_id)
        for event in events:
            meter.apply(event)
        assert meter.gpu_seconds() == job.gpus * job.duration_s


def test_a_job_of_zero_duration_has_no_samples_and_charges_nothing() -> None:
    job = TraceJob(
        job_id="zero", project="p", user="u", cluster="c", gpu_type="V100", gpus=4,
        submit_at=EPOCHS[TraceFormat.PHILLY], start_at=EPOCHS[TraceFormat.PHILLY], duration_s=0,
        status=FinishStatus.SUCCEEDED,
    )  # fmt: skip
    events = list(job_events(job, 60))
    assert [type(e) for e in events] == [JobSubmitted, JobStarted, JobFinished]
    meter = JobMeter("zero")
    for event in events:
        meter.apply(event)
    assert meter.gpu_seconds() == 0


@pytest.mark.parametrize("every", [0, -60], ids=["a zero sample interval is refused", "a negative one too"])
def test_job_events_refuses_a_non_positive_sample_interval(every: int) -> None:
    job = next(iter(_first_jobs(TraceFormat.PHILLY, None, 1)))
    with pytest.raises(ValueError, match="positive"):
        list(islice(job_events(job, every), 1))


def _many_jobs(n: int) -> list[TraceJob]:
    at = EPOCHS[TraceFormat.PHILLY]
    return [
        TraceJob(
            job_id=f"j{i}",
            project="p",
            user="u",
            cluster="c",
            gpu_type="V100",
            gpus=1 + i % 8,
            submit_at=at + i,
            start_at=at + i,
            duration_s=600 + 37 * i,
            status=FinishStatus.SUCCEEDED,
        )
        for i in range(n)
    ]


def test_idle_placeholders_are_a_share_of_the_jobs_chosen_by_seed_and_job_id_alone() -> None:
    jobs = _many_jobs(4000)
    chosen = {j.job_id for j in with_idle_placeholders(jobs, 0.1, seed=7) if j.utilization < 1.0}
    assert 0.08 * len(jobs) < len(chosen) < 0.12 * len(jobs)
    # The same seed picks the same jobs whatever the order or the slice replayed; another seed others.
    backwards = {j.job_id for j in with_idle_placeholders(reversed(jobs), 0.1, seed=7) if j.utilization < 1.0}
    first = {j.job_id for j in with_idle_placeholders(jobs[:500], 0.1, seed=7) if j.utilization < 1.0}
    other = {j.job_id for j in with_idle_placeholders(jobs, 0.1, seed=8) if j.utilization < 1.0}
    assert backwards == chosen and first == chosen & {j.job_id for j in jobs[:500]}
    assert other != chosen
    # A bigger share keeps the smaller one's jobs (it only adds): a tunable knob, not a reshuffle.
    assert chosen <= {j.job_id for j in with_idle_placeholders(jobs, 0.2, seed=7) if j.utilization < 1.0}
    assert all(j.utilization == 1.0 for j in with_idle_placeholders(jobs, 0.0))
    assert all(j.utilization < 1.0 for j in with_idle_placeholders(jobs[:50], 1.0))


def test_an_idle_placeholder_samples_under_the_squatting_threshold_and_meters_its_idle_time() -> None:
    jobs = list(with_idle_placeholders(_many_jobs(300), 0.5, seed=1))
    placeholders = [j for j in jobs if j.utilization < 1.0]
    assert placeholders and all(0.0 <= j.utilization < 0.05 for j in placeholders)
    for job in jobs:
        events = list(job_events(job, 600))
        samples = [e for e in events if isinstance(e, JobUsageSample)]
        assert {s.gpu_utilization for s in samples} <= {job.utilization}
        meter = JobMeter(job.job_id)
        for event in events:
            meter.apply(event)
        assert meter.gpu_seconds() == job.gpu_seconds  # idle GPUs are charged all the same
        # Every piece takes its sample's utilisation (the tail, the last sample's); a job too short
        # for a sample reports none and counts as busy.
        busy_bp = 10_000 if not samples else round(job.utilization * 10_000)
        assert meter.idle_units() == job.gpu_seconds * (10_000 - busy_bp)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_an_idle_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="idle share"):
        list(with_idle_placeholders(_many_jobs(3), share))
