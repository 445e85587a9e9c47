"""The admission service on real Kafka and chDB: lanes, holds, time slices, preemption, restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from allmende.core.replay import make_producer
from allmende.core.settings import Settings
from allmende.domain.allocations import UNITS_PER_GPU_HOUR
from allmende.schemas.admission_events import (
    AdmissionDecided,
    HoldPlaced,
    HoldReleased,
    parse_admission_event,
)
from allmende.schemas.events import JobEvent, JobStarted, JobSubmitted
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id
from allmende.testing.budget_harness import ADMIN, ALICE, SCHEDULER, live_api, ok, plan_text, running_api
from allmende.testing.harness import MeterWorker, read_topic, send_events, wait_until
from tests.integration.test_budgets import _run

pytestmark = pytest.mark.integration
AdmissionEventsOfJob = (AdmissionDecided, HoldPlaced, HoldReleased)

Q1 = 1_798_761_600  # 2027-01-01T00:00:00Z
MONDAY_NIGHT = 1_799_708_400  # Monday 2027-01-11 23:00 UTC, midnight in Berlin: the nightly window
TUESDAY_NOON = 1_799_755_200  # Tuesday 2027-01-12 12:00 UTC: outside the nightly window
DAY = 86_400

PLAN = """
plan: admission-2027-q1
period: 2027-Q1
clusters:
  - {name: h100-a, gpu_type: H100, gpus: 64}
organisation:
  - {id: institute, kind: organisation, shares: 100}
  - {id: olmo-ft, parent: institute, kind: project, shares: 60, leads: [alice]}
  - {id: vision, parent: institute, kind: project, shares: 40}
  - {id: broke, parent: institute, kind: project, shares: 10}
policy:
  id: prices
  gpu_type_weights: {H100: 1.00}
  priority_multipliers: {preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}
  interactive_rate: 1.25
allocations:
  - {project: olmo-ft, gpu_hours: 10000}
  - {project: vision, gpu_hours: 500}
  - {project: broke, gpu_hours: 1}
agreements:
  - id: olmo-nightly
    project: olmo-ft
    cluster: h100-a
    gpus: 32
    weekly: {days: [mon, tue, wed, thu, fri], start: "22:00", hours: 8, time_zone: Europe/Berlin}
"""


def _job(job_id: str, project: str, gpus: int, hours: float = 1, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "project": project, "user": "ada", "cluster": "h100-a", "gpu_type": "H100",
            "gpus": gpus, "requested_hours": hours, **extra}  # fmt: skip


def _ask(api: Any, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = ok(
        api.post(
            "/v1/admission", json=body, params={"dry_run": dry_run} if dry_run else None, headers=SCHEDULER
        )
    )
    return result


def _started(job_id: str, project: str, gpus: int, at: int, hosts: tuple[str, ...]) -> list[JobEvent]:
    common = {"producer": "test", "job_id": job_id}
    return [
        JobSubmitted(event_id=f"{job_id}:sub", occurred_at=at, project=project, user="ada", cluster="h100-a",
                     gpu_type="H100", gpus=gpus, priority_class="standard", requested_seconds=3600,
                     **common),  # type: ignore[arg-type]
        JobStarted(event_id=f"{job_id}:start", occurred_at=at, gpus=gpus, hosts=hosts, **common),
    ]  # fmt: skip


def test_each_lane_admits_what_it_should_and_says_why(settings: Settings) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))

        budget = _ask(api, _job("v1", "vision", 8, hours=2))
        assert (budget["verdict"], budget["lane"]) == ("admit", "budget")
        assert budget["held_gpu_hours"] == budget["expected_gpu_hours"] == "16.000000000"
        assert budget["balance_before_gpu_hours"] == "500.000000000"
        assert budget["balance_after_gpu_hours"] == "484.000000000"
        assert _ask(api, _job("v1", "vision", 8, hours=2)) == budget  # the same job: the same answer

        refused = _ask(api, _job("b1", "broke", 8, hours=2))
        assert refused["verdict"] == "reject" and refused["reasons"][0]["code"] == "over-budget"
        assert "broke" in refused["sentence"] and "preemptible" in refused["sentence"]

        idle = _ask(api, _job("b2", "broke", 40, hours=2, priority_class="preemptible"))
        assert (idle["verdict"], idle["lane"]) == ("admit", "opportunistic")  # 56 GPUs idle
        assert idle["held_gpu_hours"] == "0E-9" or float(idle["held_gpu_hours"]) == 0

        # 48 of 64 GPUs are taken: an interactive session takes its 4 at once...
        interactive = _ask(api, _job("i1", "olmo-ft", 4, interactive=True))
        assert (interactive["verdict"], interactive["lane"]) == ("admit", "interactive")
        assert interactive["charge_rate_per_gpu_hour"] == "1.250000000"
        # ... and a big budget job pushes the opportunistic work out.
        big = _ask(api, _job("o1", "olmo-ft", 40))
        assert (big["verdict"], big["lane"]) == ("admit", "budget")
        assert [v["job_id"] for v in big["preempt"]] == ["b2"]

        # Inside the nightly window olmo-ft's guarantee beats vision's budget job.
        clock.now = MONDAY_NIGHT
        nightly = _ask(api, _job("o2", "olmo-ft", 24, priority_class="non-preemptible"), dry_run=True)
        assert (nightly["verdict"], nightly["lane"]) == ("admit", "time-slice")
        assert nightly["charge_rate_per_gpu_hour"] == "2.000000000"  # HIGH is a price

        full = _ask(api, _job("v2", "vision", 24, priority_class="non-preemptible"))
        assert full["verdict"] == "queue" and full["reasons"][0]["code"] == "cluster-full"


def test_fifty_concurrent_admissions_never_overspend_a_nearly_spent_budget(settings: Settings) -> None:
    with live_api(settings, TUESDAY_NOON) as (url, _):
        ok(
            httpx.post(
                f"{url}/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN, timeout=30
            )
        )
        first = ok(
            httpx.post(f"{url}/v1/admission", json=_job("v0", "vision", 8, hours=61), headers=SCHEDULER)
        )
        assert first["verdict"] == "admit"  # 488 of 500 GPU-hours held: 12 left

        async def burst() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(base_url=url, headers=SCHEDULER, timeout=30) as client:
                responses = await asyncio.gather(
                    *(
                        client.post("/v1/admission", json=_job(f"v{i}", "vision", 1, hours=1))
                        for i in range(1, 51)
                    )
                )
            return [ok(r) for r in responses]

        answers = asyncio.run(burst())
        admitted = [a for a in answers if a["verdict"] == "admit"]
        assert len(admitted) == 12 and all(a["lane"] == "budget" for a in admitted)
        assert {a["reasons"][0]["code"] for a in answers if a["verdict"] != "admit"} == {"over-budget"}
        balance = ok(httpx.get(f"{url}/v1/projects/vision/balance", headers=ADMIN))
        line = balance["allocations"][0]
        assert line["held_units"] == 500 * UNITS_PER_GPU_HOUR and line["remaining_units"] == 0


def test_time_slice_windows_follow_local_time_across_a_dst_change_and_recur_weekly(
    settings: Settings,
) -> None:
    # Europe/Berlin moves to summer time on 2027-03-28: 22:00 local is 21:00 UTC before, 20:00 after.
    before_change = 1_805_745_600  # Monday 2027-03-22 20:00 UTC = 21:00 CET: not yet
    cases = [
        (before_change, "budget"),
        (before_change + 3600 + 1800, "time-slice"),  # 22:30 CET
        (before_change + 7 * DAY, "time-slice"),  # Monday 03-29 20:00 UTC = 22:00 CEST: just open
        (before_change + 7 * DAY - 60, "budget"),  # 21:59 CEST
        (before_change + 7 * DAY + 8 * 3600 - 1, "time-slice"),  # the last second of the 8 hours
        (before_change + 7 * DAY + 8 * 3600, "budget"),
        (before_change + 5 * DAY + 3600 + 1800, "budget"),  # Saturday night: not a listed day
    ]
    with running_api(settings, Q1 + DAY) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        lanes = []
        for at, _ in cases:
            clock.now = at
            lanes.append(_ask(api, _job("o-night", "olmo-ft", 16), dry_run=True)["lane"])
    assert lanes == [lane for _, lane in cases]


def test_an_unhealthy_host_makes_every_job_on_it_a_victim_whatever_its_class(settings: Settings) -> None:
    with running_api(settings, MONDAY_NIGHT) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        jobs = [
            ("guaranteed", "olmo-ft", 16, "standard", ("h1",)),
            ("precious", "vision", 8, "non-preemptible", ("h1", "h2")),
            ("scavenger", "broke", 8, "preemptible", ("h3",)),
        ]
        for job_id, project, gpus, priority, hosts in jobs:
            decided = _ask(api, _job(job_id, project, gpus, priority_class=priority))
            assert decided["verdict"] == "admit", decided
            send_events(settings, _started(job_id, project, gpus, MONDAY_NIGHT - 600, hosts))
        service = api.app.state.admission  # type: ignore[attr-defined]
        wait_until(lambda: all(service.state.jobs[j].started for j, *_ in jobs), 30, "jobs seen running")

        calm = ok(api.post("/v1/preemption/plan", json={"cluster": "h100-a", "gpus": 8}, headers=SCHEDULER))
        assert [v["job_id"] for v in calm["victims"]] == ["scavenger"]  # the guarantee and HIGH are safe

        broken = {"cluster": "h100-a", "host": "h1", "healthy": False, "reason": "ECC errors"}
        ok(api.post("/v1/hosts/health", json=broken, headers=SCHEDULER))
        plan = ok(api.post("/v1/preemption/plan", json={"cluster": "h100-a", "gpus": 0}, headers=SCHEDULER))
        assert {v["job_id"]: v["code"] for v in plan["victims"]} == {
            "guaranteed": "unhealthy-host", "precious": "unhealthy-host",
        }  # fmt: skip
        assert plan["gpus_freed"] == 24
        more = ok(api.post("/v1/preemption/plan", json={"cluster": "h100-a", "gpus": 30}, headers=SCHEDULER))
        assert [v["job_id"] for v in more["victims"]][-1] == "scavenger" and more["enough"]


def test_a_rebuilt_service_answers_as_the_one_before_it(settings: Settings) -> None:
    asks = [_job("r1", "vision", 16, hours=10), _job("r2", "olmo-ft", 40), _job("r3", "broke", 4)]
    probe = _job("r4", "vision", 16, hours=20)
    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        before = [_ask(api, body) for body in asks]
        what_if = _ask(api, probe, dry_run=True)
    with running_api(settings, TUESDAY_NOON) as (api, _):
        again = [ok(api.get(f"/v1/admission/{body['job_id']}", headers=SCHEDULER)) for body in asks]
        assert again == before
        assert [_ask(api, body) for body in asks] == before  # asked again: no second hold
        assert _ask(api, probe, dry_run=True) == what_if
        balance = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        assert balance["allocations"][0]["held_units"] == 16 * 10 * 3600 * 10**6


def test_a_decision_the_log_did_not_take_is_no_answer_has_no_effect_and_is_decided_afresh(
    settings: Settings,
) -> None:
    asked, unasked = _job("k1", "vision", 8, hours=2), _job("k2", "vision", 4, hours=1)
    queued = _job("q1", "vision", 8)  # the cluster is full by then: a queue verdict

    def held(api: Any) -> int:
        return int(ok(api.get("/v1/projects/vision/balance", headers=ADMIN))["allocations"][0]["held_units"])

    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        _ask(api, _job("fill", "olmo-ft", 52, priority_class="non-preemptible"))
        log = api.app.state.admission._log  # the group commit onto the admission log
        api.portal.call(log.stop)  # from here on the log takes nothing, as with Kafka away
        for body in (asked, unasked, queued, asked, queued, queued):
            refused = api.post("/v1/admission", json=body, headers=SCHEDULER)
            assert refused.status_code == 503 and refused.json()["code"] == "not-recorded", refused.text
            assert "ask again with the same job id" in refused.json()["detail"]
            assert refused.headers["retry-after"] == "1"
        assert api.get("/v1/admission/k1", headers=SCHEDULER).status_code == 404  # not recorded: not shown
        assert held(api) == 0  # no effect: no hold, no GPUs taken

        async def kafka_back() -> None:
            log.start()

        api.portal.call(kafka_back)
        answer = _ask(api, asked)  # asked again: decided afresh, now recorded
        assert (answer["attempt"], answer["verdict"]) == (1, "admit")
        queue = _ask(api, queued)  # the refused asks took no GPUs: 4 left, 8 asked
        assert (queue["attempt"], queue["verdict"]) == (1, "queue")
        assert api.get("/v1/admission/k2", headers=SCHEDULER).status_code == 404  # not asked again: nothing
        assert held(api) == 8 * 2 * 3600 * 10**6  # k1's hold alone
    with running_api(settings, TUESDAY_NOON) as (api, _):  # rebuilt from the log alone
        assert ok(api.get("/v1/admission/k1", headers=SCHEDULER)) == answer
        assert api.get("/v1/admission/k2", headers=SCHEDULER).status_code == 404
        assert held(api) == 8 * 2 * 3600 * 10**6


def test_while_kafka_is_away_a_host_report_has_no_effect_and_a_release_is_sent_again_later(
    settings: Settings,
) -> None:
    def held(api: Any) -> int:
        balance = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        return int(balance["allocations"][0]["held_units"])

    with running_api(settings, TUESDAY_NOON) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        _ask(api, _job("r1", "vision", 8))  # recorded: its decision and hold
        service = api.app.state.admission
        log = service._log  # the group commit onto the admission log
        api.portal.call(log.stop)  # from here on the log takes nothing, as with Kafka away
        report = {"cluster": "h100-a", "host": "h7", "healthy": False, "reason": "ECC errors"}
        refused = api.post("/v1/hosts/health", json=report, headers=SCHEDULER)
        assert refused.status_code == 503 and refused.json()["code"] == "not-recorded"
        assert service.state.unhealthy_hosts("h100-a") == frozenset()  # no effect here either
        # r1 never starts: past its start deadline the hold goes, in the state at once ...
        clock.now = TUESDAY_NOON + 2 * 3600
        wait_until(lambda: held(api) == 0, 10, "the hold to be released")
        assert service._release_retry  # ... and in the log only once Kafka is back

        async def kafka_back() -> None:
            log.start()

        api.portal.call(kafka_back)
        wait_until(lambda: not service._release_retry, 10, "the release to be sent again")
    recorded = [parse_admission_event(v) for v in read_topic(settings, settings.admission_topic, 3)]
    assert [(e.type, e.job_id) for e in recorded if isinstance(e, AdmissionEventsOfJob)] == [
        ("AdmissionDecided", "r1"), ("HoldPlaced", "r1"), ("HoldReleased", "r1"),
    ]  # fmt: skip
    assert len(recorded) == 3  # and no host report


def test_usage_spends_the_hold_and_the_end_of_the_job_releases_the_rest(
    settings: Settings, tmp_path: Path
) -> None:
    start = TUESDAY_NOON
    events = _run("u1", "vision", start=start, end=start + 3600, gpus=4)
    with running_api(settings, start) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        assert _ask(api, _job("u1", "vision", 4, hours=3))["verdict"] == "admit"  # 12 GPU-hours held
        service = api.app.state.admission  # type: ignore[attr-defined]

        def line() -> dict[str, Any]:
            return ok(api.get("/v1/projects/vision/balance", headers=ADMIN))["allocations"][0]  # type: ignore[no-any-return]

        meter = MeterWorker(settings, tmp_path / "logs")
        try:
            meter.wait_ready()
            send_events(settings, events[:-1])  # 50 minutes of use; the job is still running
            wait_until(lambda: service.state.jobs["u1"].started, 30, "the job seen running")
            clock.now = start + 3000
            spent = wait_until(lambda: (x := line())["charged_units"] == 4 * 3000 * 10**6 and x, 60, "usage")
            assert spent["held_units"] == 12 * UNITS_PER_GPU_HOUR - spent["charged_units"]

            clock.now = start + 3600
            send_events(settings, events[-1:])
            full_hour = 4 * 3600 * 10**6
            done = wait_until(
                lambda: (x := line())["held_units"] == 0 and x["charged_units"] == full_hour and x,
                60,
                "released",
            )
        finally:
            meter.kill()
        assert done["remaining_units"] == 500 * UNITS_PER_GPU_HOUR - done["charged_units"]
        assert service.state.holds["u1"].released


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (_job("x", "nobody", 1), 404, "no project"),
        ({**_job("x", "vision", 1), "cluster": "nowhere"}, 404, "no cluster"),
        (_job("x", "vision", 65), 422, "has 64"),
        (_job("x", "vision", 1, hours=-2), 422, "greater than 0"),
        ({**_job("x", "vision", 1), "gpu_type": "B300"}, 422, "not B300"),
        ({**_job("x", "vision", 1), "gpus": 0}, 422, "greater than or equal to 1"),
    ],
    ids=[
        "an unknown project",
        "an unknown cluster",
        "more GPUs than the cluster has",
        "negative hours",
        "the wrong GPU type",
        "zero GPUs",
    ],
)
def test_bad_requests_get_a_4xx_with_a_clear_message(
    settings: Settings, body: dict[str, Any], status: int, needle: str
) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        response = api.post("/v1/admission", json=body, headers=SCHEDULER)
        assert response.status_code == status and needle in response.text, response.text
        assert api.post("/v1/admission", json=_job("y", "vision", 1), headers=ALICE).status_code == 403
        assert api.post("/v1/admission", json=_job("y", "vision", 1)).status_code == 401


def test_a_job_whose_gpus_idle_by_their_own_samples_is_a_victim_and_one_busy_node_keeps_a_job_safe(
    settings: Settings,
) -> None:
    """Squatting reclaim from dcgm-exporter samples (issue 24): the admission service follows
    `<prefix>.gpu-samples`. A non-preemptible job whose GPUs read idle for 40 minutes is the first
    victim; a job idle on one of its nodes but busy on the other is not; nor is a busy one."""
    start = TUESDAY_NOON - 3600
    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        jobs = [("parked", ("h1",)), ("split", ("h2", "h3")), ("working", ("h4",))]
        for job_id, hosts in jobs:
            decided = _ask(api, _job(job_id, "vision", 8 * len(hosts), priority_class="non-preemptible"))
            assert decided["verdict"] == "admit", decided
            send_events(settings, _started(job_id, "vision", 8 * len(hosts), start, hosts))
        service = api.app.state.admission  # type: ignore[attr-defined]
        wait_until(lambda: all(service.state.jobs[j].started for j, _ in jobs), 30, "jobs seen running")

        def samples(job: str, node: str, busy: bool) -> list[GpuSamples]:
            gpus = tuple(GpuSample(gpu=g, utilization_bp=9_000 if busy else 40) for g in range(8))
            return [
                GpuSamples(event_id=sample_id(node, at, job), occurred_at=at, producer="test", node=node,
                           job_id=job, interval_s=30, gpus=gpus)
                for at in range(start + 30, start + 40 * 60 + 1, 30)
            ]  # fmt: skip

        records = [
            *samples("parked", "h1", busy=False),
            *samples("split", "h2", busy=False),
            *samples("split", "h3", busy=True),
            *samples("working", "h4", busy=True),
        ]
        producer = make_producer(settings.kafka_bootstrap_servers)
        for record in records:
            producer.send(settings.gpu_samples_topic, key=record.key, value=encode_gpu_samples(record))
        producer.flush()
        producer.close()
        wait_until(lambda: service.state.jobs["parked"].idle_since is not None, 30, "the squatter seen idle")
        plan = ok(api.post("/v1/preemption/plan", json={"cluster": "h100-a", "gpus": 8}, headers=SCHEDULER))
    assert [(v["job_id"], v["code"]) for v in plan["victims"]] == [("parked", "squatting")]
    assert service.state.jobs["parked"].idle_since == start  # idle from its first sample on
    assert service.state.jobs["split"].idle_since is None and service.state.jobs["working"].idle_since is None
