"""A real Slurm uses the platform: job_submit.lua asks the admission API, the Slurmctld hooks
publish the lifecycle, the ledger charges what sacct shows."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.core.kafka_local import free_port
from allmende.testing.slurm_harness import ROOT, Platform, SlurmCluster, hook_python, wait_for
from tests.slurm.conftest import RunningAgent

pytestmark = pytest.mark.slurm


def _flat(text: str) -> str:
    return " ".join(text.split())


def _job_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"sbatch failed: {result.stderr}"
    return result.stdout.strip().split(";")[0]


def _decisions(platform: Platform, project: str) -> list[object]:
    return [d for d in list(platform.admission.state.decisions.values()) if d.project == project]


def _sacct_gpus(row: dict[str, str]) -> int:
    m = re.search(r"gres/gpu=(\d+)", row["AllocTRES"])
    assert m, row
    return int(m.group(1))


@pytest.fixture
def configured(slurm: SlurmCluster, platform: Platform) -> Iterator[SlurmCluster]:
    slurm.cancel_all()  # each test finds the node to itself
    slurm.configure(**platform.config())
    yield slurm
    slurm.configure(**platform.config())


def test_an_over_budget_non_preemptible_job_is_refused_with_the_apis_sentence(
    configured: SlurmCluster, platform: Platform
) -> None:
    before = len(_decisions(platform, "broke"))
    result = configured.sbatch(
        "-A", "poor", "--qos=high", "--gres=gpu:h100:2", "-t", "60", "--wrap", "sleep 1"
    )
    assert result.returncode != 0, result.stdout
    decided = _decisions(platform, "broke")
    assert len(decided) == before + 1
    decision = decided[-1]
    assert (decision.verdict, decision.reasons[0].code) == ("reject", "over-budget")  # type: ignore[attr-defined]
    assert decision.priority_class == "non-preemptible" and decision.gpus == 2  # type: ignore[attr-defined]
    assert decision.cluster == "slurm-h100" and decision.requested_seconds == 3600  # type: ignore[attr-defined]
    sentence = " ".join(r.message for r in decision.reasons)  # type: ignore[attr-defined]
    assert _flat(sentence) in _flat(result.stderr), result.stderr
    assert "sbatch: error:" in result.stderr


def test_an_in_budget_job_runs_and_the_ledger_charges_exactly_what_sacct_shows(
    configured: SlurmCluster, platform: Platform
) -> None:
    job = _job_id(configured.sbatch("-A", "rich", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 3"))
    row = configured.wait_done(job)
    assert row["State"] == "COMPLETED", row
    admission_id = row["AdminComment"].removeprefix("allmende:")
    assert admission_id.startswith("slurm-slurm-h100-"), row
    decision = platform.admission.state.decisions[admission_id]
    assert (decision.verdict, decision.lane, decision.project, decision.gpus) == (
        "admit",
        "budget",
        "rich",
        2,
    )
    assert decision.requested_seconds == 300

    elapsed, gpus = int(row["ElapsedRaw"]), _sacct_gpus(row)
    assert gpus == 2 and elapsed >= 3
    charged = wait_for(lambda: platform.gpu_seconds(admission_id), 60, f"the ledger to charge {admission_id}")
    assert charged == elapsed * gpus, (charged, row, configured.hook_log.read_text()[-2000:])
    # The job's end reached the admission service too: its hold is released.
    wait_for(lambda: platform.admission.state.holds[admission_id].released, 30, "the hold to be released")


def test_with_the_api_away_fail_open_decides(
    configured: SlurmCluster, platform: Platform, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    configured.configure(**platform.config(api_url=dead, fail_open=False))
    refused = configured.sbatch("-A", "rich", "--gres=gpu:h100:1", "-t", "5", "--wrap", "sleep 1")
    assert refused.returncode != 0
    assert "GPU budget service could not be asked" in refused.stderr, refused.stderr
    assert "connection refused" in refused.stderr.lower(), refused.stderr

    # A slow API (accepts, never answers) is the same after timeout_s.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        slow = f"http://127.0.0.1:{silent.getsockname()[1]}"
        configured.configure(**platform.config(api_url=slow, fail_open=False, timeout_s=1))
        t0 = time.monotonic()
        timed_out = configured.sbatch("-A", "rich", "--gres=gpu:h100:1", "-t", "5", "--wrap", "sleep 1")
        took = time.monotonic() - t0
    assert timed_out.returncode != 0 and "timeout" in timed_out.stderr, timed_out.stderr
    assert took < 8, took

    # fail_open: submitted, but held without an admission; it runs once the agent has one.
    configured.configure(**platform.config(api_url=dead, fail_open=True))
    submitted = configured.sbatch("-A", "rich", "--gres=gpu:1", "-t", "5", "--wrap", "sleep 2")
    job = _job_id(submitted)
    assert "submitted and held until it admits it" in submitted.stderr, submitted.stderr
    state = configured.squeue(job, "%T|%r")
    assert state.startswith("PENDING|JobHeld"), state
    time.sleep(2)
    assert configured.squeue(job, "%T").startswith("PENDING")  # nothing runs unadmitted
    configured.configure(**platform.config())
    agent = RunningAgent(configured, tmp_path / "agent.err")
    try:
        row = configured.wait_done(job)
    finally:
        agent.stop()
    assert row["State"] == "COMPLETED", row
    admission_id = row["AdminComment"].split()[0].removeprefix("allmende:")
    charged = wait_for(lambda: platform.gpu_seconds(admission_id), 60, f"the ledger to charge {admission_id}")
    assert charged == int(row["ElapsedRaw"]) * _sacct_gpus(row)


def test_dry_run_only_logs_what_it_would_do(configured: SlurmCluster, platform: Platform) -> None:
    before = len(_decisions(platform, "broke"))
    configured.configure(**platform.config(dry_run=True))
    job = _job_id(
        configured.sbatch("-A", "poor", "--qos=high", "--gres=gpu:h100:2", "-t", "60", "--wrap", "sleep 1")
    )
    assert len(_decisions(platform, "broke")) == before  # ?dry_run=true records nothing
    wait_for(
        lambda: re.search(r"dry-run: .* would reject the job", configured.ctld_log()), 10, "the dry-run log"
    )
    assert configured.wait_done(job)["AdminComment"] == ""


def test_spooled_events_reach_the_ledger_after_a_flush(configured: SlurmCluster, platform: Platform) -> None:
    dead = f"127.0.0.1:{free_port()}"
    configured.configure(**platform.config(kafka_bootstrap_servers=dead, send_timeout_s=1))
    job = _job_id(configured.sbatch("-A", "rich", "--gpus=1", "-t", "5", "--wrap", "sleep 1"))  # untyped
    row = configured.wait_done(job)
    admission_id = row["AdminComment"].removeprefix("allmende:")
    assert "left in spool 3" in (configured.hook_ran("epilog", job) or ""), configured.hook_log.read_text()
    assert len(list(configured.spool.glob("*.json"))) == 3  # JobSubmitted, JobStarted, JobFinished
    time.sleep(1)
    assert platform.gpu_seconds(admission_id) is None

    configured.configure(**platform.config())
    env = {k: v for k, v in configured.env.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    command = [hook_python(), "-m", "allmende.integrations.slurm.lifecycle", "flush", "--config"]
    flushed = subprocess.run(
        [*command, str(configured.config_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert "sent 3, left in spool 0" in flushed.stdout
    assert not list(configured.spool.glob("*.json"))
    charged = wait_for(lambda: platform.gpu_seconds(admission_id), 60, f"the ledger to charge {admission_id}")
    assert charged == int(row["ElapsedRaw"]) * _sacct_gpus(row)


def test_a_cancelled_job_is_charged_exactly_what_sacct_shows(
    configured: SlurmCluster, platform: Platform
) -> None:
    job = _job_id(configured.sbatch("-A", "rich", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 120"))
    try:
        wait_for(lambda: configured.hook_ran("prolog", job), 30, "the job to start")
        # slurmdbd has the start, and the run lasts a few whole seconds before it is cancelled
        wait_for(
            lambda: configured.sacct(job).get("Start", "None") not in {"", "None", "Unknown"}, 30, "sacct"
        )
        time.sleep(2)
    finally:
        configured.run("scancel", job)
    row = configured.wait_done(job)
    assert row["State"].startswith("CANCELLED"), row
    admission_id = configured.platform_id(job)
    assert admission_id is not None
    ended = wait_for(lambda: configured.hook_ran("epilog", job), 30, "the epilog")
    assert "JobFinished" in ended, ended
    elapsed, gpus = int(row["ElapsedRaw"]), _sacct_gpus(row)
    assert gpus == 2 and elapsed >= 2
    charged = wait_for(lambda: platform.gpu_seconds(admission_id), 60, f"the ledger to charge {admission_id}")
    assert charged == elapsed * gpus, (charged, row, configured.hook_log.read_text()[-2000:])


def test_a_queued_job_is_submitted_held_with_the_reason(configured: SlurmCluster, platform: Platform) -> None:
    big = _job_id(configured.sbatch("-A", "rich", "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 30"))
    try:
        held = configured.sbatch("-A", "rich", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 1")
        small = _job_id(held)
        try:
            assert "held for now" in held.stderr, held.stderr
            state = configured.squeue(small, "%T|%r|%p|%k")
            status, reason, priority, comment = state.split("|", 3)
            assert status == "PENDING" and reason.startswith("JobHeld"), state
            assert float(priority) == 0 and comment.startswith("allmende: queued:"), state
        finally:
            configured.run("scancel", small)
        # Let the big job start before cancelling it: its epilog ends it on the platform too.
        wait_for(lambda: configured.squeue(big, "%T") == "RUNNING", 30, "the big job to run")
    finally:
        configured.run("scancel", big)
    configured.wait_done(big)
