"""A cluster that ran more GPUs than it has is raised loudly (issue 28): on the real broker, a
real meter worker, the API's ledger writer on chDB and its alerter.

Two jobs of 12 GPUs overlap for two hours on a cluster of 16: each is possible alone (the meter
takes both), their sum is not. The alerter finds the episode in the ledger, publishes one
`CapacityExceeded` (however many rounds see it), posts it to the webhooks and sets the gauge; the
admin route names the run that pushed the cluster over, the one that started last.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from allmende.core.settings import Settings
from allmende.schemas.alert_events import CapacityExceeded
from allmende.testing.budget_harness import ADMIN, ALICE, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import wait_until
from tests.integration.test_budgets import Q1_2027, _meter_all, _run
from tests.integration.test_burn_alerts import Webhook, on_topic

pytestmark = pytest.mark.integration
HOUR, DAY = 3600, 86_400
T0 = Q1_2027 + 2 * DAY
NOW = Q1_2027 + 9 * DAY
PLAN = """
plan: small-2027-q1
period: 2027-Q1
clusters:
  - {name: small, gpu_type: H100, gpus: 16}
organisation:
  - {id: institute, kind: organisation, shares: 100}
  - {id: olmo-ft, parent: institute, kind: project, shares: 60, leads: [alice]}
  - {id: vision, parent: institute, kind: project, shares: 40, leads: [bob]}
"""
JOBS = [
    *_run("first", "olmo-ft", start=T0, end=T0 + 4 * HOUR, gpus=12, cluster="small"),
    *_run("second", "vision", start=T0 + HOUR, end=T0 + 3 * HOUR, gpus=12, cluster="small"),
    *_run("after", "vision", start=T0 + 5 * HOUR, end=T0 + 6 * HOUR, gpus=4, cluster="small"),
]


def _utc(at: int) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat().replace("+00:00", "Z")


def test_two_runs_above_a_clusters_capacity_raise_one_alert_naming_the_one_that_pushed_it_over(
    settings: Settings, tmp_path: Path
) -> None:
    hook = Webhook()
    alerting = settings.model_copy(update={"alert_check_s": 1, "alert_webhook_urls": hook.url})
    try:
        with running_api(alerting, NOW) as (api, _):
            ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
            _meter_all(alerting, JOBS, tmp_path / "logs", api.app.state.store)  # type: ignore[attr-defined]

            def raised() -> list[CapacityExceeded]:
                return [e for e in on_topic(alerting) if isinstance(e, CapacityExceeded)]

            wait_until(raised, 60, "the capacity alert")
            time.sleep(3)  # more rounds see the same episode
            [alert] = raised()
            shown = ok(api.get("/v1/admin/over-capacity", headers=ADMIN))
            refused = {who: api.get("/v1/admin/over-capacity", headers=h).status_code
                       for who, h in (("lead", ALICE), ("scheduler", SCHEDULER))}  # fmt: skip
            gauge = REGISTRY.get_sample_value("allmende_cluster_over_capacity_gpus", {"cluster": "small"})
        wait_until(lambda: any("small" in b["text"] for b in hook.bodies), 30, "the webhook post")
    finally:
        hook.close()

    assert (alert.cluster, alert.capacity_gpus, alert.peak_gpus) == ("small", 16, 24)
    assert (alert.start, alert.end) == (T0 + HOUR, T0 + 3 * HOUR)
    assert (alert.jobs, alert.projects) == (["second"], ["vision"])
    assert "second" in alert.message and "24 GPUs of its 16" in alert.message

    [episode] = shown["episodes"]
    assert (episode["cluster"], episode["peak_gpus"], episode["excess_gpus"]) == ("small", 24, 8)
    assert (episode["start"], episode["end"]) == (_utc(T0 + HOUR), _utc(T0 + 3 * HOUR))
    assert [r["job_id"] for r in episode["pushed_over"]] == ["second"]
    assert {(r["job_id"], r["gpus"], r["started_at"]) for r in episode["runs"]} == {
        ("first", 12, _utc(T0)), ("second", 12, _utc(T0 + HOUR)),
    }  # fmt: skip
    assert refused == {"lead": 403, "scheduler": 403}
    assert gauge == 8
    [body] = [b for b in hook.bodies if "small" in b["text"]]
    assert body["text"] == alert.message
