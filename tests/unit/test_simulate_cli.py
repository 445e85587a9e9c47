"""`allmende simulate` on a slice of a real trace and the example plan: tables, JSON, the HTML page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from allmende.cli.main import app
from allmende.cli.simulate import cluster_mapping, detect_format, parse_bad_hosts
from allmende.cli.simulate_html import json_for_html
from allmende.domain.plan_file import Plan, parse_plan
from allmende.domain.simulation.baseline import BaselineConfig, BaselinePolicy
from allmende.domain.simulation.interfaces import Policy
from allmende.domain.simulation.model import HostFailure
from allmende.domain.simulation.policies import POLICIES, PolicyArgs, protection_shares
from allmende.domain.traces import TraceFormat
from allmende.services.web.assets import ECHARTS

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "data" / "traces"
PHILLY = TRACES / "philly" / "philly_jobs_15000.csv"
ELASTICFLOW = TRACES / "elasticflow" / "raw-traces.tar.gz"
PLAN = ROOT / "examples" / "plans" / "elasticflow-2021-q2.yaml"
SLICE = ["--limit", "200", "--bad-host", "1@1+3", "--placeholder-users", "0.3"]

needs_traces = pytest.mark.skipif(not PHILLY.exists(), reason="needs ../shared/data/traces")
runner = CliRunner()


def simulate(*args: str | Path) -> Any:
    """The command in memory (the same metering logic, no Kafka): tests/integration has the pipeline."""
    result = runner.invoke(app, ["simulate", "--in-memory", *(str(a) for a in args)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def small_plan(tmp_path: Path) -> Path:
    """The example plan with a quarter of ef-cluster01's GPUs: the same slice queues."""
    text = (
        PLAN.read_text()
        .replace("gpus: 384}", "gpus: 96}")
        .replace("plan: institute-2021-q2", "plan: institute-2021-q2-small")
    )
    path = tmp_path / "small.yaml"
    path.write_text(text)
    return path


def embedded_data(html: str) -> Any:
    m = re.search(r'<script type="application/json" id="simulation-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


@needs_traces
def test_a_slice_prints_the_table_and_the_same_seed_writes_the_same_json(tmp_path: Path) -> None:
    out = [tmp_path / f"run{i}.json" for i in range(3)]
    first = simulate(PLAN, PHILLY, *SLICE, "--seed", "0", "--json", out[0])
    simulate(PLAN, PHILLY, *SLICE, "--seed", "0", "--json", out[1])
    simulate(PLAN, PHILLY, *SLICE, "--seed", "2", "--json", out[2])

    assert "GPU utilisation, busy" in first.stdout
    assert "idle GPU-hours held by placeholders" in first.stdout
    assert "philly -> ef-cluster01" in first.stdout  # no plan cluster of that name: the first one
    assert out[0].read_bytes() == out[1].read_bytes()
    assert out[0].read_bytes() != out[2].read_bytes()
    doc = json.loads(out[0].read_text())
    assert [r["policy"] for r in doc["runs"]] == list(POLICIES)
    report = doc["runs"][0]["report"]
    assert report["jobs"] == 200 + doc["behaviours"]["placeholder_jobs"]
    assert sum(report["outcomes"].values()) == report["jobs"]
    assert report["stuck_runs"], "the bad host should hold a non-preemptible run"
    assert report["stuck_seconds_max"] == 4 * 3600  # the on-call's default delay
    assert doc["behaviours"]["bad_hosts"]["institute-2021-q2"][0]["host"] == "ef-cluster01-n001"


@needs_traces
def test_the_html_page_is_self_contained_and_holds_the_numbers_of_the_json(tmp_path: Path) -> None:
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    simulate(PLAN, PHILLY, *SLICE, "--report", html_path, "--json", json_path)
    html = html_path.read_text()

    echarts = ECHARTS.read_text()
    assert echarts[:2000] in html and echarts[-2000:] in html  # inlined, whole
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert embedded_data(html) == json.loads(json_path.read_text())
    report = embedded_data(html)["runs"][0]["report"]
    table = html[html.index('id="report"') :]
    assert f"{100 * report['busy_utilization']:.1f} %" in table
    assert f"{report['placeholder_idle_gpu_seconds'] / 3600:,.1f}" in table
    for chart in ("utilisation", "waste", "topclass", "stuck", "delays"):
        assert f'id="{chart}"' in html


@needs_traces
def test_two_plans_are_shown_side_by_side_in_the_terminal_and_the_page(tmp_path: Path) -> None:
    html_path, json_path = tmp_path / "both.html", tmp_path / "both.json"
    result = simulate(
        PLAN,
        PHILLY,
        small_plan(tmp_path),
        *SLICE,
        "--policy",
        "baseline",
        "--report",
        html_path,
        "--json",
        json_path,
    )
    assert "simulations side by side" in result.stdout
    assert "baseline · institute-2021-q2" in result.stdout
    assert "baseline · institute-2021-q2-small" in result.stdout
    doc = json.loads(json_path.read_text())
    assert [r["label"] for r in doc["runs"]] == [
        f"{plan}:baseline" for plan in ("institute-2021-q2", "institute-2021-q2-small")
    ]
    big, small = (r["report"] for r in doc["runs"])
    assert small["capacity_gpu_seconds"] != big["capacity_gpu_seconds"]
    html = html_path.read_text()
    assert embedded_data(html) == doc
    assert "institute-2021-q2-small:baseline</th>" in html


@needs_traces
def test_every_registered_policy_runs_and_two_policies_are_shown_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def open_doors(plan: Plan, args: PolicyArgs) -> Policy:  # no protected GPUs, no on-call delay
        return BaselinePolicy(BaselineConfig(on_call_delay_s=0), name="open-doors")

    monkeypatch.setitem(POLICIES, "open-doors", open_doors)
    out = tmp_path / "two.json"
    result = simulate(PLAN, PHILLY, *SLICE, "--json", out)
    assert "baseline · institute-2021-q2" in result.stdout
    assert "open-doors · institute-2021-q2" in result.stdout
    reports = {r["policy"]: r["report"] for r in json.loads(out.read_text())["runs"]}
    assert list(reports) == list(POLICIES)  # every registered policy, in the registry's order
    baseline, other = reports["baseline"], reports["open-doors"]
    assert baseline["stuck_seconds_max"] == 4 * 3600 and other["stuck_runs"] == []

    only = simulate(PLAN, PHILLY, *SLICE, "--policy", "open-doors", "--json", out)
    assert "simulations side by side" not in only.stdout
    assert [r["policy"] for r in json.loads(out.read_text())["runs"]] == ["open-doors"]


@needs_traces
def test_bad_arguments_are_refused_with_a_message(tmp_path: Path) -> None:
    for args, words in [
        (["--policy", "nope"], "unknown policy"),
        (["--cluster-map", "philly=nowhere"], "lacks"),
        (["--bad-host", "n001"], "--bad-host wants"),
        (["--format", "csv"], "unknown format"),
    ]:
        result = runner.invoke(
            app, ["simulate", "--in-memory", str(PLAN), str(PHILLY), "--limit", "20", *args]
        )
        assert result.exit_code != 0, args
        assert words in result.output, result.output


def test_the_format_comes_from_the_file() -> None:
    if ELASTICFLOW.exists():
        assert detect_format(ELASTICFLOW) is TraceFormat.ELASTICFLOW
    if PHILLY.exists():
        assert detect_format(PHILLY) is TraceFormat.PHILLY


def test_trace_clusters_go_to_the_plan_cluster_of_their_name_else_the_first() -> None:
    plan = parse_plan(PLAN.read_text())
    assert cluster_mapping(plan, ["ef-cluster02", "ef-cluster05", "philly"], {"philly": "ef-cluster10"}) == {
        "ef-cluster02": "ef-cluster02",
        "ef-cluster05": "ef-cluster01",
        "philly": "ef-cluster10",
    }
    with pytest.raises(typer.BadParameter):
        cluster_mapping(plan, ["philly"], {"philly": "elsewhere"})


def test_bad_hosts_are_hours_after_the_first_submission() -> None:
    plan = parse_plan(PLAN.read_text())
    assert parse_bad_hosts(["2@1.5", "ef-cluster02/ef-cluster02-n004@0+2"], plan, 1000) == (
        HostFailure("ef-cluster01", "ef-cluster01-n002", 1000 + 5400),
        HostFailure("ef-cluster02", "ef-cluster02-n004", 1000, 1000 + 7200),
    )


def test_the_baseline_protects_the_plan_projects_that_submit_or_else_the_trace_projects() -> None:
    plan = parse_plan(PLAN.read_text())
    assert protection_shares(plan, ("ef-cluster01", "ef-cluster10", "stranger")) == {
        "ef-cluster01": 50,
        "ef-cluster10": 20,
    }
    assert protection_shares(plan, ("philly-team-01", "philly-team-02")) == {
        "philly-team-01": 1,
        "philly-team-02": 1,
    }
    assert POLICIES["baseline"](plan, PolicyArgs(on_call_hours=1)).name == "baseline"


def test_embedded_json_cannot_close_its_script_element() -> None:
    text = json_for_html({"job": "</script><script>alert(1)</script> <!-- & >"})
    assert "</" not in text and "<!--" not in text and "&" not in text
    assert json.loads(text) == {"job": "</script><script>alert(1)</script> <!-- & >"}
