"""The broker stopped under a running API: writes answer 503 at once and never take effect;
reads go on from the last state, saying how old it is; after the broker is back (and after a
restart of the API, rebuilt from its logs) nothing refused shows up.

The broker is the test's own (stopped and started again on the same data), not the session's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from allmende.core.kafka_local import LocalBroker
from allmende.core.settings import Settings
from allmende.testing.budget_harness import ADMIN, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import wait_until
from allmende.testing.tagged_settings import tagged_settings
from tests.integration.test_admission import PLAN, TUESDAY_NOON

pytestmark = pytest.mark.integration
ANSWER_WITHIN_S = 1.0  # the bound; the default write timeout is 250 ms
EXTRA = PLAN.replace("  - {id: broke, parent: institute, kind: project, shares: 10}\n",
                     "  - {id: broke, parent: institute, kind: project, shares: 10}\n"
                     "  - {id: extra, parent: institute, kind: project, shares: 5}\n")  # fmt: skip


def _job(job_id: str, gpus: int) -> dict[str, Any]:
    return {"job_id": job_id, "project": "vision", "user": "ada", "cluster": "h100-a", "gpu_type": "H100",
            "gpus": gpus, "requested_hours": 1}  # fmt: skip


def _timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


Write = tuple[str, dict[str, Any], dict[str, str]]  # path, body, the caller's headers


def _writes() -> dict[str, Write]:
    allocation = {"allocation_id": "vision-more", "project": "vision", "period": "2027-Q1", "gpu_hours": 100}
    return {
        "admission": ("/v1/admission", _job("during", 8), SCHEDULER),
        "plan apply": ("/v1/admin/plan/apply", {"text": plan_text(EXTRA)}, ADMIN),
        "allocation": ("/v1/admin/allocations", allocation, ADMIN),
        "host report": ("/v1/hosts/health", {"cluster": "h100-a", "host": "h7", "healthy": False}, SCHEDULER),
    }


def _while_away(api: Any, balance: dict[str, Any]) -> None:
    for what, (path, body, headers) in _writes().items():
        for _ in range(2):  # asked again while Kafka is still away: the same answer
            refused, took = _timed(lambda p=path, b=body, h=headers: api.post(p, json=b, headers=h))
            assert refused.status_code == 503, f"{what}: {refused.status_code} {refused.text}"
            assert refused.json()["code"] == "not-recorded" and refused.headers["retry-after"], what
            assert took < ANSWER_WITHIN_S, f"{what} answered after {took:.2f}s"
    # Reads go on from the last state, and say how old it is.
    time.sleep(1.5)
    read, took = _timed(lambda: api.get("/v1/projects/vision/balance", headers=ADMIN))
    assert read.status_code == 200 and took < ANSWER_WITHIN_S, (read.status_code, took, read.text)
    assert float(read.headers["x-allmende-state-age"]) >= 1.5
    health = api.get("/healthz")  # degraded (the writer cannot read its topic), and says how stale
    assert health.json()["admin_state_age_s"] >= 1.5, health.text
    assert read.json()["allocations"] == balance["allocations"]  # the refused writes: nowhere
    assert api.get("/v1/admission/during", headers=SCHEDULER).status_code == 404


def test_with_the_broker_stopped_writes_answer_503_at_once_and_never_take_effect(
    broker: LocalBroker, chdb_dsn: str, tmp_path: Path
) -> None:
    # The default write timeout (250 ms), which the tests' settings raise for loaded machines.
    settings = tagged_settings(broker.bootstrap, chdb_dsn, tmp_path).model_copy(
        update={"write_timeout_ms": Settings.model_fields["write_timeout_ms"].default}
    )
    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        before = ok(api.post("/v1/admission", json=_job("before", 8), headers=SCHEDULER))
        balance = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        broker.stop()
        try:
            _while_away(api, balance)
        finally:
            broker.start()  # the producers deliver what they still held: appended late, void

        def admitted() -> Any:
            answer = api.post("/v1/admission", json=_job("during", 8), headers=SCHEDULER)
            return answer.status_code == 200 and answer.json()

        again = wait_until(admitted, 60, "admission to answer again")
        assert again["attempt"] == 1  # decided afresh: the refused decision never counted
        time.sleep(2)  # let the admin log's follower read whatever the producers delivered
        after = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        allocations = [a["allocation_id"] for a in balance["allocations"]]
        assert [a["allocation_id"] for a in after["allocations"]] == allocations
        held = sum(a["held_units"] for a in after["allocations"])
        assert held == 2 * 8 * 3600 * 10**6  # "before" and "during" once each, nothing more
        assert "extra" not in str(ok(api.get("/v1/admin/organisation", headers=ADMIN)))
    with running_api(settings, TUESDAY_NOON) as (api, _):  # rebuilt from the logs alone
        assert ok(api.get("/v1/admission/before", headers=SCHEDULER)) == before
        assert ok(api.get("/v1/admission/during", headers=SCHEDULER)) == again
        rebuilt = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        assert [a["allocation_id"] for a in rebuilt["allocations"]] == allocations
        assert "extra" not in str(ok(api.get("/v1/admin/organisation", headers=ADMIN)))
        assert api.app.state.admission.state.unhealthy_hosts("h100-a") == frozenset()
