"""Simulated runs through the real pipeline (Kafka, the meter worker, the ledger writer, chDB):
the ledger holds exactly the GPU-seconds the simulation ran, job by job, under both policies; the
run's admission log holds the platform's every decision; budgets come out of the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from allmende.cli.main import app
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.simulation.baseline import BaselineConfig, BaselinePolicy, protected_by_shares
from allmende.domain.simulation.engine import EngineConfig, Simulation
from allmende.domain.simulation.from_plan import clusters_from_plan, project_shares
from allmende.domain.simulation.interfaces import Sink
from allmende.domain.traces import TraceFormat
from allmende.simulator.pipeline import run_settings, simulate_through_pipeline
from allmende.simulator.platform import PlanAdmin, PlatformPolicy
from tests.simulation_slice import HOUR, ON_CALL_S, PHILLY, behaviours, jobs, plan, plan_text

pytestmark = pytest.mark.skipif(not PHILLY.exists(), reason="needs ../shared/data/traces")


def _count(settings: Settings, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


@pytest.mark.parametrize("policy_name", ["platform", "baseline"])
def test_a_simulated_run_is_metered_exactly_by_the_real_pipeline(
    policy_name: str, kafka_bootstrap: str, chdb_dsn: str, tmp_path: Path
) -> None:
    base = Settings(kafka_bootstrap_servers=kafka_bootstrap, clickhouse_dsn=chdb_dsn, topic_partitions=2,
                    writer_batch_wait_ms=100, log_json=False)  # fmt: skip
    settings = run_settings(base, tmp_path)
    assert settings.topic_prefix.startswith("sim_") and settings.clickhouse_database == settings.topic_prefix
    clusters = clusters_from_plan(plan())
    platform = PlatformPolicy(plan(), base) if policy_name == "platform" else None
    protected = protected_by_shares({c.name: c.gpus for c in clusters}, project_shares(plan()), percent=50)
    policy = platform or BaselinePolicy(BaselineConfig(protected_gpus=protected, on_call_delay_s=ON_CALL_S))
    config = EngineConfig(run_id=f"pipe-{policy_name}", strict=False, sample_every_s=HOUR)

    def simulation(sink: Sink) -> Simulation:
        return Simulation(clusters, jobs(0, policy_name), policy, sink, config, behaviours(0).host_failures)

    admin = PlanAdmin(plan()).state
    run = simulate_through_pipeline(settings, tmp_path, simulation, admin, platform=platform, timeout_s=300)
    assert run.check.exact, (run.check.mismatched, run.check.gpu_seconds, run.check.ledger_gpu_seconds)
    assert run.check.gpu_seconds == sum(r.gpu_seconds for rec in run.result.jobs for r in rec.runs) > 0
    assert _count(settings, settings.job_events_topic) == run.events
    # Charged by the plan's prices: every project that ran was charged.
    ran = {rec.job.project for rec in run.result.jobs if rec.runs}
    assert all(run.charges[p] > 0 for p in ran), run.charges
    if platform is not None:
        recorded = _count(settings, settings.admission_topic)
        assert recorded == len(platform.recorded) > len(jobs(0, policy_name))
        # The ledger and the platform's own metering agree on every project's charges.
        assert {p: run.charges[p] for p in ran} == {p: platform.budgets()[p].charged_units for p in ran}


def test_the_command_runs_both_policies_through_the_pipeline_and_reports_budgets_from_the_ledger(
    kafka_bootstrap: str, chdb_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("ALLMENDE_CLICKHOUSE_DSN", chdb_dsn)  # chDB: one directory per process
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(plan_text(read_trace(PHILLY, TraceFormat.PHILLY, limit=150)))
    out = tmp_path / "runs.json"
    options = ["-f", "philly", "--limit", "150", "--sample-every", "43200"]
    args = ["simulate", str(plan_file), str(PHILLY), *options, "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "baseline · philly-test" in result.stdout and "platform · philly-test" in result.stdout
    runs = {r["policy"]: r["report"] for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"baseline", "platform"}
    for report in runs.values():
        assert report["budgets"], report  # charged (from the ledger) against allocated
