"""Budgets, charge policy and agreements on real Kafka and chDB, through the API process."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from kafka import KafkaProducer

from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.domain.allocations import UNITS_PER_GPU_HOUR
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND
from allmende.domain.metering import JobMeter
from allmende.schemas.admin_events import parse_admin_event
from allmende.schemas.events import (
    FinishStatus,
    JobEvent,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)
from allmende.testing.budget_harness import ADMIN, ALICE, BOB, ok, plan_text, running_api
from allmende.testing.harness import MeterWorker, read_topic, send_events, wait_until

pytestmark = pytest.mark.integration

Q1_2027 = 1_798_761_600  # 2027-01-01T00:00:00Z
NOW = Q1_2027 + 10 * 86_400

QUARTER_PLAN = """
plan: institute-2027-q1
period: 2027-Q1
clusters:
  - {name: h100-a, gpu_type: H100, gpus: 64}
  - {name: b300-a, gpu_type: B300, gpus: 16}
organisation:
  - {id: institute, kind: organisation, shares: 100, leads: [dana]}
  - {id: nlp, parent: institute, kind: group, shares: 60}
  - {id: olmo-ft, parent: nlp, kind: project, shares: 10, leads: [alice]}
  - {id: vision, parent: institute, kind: project, shares: 40, leads: [bob]}
policy:
  id: prices-2027-q1
  gpu_type_weights: {H100: 1.00, B300: 2.50}
  priority_multipliers: {preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}
allocations:
  - {project: olmo-ft, gpu_hours: 1000}
  - {project: olmo-ft, gpu_hours: 250.5, cluster: b300-a}
  - {project: vision, gpu_hours: 500}
agreements:
  - id: olmo-nightly
    project: olmo-ft
    cluster: h100-a
    gpus: 32
    weekly: {days: [mon, tue, wed, thu, fri], start: "22:00", hours: 8, time_zone: Europe/Berlin}
"""


def _run(
    job: str, project: str, *, start: int, end: int, gpus: int = 4, cluster: str = "h100-a",
    gpu_type: str = "H100", every: int = 600, priority: str = "standard",
) -> list[JobEvent]:  # fmt: skip
    """A job's events: submitted and started at `start`, a sample every `every` s, finished at `end`."""
    common = {"producer": "test", "job_id": job}
    events: list[JobEvent] = [
        JobSubmitted(
            event_id=f"{job}:sub", occurred_at=start, project=project, user="ada", cluster=cluster,
            gpu_type=gpu_type, gpus=gpus, priority_class=priority, requested_seconds=end - start, **common,
        ),  # type: ignore[arg-type]
        JobStarted(event_id=f"{job}:start", occurred_at=start, gpus=gpus, **common),
    ]  # fmt: skip
    events += [
        JobUsageSample(event_id=f"{job}:u{t}", occurred_at=t, gpus_in_use=gpus, gpu_utilization=0.9, **common)
        for t in range(start + every, end, every)
    ]
    events.append(
        JobFinished(event_id=f"{job}:fin", occurred_at=end, status=FinishStatus.SUCCEEDED, **common)
    )
    return events


def _line(balance: dict[str, object], allocation_id: str) -> dict[str, object]:
    lines = balance["allocations"]
    assert isinstance(lines, list)
    return next(line for line in lines if line["allocation_id"] == allocation_id)


def test_a_plan_applied_twice_gives_one_set_of_allocations(settings: Settings) -> None:
    with running_api(settings, NOW) as (api, _):
        text = plan_text(QUARTER_PLAN)
        preview = ok(api.post("/v1/admin/plan/diff", json={"text": text}, headers=ADMIN))
        assert {(c["action"], c["target"]) for c in preview["changes"]} >= {
            ("grant", "allocation olmo-ft/2027-Q1"),
            ("grant", "allocation olmo-ft/2027-Q1/b300-a"),
            ("grant", "agreement olmo-nightly"),
            ("declare", "policy prices-2027-q1"),
        }
        assert ok(api.get("/v1/admin/organisation", headers=ADMIN))["nodes"] == []  # a diff changes nothing

        first = ok(api.post("/v1/admin/plan/apply", json={"text": text}, headers=ADMIN))
        second = ok(api.post("/v1/admin/plan/apply", json={"text": text}, headers=ADMIN))
        assert len(first["changes"]) == len(preview["changes"])
        assert second["changes"] == []

        on_log = [parse_admin_event(v) for v in read_topic(settings, settings.admin_events_topic, 100, 5)]
        assert len(on_log) == len(first["changes"])
        balance = ok(api.get("/v1/projects/olmo-ft/balance", headers=ADMIN))
        assert sorted(line["allocation_id"] for line in balance["allocations"]) == [
            "olmo-ft/2027-Q1", "olmo-ft/2027-Q1/b300-a",
        ]  # fmt: skip
        assert Decimal(_line(balance, "olmo-ft/2027-Q1/b300-a")["allocated_gpu_hours"]) == Decimal("250.5")  # type: ignore[arg-type]

        # Changing the amount in the file adjusts; dropping an allocation revokes it.
        changed = text.replace("gpu_hours: 1000", "gpu_hours: 1200").replace(
            "  - {project: vision, gpu_hours: 500}\n", ""
        )
        third = ok(api.post("/v1/admin/plan/apply", json={"text": changed}, headers=ADMIN))
        assert {(c["action"], c["target"]) for c in third["changes"]} == {
            ("adjust", "allocation olmo-ft/2027-Q1"),
            ("revoke", "allocation vision/2027-Q1"),
        }
        assert Decimal(_line(ok(api.get("/v1/projects/vision/balance", headers=ADMIN)), "vision/2027-Q1")[
            "allocated_gpu_hours"]) == 0  # type: ignore[arg-type]  # fmt: skip


def test_leads_read_their_own_projects_and_only_admins_change_budgets(settings: Settings) -> None:
    with running_api(settings, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        assert api.get("/v1/projects/olmo-ft/balance", headers=ALICE).status_code == 200
        assert api.get("/v1/projects/olmo-ft/balance", headers=BOB).status_code == 403
        assert api.get("/v1/projects/olmo-ft/balance").status_code == 401
        refused = api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ALICE)
        assert refused.status_code == 403
        history = ok(api.get("/v1/projects/olmo-ft/history", headers=ALICE))
        assert {e["type"] for e in history} >= {"NodeDeclared", "AllocationGranted", "AgreementGranted"}
        assert all(e["actor"] == "root" for e in history)


def test_a_transfer_moves_hours_exactly_and_never_more_than_is_available(settings: Settings) -> None:
    with running_api(settings, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        before = [
            Decimal(
                _line(ok(api.get(f"/v1/projects/{p}/balance", headers=ADMIN)), f"{p}/2027-Q1")[
                    "allocated_gpu_hours"
                ]
            )  # type: ignore[arg-type]
            for p in ("olmo-ft", "vision")
        ]
        body = {
            "from_allocation": "olmo-ft/2027-Q1",
            "to_allocation": "vision/2027-Q1",
            "gpu_hours": "12.345",
        }
        key = {"Idempotency-Key": "transfer-1"}
        moved = ok(api.post("/v1/admin/transfers", json=body, headers={**ADMIN, **key}))
        retried = ok(api.post("/v1/admin/transfers", json=body, headers={**ADMIN, **key}))
        assert len(moved["applied"]) == 1 and retried["applied"] == [] and len(retried["unchanged"]) == 1
        after = [
            _line(ok(api.get(f"/v1/projects/{p}/balance", headers=ADMIN)), f"{p}/2027-Q1")
            for p in ("olmo-ft", "vision")
        ]
        assert Decimal(after[0]["allocated_gpu_hours"]) == before[0] - Decimal("12.345")  # type: ignore[arg-type]
        assert Decimal(after[1]["allocated_gpu_hours"]) == before[1] + Decimal("12.345")  # type: ignore[arg-type]
        assert after[0]["allocated_units"] + after[1]["allocated_units"] == 1500 * UNITS_PER_GPU_HOUR  # type: ignore[operator]

        too_much = {**body, "gpu_hours": "100000"}
        refused = api.post("/v1/admin/transfers", json=too_much, headers=ADMIN)
        assert refused.status_code == 409 and refused.json()["code"] == "insufficient-budget"


def test_an_agreement_that_would_overbook_a_cluster_is_refused_naming_the_conflicts(
    settings: Settings,
) -> None:
    with running_api(settings, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        # Monday 2027-01-11 23:00 Berlin is inside olmo-nightly (32 of 64 GPUs).
        monday_night = {"kind": "fixed", "start": 1_799_704_800 + 3600, "end": 1_799_704_800 + 7200}
        body = {"agreement_id": "vision-demo", "project": "vision", "cluster": "h100-a", "gpus": 40,
                "window": monday_night}  # fmt: skip
        refused = api.post("/v1/admin/agreements", json=body, headers=ADMIN)
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "overbooked" and refused.json()["conflicting"] == ["olmo-nightly"]

        ok(api.post("/v1/admin/agreements", json={**body, "gpus": 32}, headers=ADMIN))  # exactly full: fine
        ok(api.post("/v1/admin/agreements/olmo-nightly/revocation", json={"reason": "moved"}, headers=ADMIN))
        refused_again = api.post("/v1/admin/agreements", json={**body, "agreement_id": "v2"}, headers=ADMIN)
        assert refused_again.status_code == 409 and refused_again.json()["conflicting"] == ["vision-demo"]


def test_charges_follow_the_policy_in_force_at_the_time_of_use(settings: Settings, tmp_path: Path) -> None:
    t0 = Q1_2027 + 3 * 86_400
    change = t0 + 1800
    with running_api(settings, NOW) as (api, _):
        store = api.app.state.store  # type: ignore[attr-defined]
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        dearer = {
            "policy_id": "prices-dearer", "effective_from": change,
            "gpu_type_weights": {"H100": "1.00", "B300": "2.50"},
            "priority_multipliers": {"preemptible": "0.50", "standard": "2.00", "non-preemptible": "4.00"},
            "reason": "demand is three times supply",
        }  # fmt: skip
        ok(api.post("/v1/admin/policies", json=dearer, headers=ADMIN))
        meter = MeterWorker(settings, tmp_path / "logs")
        try:
            meter.wait_ready()
            # 4 H100 from t0 to t0+3600: the first half hour at 1.00, the second at 2.00 (standard);
            # 2 B300 non-preemptible across the change: 2.50 x 2.00, then 2.50 x 4.00.
            send_events(settings, _run("job-a", "olmo-ft", start=t0, end=t0 + 3600))
            job_b = _run("job-b", "olmo-ft", start=t0 + 600, end=t0 + 2400, gpus=2, cluster="b300-a",
                         gpu_type="B300", priority="non-preemptible")  # fmt: skip
            send_events(settings, job_b)
            expected_seconds = 4 * 3600 + 2 * 1800
            wait_until(
                lambda: store.project_charges("olmo-ft", 2**40)[1] == expected_seconds, 90, "usage posted"
            )
        finally:
            meter.kill()
        units = CHARGE_UNITS_PER_GPU_SECOND
        job_a = 4 * 1800 * units + 4 * 1800 * 2 * units
        job_b = 2 * 1200 * units * 5 + 2 * 600 * units * 10
        balance = ok(api.get("/v1/projects/olmo-ft/balance", headers=ALICE))
        assert _line(balance, "olmo-ft/2027-Q1")["charged_units"] == job_a
        assert (
            _line(balance, "olmo-ft/2027-Q1/b300-a")["charged_units"] == job_b
        )  # the B300 allocation is more specific
        assert balance["total_gpu_seconds"] == expected_seconds and balance["over_budget_units"] == 0
        by_policy = dict(
            store.db.rows(
                "SELECT policy_id, sum(charge_units) FROM {db}.ledger_postings"
                " WHERE kind != 'revision' GROUP BY 1"
            )
        )
        assert by_policy == {"prices-2027-q1": 4 * 1800 * units + 2 * 1200 * units * 5,
                             "prices-dearer": 4 * 1800 * 2 * units + 2 * 600 * units * 10}  # fmt: skip

        # Past charges are never rewritten: a policy starting before charged usage is refused.
        late = {**dearer, "policy_id": "prices-retro", "effective_from": t0 + 600}
        refused = api.post("/v1/admin/policies", json=late, headers=ADMIN)
        assert refused.status_code == 409 and refused.json()["code"] == "retroactive-policy"


def _tagged(settings: Settings, tag: str, tmp_path: Path) -> Settings:
    return settings.model_copy(
        update={
            "clickhouse_database": tag, "topic_prefix": tag, "meter_app_id": f"{tag}-meter",
            "meter_data_dir": tmp_path / tag, "writer_group": f"{tag}-writer",
        }
    )  # fmt: skip


def _meter_all(settings: Settings, events: list[JobEvent], logs: Path, store: LedgerStore) -> None:
    """Meter `events` with a real worker and wait until the ledger holds all their GPU time."""
    meter = MeterWorker(settings, logs)
    before = store.total_gpu_seconds()
    try:
        meter.wait_ready()
        send_events(settings, events)
        meters: dict[str, JobMeter] = {}
        for e in events:
            meters.setdefault(e.job_id, JobMeter(e.job_id)).apply(e)
        want = sum(m.gpu_seconds() for m in meters.values())
        wait_until(lambda: store.total_gpu_seconds() == before + want, 90, f"{want} more GPU-s posted")
    finally:
        meter.kill()


def test_the_balance_as_of_a_past_instant_equals_a_replay_of_the_events_up_to_then(
    settings: Settings, tmp_path: Path
) -> None:
    day = 86_400
    jobs = [
        *_run("job-a", "olmo-ft", start=Q1_2027 + 2 * day, end=Q1_2027 + 2 * day + 7200),
        *_run("job-b", "olmo-ft", start=Q1_2027 + 3 * day, end=Q1_2027 + 3 * day + 3600, gpus=2,
              cluster="b300-a", gpu_type="B300"),
        *_run("job-c", "olmo-ft", start=Q1_2027 + 6 * day, end=Q1_2027 + 6 * day + 7200),
    ]  # fmt: skip
    x = Q1_2027 + 4 * day + 12 * 3600
    jobs += _run("job-d", "olmo-ft", start=x - 1800, end=x + 1800, gpus=8)  # runs across the instant
    full = _tagged(settings, f"{settings.topic_prefix}a", tmp_path)
    with running_api(full, Q1_2027 + day) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        clock.now = Q1_2027 + 4 * day
        adjust = {"delta_gpu_hours": "-100", "reason": "returned to the pool"}
        ok(api.post("/v1/admin/allocations/olmo-ft/2027-Q1/adjustments", json=adjust, headers=ADMIN))
        _meter_all(full, jobs, tmp_path / "logs-a", api.app.state.store)  # type: ignore[attr-defined]
        clock.now = Q1_2027 + 7 * day
        move = {"from_allocation": "olmo-ft/2027-Q1", "to_allocation": "vision/2027-Q1", "gpu_hours": "5"}
        ok(api.post("/v1/admin/transfers", json=move, headers=ADMIN))
        as_of_x = ok(api.get("/v1/projects/olmo-ft/balance", params={"as_of": x}, headers=ADMIN))
        now = ok(api.get("/v1/projects/olmo-ft/balance", headers=ADMIN))
        admin_log = read_topic(full, full.admin_events_topic, 100, 5)

    replayed = _tagged(settings, f"{settings.topic_prefix}b", tmp_path)
    with running_api(replayed, x) as (api, _):
        up_to_x = [raw for raw in admin_log if parse_admin_event(raw).occurred_at <= x]
        producer = KafkaProducer(bootstrap_servers=replayed.kafka_bootstrap_servers, acks="all")
        for raw in up_to_x:
            producer.send(replayed.admin_events_topic, value=raw, partition=0)
        producer.flush()
        producer.close()
        _meter_all(replayed, [e for e in jobs if e.occurred_at <= x], tmp_path / "logs-b",
                   api.app.state.store)  # type: ignore[attr-defined]  # fmt: skip
        rebuilt = ok(api.get("/v1/projects/olmo-ft/balance", headers=ADMIN))

    assert rebuilt == as_of_x
    assert 0 < as_of_x["total_charged_units"] < now["total_charged_units"]  # the instant cut something off
    assert (
        _line(as_of_x, "olmo-ft/2027-Q1")["allocated_units"] == 900 * UNITS_PER_GPU_HOUR
    )  # adjusted, not moved
    assert _line(now, "olmo-ft/2027-Q1")["allocated_units"] == 895 * UNITS_PER_GPU_HOUR


def test_allocations_expire_after_their_period_forfeiting_or_rolling_over_what_is_unused(
    settings: Settings, tmp_path: Path
) -> None:
    vision = "{project: vision, gpu_hours: 500"
    text = plan_text(QUARTER_PLAN).replace(vision + "}", vision + ", rollover: true}")
    q2 = Q1_2027 + 90 * 86_400
    with running_api(settings, NOW) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": text}, headers=ADMIN))
        store = api.app.state.store  # type: ignore[attr-defined]
        _meter_all(settings, _run("job-a", "olmo-ft", start=NOW - 7200, end=NOW), tmp_path / "logs", store)
        wait_until(lambda: api.get("/healthz").json()["writer_caught_up"], 30, "writer caught up")

        clock.now = q2 + 2 * 86_400  # long ended, but the ledger has not reached the end yet
        assert ok(api.post("/v1/admin/expiry", headers=ADMIN))["applied"] == []
        _meter_all(settings, _run("job-q2", "vision", start=q2, end=q2 + 600), tmp_path / "logs-2", store)
        wait_until(lambda: api.get("/healthz").json()["writer_caught_up"], 30, "writer caught up")
        clock.now = q2 + 3600  # ended, and the ledger is past the end, but within the grace
        assert ok(api.post("/v1/admin/expiry", headers=ADMIN))["applied"] == []
        clock.now = q2 + 2 * 86_400
        expired = ok(api.post("/v1/admin/expiry", headers=ADMIN))["applied"]
        assert {e["data"]["allocation_id"] for e in expired} == {
            "olmo-ft/2027-Q1", "olmo-ft/2027-Q1/b300-a", "vision/2027-Q1",
        }  # fmt: skip
        assert ok(api.post("/v1/admin/expiry", headers=ADMIN))["applied"] == []  # once

        olmo = _line(ok(api.get("/v1/projects/olmo-ft/balance", headers=ADMIN)), "olmo-ft/2027-Q1")
        charged = 4 * 7200 * CHARGE_UNITS_PER_GPU_SECOND
        assert olmo["expired"] and olmo["charged_units"] == charged and olmo["remaining_units"] == 0
        assert Decimal(olmo["forfeited_gpu_hours"]) == Decimal(1000) - Decimal(8)  # type: ignore[arg-type]
        rolled = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        successor = _line(rolled, "vision/2027-Q1+2027-Q2")
        assert successor["period"] == "2027-Q2" and successor["allocated_units"] == 500 * UNITS_PER_GPU_HOUR
        assert Decimal(_line(rolled, "vision/2027-Q1")["forfeited_gpu_hours"]) == 0  # type: ignore[arg-type]


def test_usage_of_a_project_without_a_budget_is_shown_as_over_budget(
    settings: Settings, tmp_path: Path
) -> None:
    with running_api(settings, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        # Declared in the tree (the meter refuses a project the plan does not know), never granted.
        node = {"node_id": "stealth", "kind": "project", "parent": "institute", "shares": 1}
        ok(api.post("/v1/admin/nodes", json=node, headers=ADMIN))
        _meter_all(settings, _run("job-x", "stealth", start=NOW - 3600, end=NOW), tmp_path / "logs",
                   api.app.state.store)  # type: ignore[attr-defined]  # fmt: skip
        balance = ok(api.get("/v1/projects/stealth/balance", headers=ADMIN))
        assert balance["allocations"] == []
        assert (
            balance["over_budget_units"]
            == balance["unallocated_units"]
            == 4 * 3600 * CHARGE_UNITS_PER_GPU_SECOND
        )
        assert api.get("/v1/projects/stealth/balance", headers=ALICE).status_code == 403  # not her project
        assert api.get("/v1/projects/nobody/balance", headers=ADMIN).status_code == 404


def test_a_preview_shows_every_refusal_with_its_line_and_a_reused_key_is_a_conflict(
    settings: Settings,
) -> None:
    with running_api(settings, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        greedy = plan_text(QUARTER_PLAN) + (
            "  - id: vision-all-week\n    project: vision\n    cluster: h100-a\n    gpus: 40\n"
            "    fixed: {start: 2027-01-04T00:00:00Z, end: 2027-01-11T00:00:00Z}\n"
        )
        refused = api.post("/v1/admin/plan/diff", json={"text": greedy}, headers=ADMIN)
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["problems"]
        line = next(i for i, text in enumerate(greedy.splitlines(), 1) if "vision-all-week" in text)
        assert problem["line"] == line and problem["field"] == "agreements.1"
        assert "olmo-nightly" in problem["message"]  # the conflicting agreement is named

        body = {"delta_gpu_hours": "1", "reason": "a favour"}
        key = {**ADMIN, "Idempotency-Key": "adjust-1"}
        ok(api.post("/v1/admin/allocations/vision/2027-Q1/adjustments", json=body, headers=key))
        again = ok(api.post("/v1/admin/allocations/vision/2027-Q1/adjustments", json=body, headers=key))
        assert again["applied"] == [] and len(again["unchanged"]) == 1
        other = {**body, "delta_gpu_hours": "50"}
        reused = api.post("/v1/admin/allocations/vision/2027-Q1/adjustments", json=other, headers=key)
        assert reused.status_code == 409 and "idempotency key" in reused.json()["detail"]
