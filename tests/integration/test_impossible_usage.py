"""Usage that cannot have happened never reaches a budget; what an admin mends is not lost (issues 22, 28).

On the real broker and chDB, through the real meter worker and ledger writer: a trace's jobs in
a declared plan, and beside them a job on a cluster the plan does not declare yet. Its submission
is refused (a dead letter with its code), so none of its usage is charged to its project; once a
plan declares the cluster, `allmende dead-letters redrive` sends it again and the job is charged
exactly as if it had come on time.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from allmende.cli.main import app
from allmende.core.dead_letters import read_letters
from allmende.core.replay import timeline
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat
from allmende.domain.usage_checks import UNKNOWN_CLUSTER
from allmende.testing.budget_harness import ADMIN, ALICE, SCHEDULER, ok, running_api
from allmende.testing.declared_plan import declare
from allmende.testing.harness import Pipeline, send_events, wait_until

pytestmark = pytest.mark.integration
SAMPLE_EVERY_S = 600
LATE_CLUSTER = "ef-cluster-late"


def test_a_job_on_an_undeclared_cluster_is_refused_then_charged_exactly_once_redriven(
    pipeline: Pipeline, elasticflow_tarball: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, store = pipeline.settings, pipeline.store
    jobs = list(read_trace(elasticflow_tarball, TraceFormat.ELASTICFLOW, cluster="cluster10", limit=40))
    pipeline.declare(jobs)
    template = max(jobs, key=lambda j: j.gpu_seconds)
    late = dataclasses.replace(template, job_id=f"{template.job_id}-late", cluster=LATE_CLUSTER)
    pipeline.start_meter()
    send_events(settings, timeline([*jobs, late], SAMPLE_EVERY_S))

    declared = sum(j.gpu_seconds for j in jobs)
    project = late.project
    in_project = sum(j.gpu_seconds for j in jobs if j.project == project)
    wait_until(lambda: read_letters(settings, 5), 120, "the refused submission's dead letter")
    [refused] = read_letters(settings)
    assert (refused.letter.stage, refused.letter.code) == ("meter", UNKNOWN_CLUSTER)
    assert late.job_id in refused.letter.reason and LATE_CLUSTER in refused.letter.reason
    # The late job's readings are metered, but charged to no project until its submission is.
    wait_until(lambda: store.total_gpu_seconds() == declared + late.gpu_seconds, 120, "the ledger")
    assert store.total_gpu_seconds(project) == in_project

    # Re-driven before the plan is fixed: refused again, still not charged.
    monkeypatch.setenv("ALLMENDE_KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers)
    monkeypatch.setenv("ALLMENDE_TOPIC_PREFIX", settings.topic_prefix)
    runner = CliRunner()
    result = runner.invoke(app, ["dead-letters", "redrive", "--code", UNKNOWN_CLUSTER])
    assert result.exit_code == 0 and "1 job events sent again" in result.output, result.output
    wait_until(lambda: len(read_letters(settings, 5)) == 2, 120, "the second refusal")

    # The plan declares the cluster; the re-drive charges the job, once, however often it is run.
    declare(settings, [late])
    for _ in range(2):
        result = runner.invoke(app, ["dead-letters", "redrive", "--offset", str(refused.offset)])
        assert result.exit_code == 0 and "1 job events sent again" in result.output, result.output
    wait_until(
        lambda: store.total_gpu_seconds(project) == in_project + late.gpu_seconds, 120, "the late job charged"
    )
    assert store.total_gpu_seconds() == declared + late.gpu_seconds
    assert store.job_gpu_seconds()[late.job_id] == late.gpu_seconds
    assert len(read_letters(settings)) == 2  # nothing refused once the plan declared it
    listed = runner.invoke(app, ["dead-letters", "list", "--json"])
    assert listed.exit_code == 0 and listed.output.count(UNKNOWN_CLUSTER) >= 2, listed.output

    # Admins see the refusals per kind, with the job and the reason; nobody else does.
    reading = settings.model_copy(
        update={
            "writer_enabled": False,
            "fairshare_enabled": False,
            "admission_enabled": False,
            "alerts_enabled": False,
        }
    )
    with running_api(reading, int(time.time())) as (api, _):
        shown = ok(api.get("/v1/admin/refused", headers=ADMIN))
        assert shown["kinds"] == [{"stage": "meter", "code": UNKNOWN_CLUSTER, "count": 2, "redrivable": True}]
        assert [(r["key"], r["code"], r["offset"]) for r in shown["letters"]][-1] == (
            late.job_id,
            UNKNOWN_CLUSTER,
            refused.offset,
        )
        assert all(LATE_CLUSTER in r["reason"] for r in shown["letters"]) and shown["age_s"] < 60
        assert ok(api.get("/v1/admin/refused", params={"code": "gpu-type"}, headers=ADMIN))["letters"] == []
        for caller in (ALICE, SCHEDULER):
            assert api.get("/v1/admin/refused", headers=caller).status_code == 403
