"""The ledger in chDB: idempotent migrations, redelivered batches, projection repair, the API."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient

from allmende.core.clickhouse import Database
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.domain.metering import JobMeter
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import JobFinished, JobStarted, JobSubmitted, JobUsageSample, PriorityClass
from allmende.schemas.ledger import encode_entries
from allmende.services.dashboard_queries import DashboardQueries
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.budget_harness import ADMIN, ALICE, SCHEDULER, with_tokens
from allmende.topology import create_app

pytestmark = pytest.mark.integration

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def _job_entries(
    job_id: str,
    project: str,
    gpus: int,
    hours: int,
    user: str = "ada",
    submitted: bool = True,
    start: int = T0,
) -> list[bytes]:
    """Entry records for a job that ran `hours` with one sample per hour at 50 % utilisation
    (without its JobSubmitted: the unattributed first versions)."""
    common = {"producer": "test", "job_id": job_id}
    meter = JobMeter(job_id)
    submission = JobSubmitted(
        event_id=f"{job_id}:s",
        occurred_at=start,
        project=project,
        user=user,
        cluster="c1",
        gpu_type="H100",
        gpus=gpus,
        priority_class=PriorityClass.STANDARD,
        requested_seconds=hours * 3600,
        **common,
    )
    if submitted:
        meter.apply(submission)
    meter.apply(JobStarted(event_id=f"{job_id}:st", occurred_at=start, gpus=gpus, **common))
    for h in range(1, hours):
        meter.apply(
            JobUsageSample(
                event_id=f"{job_id}:u{h}",
                occurred_at=start + h * 3600,
                gpus_in_use=gpus,
                gpu_utilization=0.5,
                **common,
            )
        )
    meter.apply(
        JobFinished(event_id=f"{job_id}:f", occurred_at=start + hours * 3600, status="succeeded", **common)
    )
    return [encode_entries([e]) for e in meter.entries()]


def _records(values: list[bytes]) -> list[tuple[int, int, bytes | None, bytes]]:
    return [(0, i, None, v) for i, v in enumerate(values)]


def test_migrations_apply_once_and_refuse_an_edited_history(settings: Settings) -> None:
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    first = db.migrate()
    assert first and db.migrate() == []
    db.command("ALTER TABLE {db}.schema_migrations UPDATE checksum = 'x' WHERE version = 1")
    with pytest.raises(RuntimeError, match="changed after it was applied"):
        db.migrate()


def test_a_batch_delivered_again_after_a_crash_posts_nothing_twice(
    settings: Settings, store: LedgerStore
) -> None:
    values = _job_entries("job-a", "olmo", gpus=8, hours=30)
    letters: list[DeadLetter] = []
    # The first writer posts the batch and dies before saving its offsets ...
    LedgerWriter(settings, store).post_batch(_records(values), letters.append)
    # ... so a fresh writer (empty cache) gets the whole batch again, plus garbage.
    again = LedgerWriter(settings, store).post_batch(_records([*values, b"{oops"]), letters.append)

    assert again.postings == 0
    assert store.job_gpu_seconds() == {"job-a": 8 * 30 * 3600}
    assert [letter.stage for letter in letters] == ["ledger-writer"]
    assert letters[0].original_value() == b"{oops"


def test_a_fresh_writer_revises_entries_read_back_from_the_ledger_idle_time_included(
    settings: Settings, store: LedgerStore
) -> None:
    letters: list[DeadLetter] = []
    # One writer posts a job's first versions (its JobSubmitted not yet known) ...
    first = _job_entries("job-c", "olmo", 4, 6, submitted=False)
    LedgerWriter(settings, store).post_batch(_records(first), letters.append)
    # ... and one with an empty cache, as after a restart, revises them from what the ledger holds:
    # each reversal must cancel exactly what its version posted, idle time included.
    LedgerWriter(settings, store).post_batch(_records(_job_entries("job-c", "olmo", 4, 6)), letters.append)

    assert not letters
    assert store.job_gpu_seconds() == {"job-c": 4 * 6 * 3600}
    assert store.job_idle_units() == {"job-c": 4 * 6 * 3600 * 5_000}
    assert store.total_gpu_seconds("olmo") == 4 * 6 * 3600


def test_a_projection_that_lost_inserts_is_rebuilt_from_the_postings(
    settings: Settings, store: LedgerStore
) -> None:
    LedgerWriter(settings, store).post_batch(_records(_job_entries("job-b", "olmo", 4, 50)), lambda _: None)
    store.db.command("TRUNCATE TABLE {db}.usage_daily")  # as if the views' parts never landed
    store.db.command("TRUNCATE TABLE {db}.ledger_horizon")
    store.db.command("TRUNCATE TABLE {db}.usage_hourly")
    assert store.total_gpu_seconds() == 0 and store.charge_horizon() == store.closed_to() == 0

    report = store.reconcile()

    assert report.rebuilt
    assert store.total_gpu_seconds() == 4 * 50 * 3600
    assert store.charge_horizon() == store.closed_to() == T0 + 50 * 3600
    assert store.db.rows("SELECT sum(gpu_seconds) FROM {db}.usage_hourly")[0][0] == 4 * 50 * 3600
    assert store.reconcile().rebuilt is False


def test_balances_read_whole_days_from_the_daily_projection_exactly_as_clipping_every_piece(
    settings: Settings, store: LedgerStore
) -> None:
    day, hour = 86_400, 3600
    writer = LedgerWriter(settings, store)
    writer.post_batch(_records(_job_entries("job-d", "olmo", 8, 80)), lambda _: None)
    writer.post_batch(_records(_job_entries("job-e", "vision", 2, 50, start=T0 - 5 * hour)), lambda _: None)
    # Segments off midnight, inside one day, over several days, and a project without any.
    segments = {
        "olmo": [(T0 + 5 * hour + 17, T0 + 2 * day + 7 * hour), (T0 + 2 * day + 7 * hour, T0 + 10 * day)],
        "vision": [(T0 + day + hour, T0 + day + 2 * hour), (T0 - day, T0 + day)],
        "nobody": [(T0, T0 + day)],
    }
    now = store.closed_to()
    assert now == T0 + 80 * hour

    daily = store.charges_of(segments, now)
    assert daily == store.charges_of(segments, now, whole_days=False)
    secs = {p: [sum(r.gpu_seconds for r in daily[p].rows if r.start == s) for s, _ in segs]
            for p, segs in segments.items()}  # fmt: skip
    assert secs == {
        "olmo": [8 * (2 * day + 2 * hour - 17), 8 * (80 * hour - 2 * day - 7 * hour)],
        "vision": [2 * hour, 2 * (day + 5 * hour)],
        "nobody": [0],
    }
    assert (daily["olmo"].gpu_seconds, daily["vision"].gpu_seconds) == (8 * 80 * hour, 2 * 50 * hour)
    assert daily["nobody"].gpu_seconds == daily["nobody"].charge_units == 0

    # As of an instant before the ledger's last entry closed: only the entries closed by then.
    past = store.charges_of(segments, T0 + 10 * hour)
    assert sum(r.gpu_seconds for r in past["olmo"].rows) == 8 * (10 * hour - 5 * hour - 17)
    assert past["olmo"].gpu_seconds == 8 * 10 * hour


def test_the_usage_api_reports_gpu_hours_per_day_and_in_total(settings: Settings, store: LedgerStore) -> None:
    writer = LedgerWriter(settings, store)
    writer.post_batch(_records(_job_entries("job-c", "olmo", 8, 30, user="ada")), lambda _: None)
    writer.post_batch(_records(_job_entries("job-d", "olmo", 2, 5, user="bob")), lambda _: None)
    api_settings = with_tokens(settings.model_copy(update={"writer_enabled": False}))

    with TestClient(create_app(api_settings), headers=ADMIN) as client:
        body = client.get("/v1/projects/olmo/usage").json()
        by_user = client.get("/v1/projects/olmo/usage", params={"group_by": "user"}).json()
        one_day = client.get(
            "/v1/projects/olmo/usage", params={"from": "2026-01-02", "to": "2026-01-02"}
        ).json()
        missing = client.get("/v1/projects/nobody/usage")
        backwards = client.get("/v1/projects/olmo/usage", params={"from": "2026-01-05", "to": "2026-01-01"})
        bad_group = client.get("/v1/projects/olmo/usage", params={"group_by": "colour"})
        listed = client.get("/v1/projects").json()
        # Usage is private: no token, a lead of another project, the scheduler are all refused.
        anonymous = client.get("/v1/projects/olmo/usage", headers={"Authorization": ""})
        lead = client.get("/v1/projects/olmo/usage", params={"group_by": "user"}, headers=ALICE)
        lead_list = client.get("/v1/projects", headers=ALICE).json()
        scheduler = client.get("/v1/projects", headers=SCHEDULER)
        health = client.get("/healthz")
        docs = client.get("/openapi.json")

    assert body["total_gpu_seconds"] == 8 * 30 * 3600 + 2 * 5 * 3600
    assert body["total_gpu_hours"] == "250.0000"
    assert [d["day"] for d in body["days"]] == ["2026-01-01", "2026-01-02"]
    assert [d["gpu_seconds"] for d in body["days"]] == [(8 * 24 + 2 * 5) * 3600, 8 * 6 * 3600]
    assert {(d["day"], d["group"]): d["gpu_seconds"] for d in by_user["days"]} == {
        ("2026-01-01", "ada"): 8 * 24 * 3600,
        ("2026-01-01", "bob"): 2 * 5 * 3600,
        ("2026-01-02", "ada"): 8 * 6 * 3600,
    }
    assert one_day["total_gpu_seconds"] == 8 * 6 * 3600
    assert missing.status_code == 404 and "nobody" in missing.json()["detail"]
    assert listed == ["olmo"] and lead_list == []
    assert anonymous.status_code == 401 and "token" in anonymous.json()["detail"]
    assert lead.status_code == 404 and "olmo" in lead.json()["detail"]  # not declared: nobody leads it
    assert scheduler.status_code == 403
    assert backwards.status_code == 422 and "before" in backwards.json()["detail"]
    assert bad_group.status_code == 422
    assert health.status_code == 200 and health.json()["writer"] == "disabled"
    assert "/v1/projects/{project}/usage" in docs.json()["paths"]
    assert store.project_days("olmo") == (dt.date(2026, 1, 1), dt.date(2026, 1, 2))


def test_time_slice_use_reads_whole_hours_exactly_as_clipping_every_piece(
    settings: Settings, store: LedgerStore
) -> None:
    hour = 3600
    LedgerWriter(settings, store).post_batch(_records(_job_entries("job-g", "olmo", 4, 30)), lambda _: None)
    queries = DashboardQueries(store.db)
    end = store.charge_horizon()
    assert end == T0 + 30 * hour
    # Whole hours, a window off the hour (a zone at +05:30), one inside an hour, one past the end
    # of the ledger, one before it.
    windows = [
        (T0 + 2 * hour, T0 + 12 * hour),
        (T0 + 2 * hour + 1800, T0 + 4 * hour + 1800),
        (T0 + 5 * hour + 60, T0 + 5 * hour + 120),
        (T0 + 28 * hour + 600, T0 + 40 * hour),
        (T0 - 10 * hour, T0 + 1),
    ]

    used = queries.window_gpu_seconds("olmo", "c1", windows, end)

    assert used == queries._clipped("olmo", "c1", windows)
    assert used == [4 * 10 * hour, 4 * 2 * hour, 4 * 60, 4 * (2 * hour - 600), 4]
    assert queries.window_gpu_seconds("olmo", "other-cluster", windows, end) == [0] * len(windows)


def test_a_projects_squatting_version_moves_for_jobs_with_idle_samples_only(settings: Settings) -> None:
    """The sole writer's cache key for a project's squatting (`idle_version`): a submission alone
    leaves it (most jobs never idle: the page's cached answer stands), samples of an attributed
    job move it, and so does the attribution of a job whose samples came first."""
    from allmende.domain.gpu_utilisation import IdleRow, JobAttribution

    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    store = LedgerStore(db, sole_writer=True)
    version = store.idle_version("olmo")
    store.append_attributions([JobAttribution("quiet", "olmo", "u", "c")])
    assert store.idle_version("olmo") == version  # a job with no idle rows
    store.append_idle([IdleRow("early", "n1", 0, 30, 8, 0)])  # whose, not known yet
    assert store.idle_version("olmo") == version
    store.append_attributions([JobAttribution("early", "olmo", "u", "c")])
    assert store.idle_version("olmo") > version  # its samples count for olmo now
    version = store.idle_version("olmo")
    store.append_idle([IdleRow("quiet", "n2", 0, 30, 8, 0)])
    assert store.idle_version("olmo") > version
    assert [j for (j,) in db.rows("SELECT DISTINCT job_id FROM {db}.gpu_idle ORDER BY job_id")] == [
        "early",
        "quiet",
    ]
