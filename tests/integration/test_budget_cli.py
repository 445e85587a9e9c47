"""`allmende budget ...` as an admin uses it, against the API served over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from allmende.cli.main import app
from allmende.core.settings import Settings
from allmende.testing.budget_harness import live_api, plan_text
from allmende.testing.harness import wait_until
from tests.integration.test_budgets import NOW, QUARTER_PLAN

pytestmark = pytest.mark.integration


def test_plan_apply_history_and_balance_from_the_command_line(settings: Settings, tmp_path: Path) -> None:
    plan = tmp_path / "q1.yaml"
    plan.write_text(plan_text(QUARTER_PLAN))
    with live_api(settings, NOW) as (url, _):
        runner = CliRunner(env={"ALLMENDE_API_URL": url, "ALLMENDE_TOKEN": "admin-secret", "COLUMNS": "200"})

        preview = runner.invoke(app, ["budget", "plan", str(plan)])
        assert preview.exit_code == 0, preview.output
        assert "not applied" in preview.output and "olmo-ft/2027-Q1" in preview.output

        applied = runner.invoke(app, ["budget", "apply", str(plan)])
        assert applied.exit_code == 0 and "changes applied" in applied.output
        again = runner.invoke(app, ["budget", "apply", str(plan)])
        assert again.exit_code == 0 and "nothing to change" in again.output

        history = runner.invoke(app, ["budget", "history", "olmo-ft"])
        assert history.exit_code == 0 and "AllocationGranted" in history.output and "root" in history.output

        chart = tmp_path / "balance.png"
        balance = runner.invoke(app, ["budget", "balance", "olmo-ft", "--plot", str(chart)])
        assert balance.exit_code == 0 and "1,000.00" in balance.output and "250.50" in balance.output
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        broken = tmp_path / "broken.yaml"
        broken.write_text(plan_text(QUARTER_PLAN).replace("gpu_hours: 250.5", "gpu_hours: plenty"))
        refused = runner.invoke(app, ["budget", "apply", str(broken)])
        line = next(i for i, text in enumerate(broken.read_text().splitlines(), 1) if "plenty" in text)
        assert refused.exit_code == 1
        assert f"line {line}" in refused.output and "allocations.1.gpu_hours" in refused.output

        def tree_printed() -> str | None:
            shown = runner.invoke(app, ["fairshare"])
            return shown.output if shown.exit_code == 0 and "olmo-ft" in shown.output else None

        tree = wait_until(tree_printed, 30, "the fair-share tree with the plan's projects")
        assert "FairShare" in tree and "LevelFS" in tree and "  olmo-ft" in tree  # indented under nlp

        marked = runner.invoke(app, ["host", "unhealthy", "h100-a", "node-7", "--reason", "Xid 79"])
        assert marked.exit_code == 0 and "HostUnhealthy recorded" in marked.output
        plan_out = runner.invoke(app, ["preempt", "h100-a", "--gpus", "4"])
        assert plan_out.exit_code == 0 and "NOT enough" in plan_out.output  # nothing runs yet

        stranger = CliRunner(env={"ALLMENDE_API_URL": url, "ALLMENDE_TOKEN": "nobody"})
        denied = stranger.invoke(app, ["budget", "balance", "olmo-ft"])
        assert denied.exit_code == 1 and "401" in denied.output
