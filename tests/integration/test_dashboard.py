"""The dashboard API on real Kafka and chDB: its numbers agree with the balance and the usage
routes, idle GPUs and squatting come from the metered utilisation, reads are private, CSV = JSON."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from allmende.core.settings import Settings
from allmende.schemas.events import (
    FinishStatus,
    JobEvent,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)
from allmende.testing.budget_harness import ADMIN, ALICE, BOB, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import MeterWorker, send_events, wait_until
from tests.integration.test_budgets import Q1_2027, QUARTER_PLAN, _meter_all

pytestmark = pytest.mark.integration
DAY = 86_400
HOUR = 3600


def _job(
    job: str, project: str, start: int, utilization: list[float], *, gpus: int = 4, user: str = "ada",
    cluster: str = "h100-a", gpu_type: str = "H100", every: int = 600,
) -> list[JobEvent]:  # fmt: skip
    """Submitted and started at `start`, one sample every `every` s with the given utilisations,
    finished at the last sample."""
    common = {"producer": "test", "job_id": job}
    end = start + every * len(utilization)
    events: list[JobEvent] = [
        JobSubmitted(
            event_id=f"{job}:sub", occurred_at=start, project=project, user=user, cluster=cluster,
            gpu_type=gpu_type, gpus=gpus, priority_class="standard", requested_seconds=end - start, **common,
        ),  # type: ignore[arg-type]
        JobStarted(event_id=f"{job}:start", occurred_at=start, gpus=gpus, **common),
    ]  # fmt: skip
    events += [
        JobUsageSample(
            event_id=f"{job}:u{i}",
            occurred_at=start + every * (i + 1),
            gpus_in_use=gpus,
            gpu_utilization=u,
            **common,
        )
        for i, u in enumerate(utilization)
    ]
    events.append(
        JobFinished(event_id=f"{job}:fin", occurred_at=end, status=FinishStatus.SUCCEEDED, **common)
    )
    return events


# olmo-ft: a busy job, a placeholder idle for 2 h (squatting), a job whose utilisation dips for
# 20 min and recovers (not squatting); vision: one busy job on the B300 cluster (no budget there).
JOBS = [
    *_job("busy", "olmo-ft", Q1_2027 + 2 * DAY, [0.9] * 12, gpus=8),
    *_job("parked", "olmo-ft", Q1_2027 + 3 * DAY, [0.01] * 12, user="squatter"),
    *_job("dip", "olmo-ft", Q1_2027 + 4 * DAY, [0.8, 0.02, 0.03, 0.7, 0.9, 0.9], user="bea"),
    *_job("vis", "vision", Q1_2027 + 5 * DAY, [0.5] * 6, gpus=2, cluster="b300-a", gpu_type="B300"),
]
NOW = Q1_2027 + 9 * DAY


def _idle_gpu_seconds_x10000(events: list[JobEvent]) -> int:
    """Idle units as the ledger defines them: each sample's span x GPUs x (1 - utilisation)."""
    total = 0
    last: dict[str, int] = {}
    for e in events:
        if isinstance(e, JobStarted):
            last[e.job_id] = e.occurred_at
        elif isinstance(e, JobUsageSample):
            span = e.occurred_at - last[e.job_id]
            total += e.gpus_in_use * span * (10_000 - round(e.gpu_utilization * 10_000))
            last[e.job_id] = e.occurred_at
    return total


def _csv_rows(api: Any, path: str, headers: dict[str, str], **params: Any) -> list[dict[str, str]]:
    response = api.get(path, params={**params, "format": "csv"}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.text)))


def _as_csv_cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    def cell(v: Any) -> str:
        return "" if v is None else ("true" if v is True else "false" if v is False else str(v))

    return [{k: cell(v) for k, v in row.items()} for row in rows]


def test_the_dashboards_agree_with_the_balance_and_usage_and_show_idle_gpus_and_squatting(
    settings: Settings, tmp_path: Path
) -> None:
    with running_api(settings, Q1_2027 + DAY) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        _meter_all(settings, JOBS, tmp_path / "logs", api.app.state.store)  # type: ignore[attr-defined]
        clock.now = NOW
        burn = ok(api.get("/v1/dashboard/projects/olmo-ft/burn", headers=ALICE))
        balance = ok(api.get("/v1/projects/olmo-ft/balance", headers=ALICE))
        usage = ok(api.get("/v1/projects/olmo-ft/usage", headers=ALICE))
        by_user = ok(
            api.get("/v1/dashboard/projects/olmo-ft/breakdown", params={"by": "user"}, headers=ALICE)
        )
        by_cluster = ok(
            api.get("/v1/dashboard/projects/olmo-ft/breakdown", params={"by": "cluster"}, headers=ADMIN)
        )
        squatting = ok(api.get("/v1/dashboard/projects/olmo-ft/squatting", headers=ALICE))
        no_squatting = ok(api.get("/v1/dashboard/projects/vision/squatting", headers=ADMIN))
        overview = ok(api.get("/v1/dashboard/overview", headers=ADMIN))
        lead_overview = ok(api.get("/v1/dashboard/overview", headers=ALICE))
        clusters = ok(api.get("/v1/dashboard/clusters/utilization", headers=ADMIN))
        slices = ok(api.get("/v1/dashboard/projects/olmo-ft/timeslices", headers=ALICE))
        periods = ok(api.get("/v1/dashboard/periods", headers=BOB))
        projects_of_bob = ok(api.get("/v1/dashboard/projects", headers=BOB))
        refused = {
            "other lead": api.get("/v1/dashboard/projects/olmo-ft/burn", headers=BOB),
            "no token": api.get("/v1/dashboard/overview"),
            "scheduler": api.get("/v1/dashboard/overview", headers=SCHEDULER),
            "bad token": api.get("/v1/dashboard/overview", headers={"Authorization": "Bearer nope"}),
        }
        csv_equals_json = {
            path: (
                _csv_rows(api, path, ADMIN, **params),
                ok(api.get(path, params=params, headers=ADMIN))["rows"],
            )
            for path, params in [
                ("/v1/dashboard/projects/olmo-ft/burn", {}),
                ("/v1/dashboard/projects/olmo-ft/breakdown", {"by": "priority_class"}),
                ("/v1/dashboard/projects/olmo-ft/squatting", {}),
                ("/v1/dashboard/projects/olmo-ft/timeslices", {}),
                ("/v1/dashboard/projects/olmo-ft/running", {}),
                ("/v1/dashboard/projects/olmo-ft/holds", {}),
                ("/v1/dashboard/projects/olmo-ft/preemptions", {}),
                ("/v1/dashboard/overview", {}),
                ("/v1/dashboard/clusters/utilization", {}),
                ("/v1/dashboard/periods", {}),
            ]
        }

    # The page's numbers are the balance's and the usage route's.
    lines = [a for a in balance["allocations"] if a["period"] == "2027-Q1"]
    assert Decimal(burn["allocated_gpu_hours"]) == sum(Decimal(a["allocated_gpu_hours"]) for a in lines)
    assert Decimal(burn["charged_gpu_hours"]) == Decimal(balance["total_charged_gpu_hours"])
    assert Decimal(burn["remaining_gpu_hours"]) == sum(Decimal(a["remaining_gpu_hours"]) for a in lines)
    assert sum(Decimal(d["gpu_hours"]) for d in burn["rows"]) == Decimal(usage["total_gpu_hours"])
    assert Decimal(burn["rows"][-1]["cumulative_charged_gpu_hours"]) == Decimal(burn["charged_gpu_hours"])
    assert burn["as_of"] == "2027-01-06T01:00:00Z"  # the ledger's clock: the last charged instant
    assert burn["holds_count_as_spent"] is True
    assert [f["basis"] for f in burn["forecasts"]] == ["period_to_date", "trailing_7d"]
    assert all(f["lasts_period"] for f in burn["forecasts"])  # 1,250 GPU-hours, a few dozen spent
    assert sum(Decimal(r["charged_gpu_hours"]) for r in by_user["rows"]) == Decimal(burn["charged_gpu_hours"])
    assert {r["key"] for r in by_user["rows"]} == {"ada", "squatter", "bea"}
    assert sum(Decimal(r["gpu_hours"]) for r in by_cluster["rows"]) == Decimal(usage["total_gpu_hours"])

    # Idle GPU-hours: exact, from the metered utilisation.
    olmo_jobs = [e for e in JOBS if e.job_id in ("busy", "parked", "dip")]
    want_idle = Decimal(_idle_gpu_seconds_x10000(olmo_jobs)) / 10_000 / HOUR
    idle_by_user = sum(Decimal(r["idle_gpu_hours"]) for r in by_user["rows"])
    assert idle_by_user == want_idle.quantize(Decimal("0.0001"))
    olmo_row = next(r for r in overview["rows"] if r["project"] == "olmo-ft")
    assert Decimal(olmo_row["idle_gpu_hours"]) == want_idle.quantize(Decimal("0.0001"))

    # Squatting: the placeholder (2 h under 5 %), not the job that dipped for 20 minutes.
    assert [r["job_id"] for r in squatting["rows"]] == ["parked"]
    assert no_squatting["rows"] == []  # a project with no idle piece at all
    parked = squatting["rows"][0]
    assert parked["user"] == "squatter" and Decimal(parked["idle_hours"]) == 2
    assert Decimal(parked["gpu_hours"]) == 8  # 4 GPUs x 2 h, what it has cost so far
    assert Decimal(parked["charged_gpu_hours"]) == 8  # H100 weight 1.00, standard 1.00

    # Overview and cluster utilisation.
    assert [r["project"] for r in overview["rows"]] == ["olmo-ft", "vision"]
    assert [r["project"] for r in lead_overview["rows"]] == ["olmo-ft"]
    used = {c: sum(Decimal(r["used_gpu_hours"]) for r in clusters["rows"] if r["cluster"] == c)
            for c in ("h100-a", "b300-a")}  # fmt: skip
    assert used == {"h100-a": Decimal(usage["total_gpu_hours"]), "b300-a": Decimal(2 * 1)}
    day2 = next(r for r in clusters["rows"] if r["cluster"] == "h100-a" and r["day"] == "2027-01-03")
    assert Decimal(day2["capacity_gpu_hours"]) == 64 * 24 and Decimal(day2["used_gpu_hours"]) == 16

    # Time slices: every nightly window up to as_of, each with its guarantee.
    assert slices["rows"] and all(r["agreement_id"] == "olmo-nightly" for r in slices["rows"])
    assert all(Decimal(r["guaranteed_gpu_hours"]) == 32 * 8 for r in slices["rows"][1:-1])

    # Access: only admins and the project's leads; every refusal says why.
    assert [p["period"] for p in periods["rows"]] == ["2027-Q1"]
    assert [p["project"] for p in projects_of_bob["rows"]] == ["vision"]
    assert {k: r.status_code for k, r in refused.items()} == {
        "other lead": 403, "no token": 401, "scheduler": 403, "bad token": 401,
    }  # fmt: skip
    assert all(r.json()["detail"] for r in refused.values())

    for path, (from_csv, from_json) in csv_equals_json.items():
        assert from_csv == _as_csv_cells(from_json), path


def test_the_squatting_rows_kept_between_reads_follow_every_new_posting_of_an_idle_job(
    settings: Settings, tmp_path: Path
) -> None:
    """The API keeps a project's squatting rows until a posting reaches one of its idle jobs: an
    idle hour is flagged as ongoing, and once the job is busy again and ends, the next read shows
    the whole job and the stretch over."""
    turns = _job("turns", "olmo-ft", Q1_2027 + 3 * DAY, [0.01] * 6 + [0.9] * 6, user="squatter")
    path = "/v1/dashboard/projects/olmo-ft/squatting"

    def flagged(ongoing: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = ok(api.get(path, headers=ALICE))["rows"]
        return rows if rows and rows[0]["ongoing"] is ongoing else []

    with running_api(settings, Q1_2027 + DAY) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        clock.now = NOW
        assert ok(api.get(path, headers=ALICE))["rows"] == []  # read (and kept) before any usage
        meter = MeterWorker(settings, tmp_path / "logs")
        try:
            meter.wait_ready()
            send_events(settings, turns[:8])  # submitted, started, an hour at 1 %
            first = wait_until(lambda: flagged(True), 90, "the idle hour flagged, ongoing")
            send_events(settings, turns[8:])  # an hour at 90 %, then the end
            later = wait_until(lambda: flagged(False), 90, "the job busy again and ended")
        finally:
            meter.kill()
    assert [r["job_id"] for r in first] == ["turns"] == [r["job_id"] for r in later]
    assert (Decimal(first[0]["gpu_hours"]), Decimal(first[0]["idle_hours"])) == (4, 1)
    assert (Decimal(later[0]["gpu_hours"]), Decimal(later[0]["idle_hours"])) == (8, 1)
