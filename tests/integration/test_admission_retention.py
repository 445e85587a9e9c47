"""Admission's memory holds what is live (issue 29): an ended job leaves the service after the
retention, its decision is still answered (from ClickHouse), and a late copy of its events
cannot bring it back as running. Real API, broker and chDB; the service's clock is the test's."""

from __future__ import annotations

from typing import Any

import pytest

from allmende.core.settings import Settings
from allmende.schemas.events import FinishStatus, JobFinished, JobPreempted, JobStarted
from allmende.testing.budget_harness import ADMIN, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import send_events, wait_until
from tests.integration.test_admission import PLAN, TUESDAY_NOON, _ask, _job, _started

pytestmark = pytest.mark.integration
R = 3600


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"ended_job_retention_s": R})


def _finished(job_id: str, at: int) -> JobFinished:
    return JobFinished(
        event_id=f"{job_id}:fin",
        occurred_at=at,
        producer="test",
        job_id=job_id,
        status=FinishStatus.SUCCEEDED,
    )


def test_an_ended_job_leaves_memory_after_the_retention_and_is_still_answered(settings: Settings) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        service: Any = api.app.state.admission  # type: ignore[attr-defined]
        answer = _ask(api, _job("r1", "vision", 8, hours=1))
        queued = _ask(api, _job("q1", "vision", 64, hours=1))  # more than is free: queued
        assert (answer["verdict"], queued["verdict"]) == ("admit", "queue")
        start = _started("r1", "vision", 8, TUESDAY_NOON + 60, ("h1",))
        preempted = JobPreempted(
            event_id="r1:pre",
            occurred_at=TUESDAY_NOON + 600,
            producer="test",
            job_id="r1",
            reason="xid 79 on h1",
        )
        again = JobStarted(event_id="r1:start2", occurred_at=TUESDAY_NOON + 700, producer="test", job_id="r1",
                           gpus=8, hosts=("h2",))  # fmt: skip
        send_events(settings, [*start, preempted, again, _finished("r1", TUESDAY_NOON + 1800)])
        clock.now = TUESDAY_NOON + 1900
        wait_until(lambda: service.state.holds["r1"].released, 30, "r1's hold released")

        # Not yet: the retention runs from the last event.
        clock.now = TUESDAY_NOON + 1800 + R - 10
        # queued at noon, never asked again: let go of (by the service's round, every second)
        wait_until(lambda: "q1" not in service.state.decisions, 30, "q1 let go of")
        assert "r1" in service.state.decisions
        clock.now = TUESDAY_NOON + 1800 + R
        wait_until(lambda: "r1" not in service.state.jobs, 30, "r1 let go of")
        assert "r1" not in service.state.decisions and "r1" not in service.state.holds

        # Its decision is answered as before, from the decision history; its preemption is listed.
        assert ok(api.get("/v1/admission/r1", headers=SCHEDULER)) == answer
        assert ok(api.get("/v1/admission/q1", headers=SCHEDULER)) == queued
        listed = ok(api.get("/v1/dashboard/projects/vision/preemptions", headers=ADMIN))["rows"]
        assert [(r["job_id"], r["user"], r["cluster"], r["reason"]) for r in listed] == [
            ("r1", "ada", "h100-a", "xid 79 on h1")
        ]

        # A late copy of its start cannot make it run again; a new job's events are folded.
        metrics = api.get("/metrics").text
        send_events(settings, [start[1], *_started("r2", "vision", 4, clock.now, ("h2",))])
        wait_until(lambda: "r2" in service.state.jobs, 30, "the new job's events")
        load = service.state.load_on("h100-a", clock.now, settings.admission_start_deadline_s)
        assert {j.job_id for j in load.jobs} == {"r2"}
        assert "r1" not in service.state.jobs
        assert _late_events(api.get("/metrics").text) == _late_events(metrics) + 1


def _late_events(metrics: str) -> float:
    line = next(ln for ln in metrics.splitlines() if ln.startswith("allmende_admission_late_events_total "))
    return float(line.split()[1])
