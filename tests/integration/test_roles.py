"""An API process with the roles a site gives it (issue 23, part 4): `--role reads` is HTTP alone.

It reads the ledger and the admin state (balances, history), and says plainly that what it does
not run is elsewhere: admission and fair share answer 503 naming the setting, /healthz reports
them disabled."""

from __future__ import annotations

from allmende.core.settings import Settings
from allmende.testing.budget_harness import ADMIN, SCHEDULER, ok, plan_text, running_api
from allmende.topology import with_roles
from tests.integration.test_admission import PLAN, TUESDAY_NOON, _job


def test_the_read_api_alone_reads_and_sends_admission_elsewhere(settings: Settings) -> None:
    with running_api(with_roles(settings, {"reads"}), TUESDAY_NOON) as (api, _):
        # The ledger is in another process: its prices can change from now on only.
        plan = PLAN.replace("  id: prices\n", "  id: prices\n  effective_from: 2027-02-01T00:00:00Z\n")
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(plan)}, headers=ADMIN))
        health = ok(api.get("/healthz"))
        assert (health["writer"], health["fairshare"], health["admission"]) == ("disabled",) * 3
        balance = ok(api.get("/v1/projects/vision/balance", headers=ADMIN))
        assert balance["project"] == "vision"
        asked = api.post("/v1/admission", json=_job("r1", "vision", 8), headers=SCHEDULER)
        assert asked.status_code == 503 and "ALLMENDE_ADMISSION_ENABLED" in asked.text
        tree = api.get("/v1/fairshare", headers=ADMIN)
        assert tree.status_code == 503 and "ALLMENDE_FAIRSHARE_ENABLED" in tree.text
