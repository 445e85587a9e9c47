"""The ledger in chDB: idempotent migrations, redelivered batches, projection repair, the API."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient

from allmende.clickhouse import Database
from allmende.settings import Settings
from domain.metering import JobMeter
from schemas.dead_letter import DeadLetter
from schemas.events import JobFinished, JobStarted, JobSubmitted, JobUsageSample, PriorityClass
from schemas.ledger import encode_entries
from services.api.app import create_app
from services.ledger_store import LedgerStore
from services.ledger_writer import LedgerWriter
from tests.integration.budget_harness import ADMIN, ALICE, SCHEDULER, with_tokens

pytestmark = pytest.mark.integration

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def _job_entries(
    job_id: str, project: str, gpus: int, hours: int, user: str = "ada", submitted: bool = True
) -> list[bytes]:
    """Entry records for a job that ran `hours` with one sample per hour at 50 % utilisation
    (without its JobSubmitted: the unattributed first versions)."""
    common = {"producer": "test", "job_id": job_id}
    meter = JobMeter(job_id)
    submission = JobSubmitted(
        event_id=f"{job_id}:s",
        occurred_at=T0,
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
    meter.apply(JobStarted(event_id=f"{job_id}:st", occurred_at=T0, gpus=gpus, **common))
    for h in range(1, hours):
        meter.apply(
            JobUsageSample(
                event_id=f"{job_id}:u{h}",
                occurred_at=T0 + h * 3600,
                gpus_in_use=gpus,
                gpu_utilization=0.5,
                **common,
            )
        )
    meter.apply(
        JobFinished(event_id=f"{job_id}:f", occurred_at=T0 + hours * 3600, status="succeeded", **common)
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
    store.db.command("TRUNCATE TABLE {db}.usage_daily")  # as if the view's part never landed
    assert store.total_gpu_seconds() == 0

    report = store.reconcile()

    assert report.rebuilt
    assert store.total_gpu_seconds() == 4 * 50 * 3600
    assert store.reconcile().rebuilt is False


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
