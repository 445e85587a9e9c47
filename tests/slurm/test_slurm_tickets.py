"""No job starts without an admission, on the real Slurm: cli_filter.lua is the user's side and can
be bypassed (another slurm.conf), so a job without a ticket, with a forged one, with another job's,
or with one for less than it asks, is held by job_submit.lua; its owner cannot release it; the
agent asks the platform and the job runs once admitted, or never when the platform rejects it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from allmende.integrations.slurm.local import SUBMIT_TOKEN
from allmende.testing.slurm_harness import RESEARCHER, Platform, SlurmCluster, wait_for
from tests.slurm.conftest import RunningAgent

pytestmark = pytest.mark.slurm
JOB = ("-A", "rich", "--gres=gpu:h100:1", "-t", "5", "--wrap", "sleep 1")


@pytest.fixture
def configured(slurm: SlurmCluster, platform: Platform) -> Iterator[SlurmCluster]:
    slurm.cancel_all()
    slurm.configure(**platform.config())
    yield slurm
    slurm.cancel_all()
    slurm.configure(**platform.config())


def _bypass_env(slurm: SlurmCluster, tmp: Path) -> dict[str, str]:
    """What a user who skips cli_filter runs with: a slurm.conf without it, in a directory under
    the Slurm state directory (which every user reaches)."""
    where = slurm.state / f"bypass-{tmp.name}"
    where.mkdir(exist_ok=True)
    return slurm.env_without_cli_filter(where)


def _run(env: dict[str, str], *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    command = list(args)
    if user is not None:  # as that user, from a directory they may enter
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
        command = ["su", user, "-s", "/bin/sh", "-c", f"cd /tmp && {quoted}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def _sbatch(env: dict[str, str], *args: str, user: str | None = None) -> tuple[str, str]:
    done = _run(env, "sbatch", "--parsable", "-o", "/dev/null", *args, user=user)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], done.stderr


def _state(slurm: SlurmCluster, job: str) -> tuple[str, str, str]:
    """(state, reason, comment) while Slurm lists the job."""
    state, reason, comment = [*slurm.squeue(job, "%T|%r|%k").split("|", 2), "", ""][:3]
    return state, reason, comment


def _held(slurm: SlurmCluster, job: str, why: str) -> None:
    state, reason, comment = _state(slurm, job)
    assert state == "PENDING" and reason.startswith("JobHeld"), (state, reason, comment)
    assert comment.startswith("allmende: queued: held until the GPU budget service admits it"), comment
    assert why in comment, comment


def _admission_id(slurm: SlurmCluster, job: str) -> str:
    admin_comment = slurm.run("scontrol", "show", "job", "-o", job).stdout
    tag = admin_comment.split("AdminComment=", 1)[1].split()[0]
    assert tag.startswith("allmende:"), admin_comment
    return tag.removeprefix("allmende:")


def _ticket(platform: Platform, job_id: str, user: str = "root", gpus: int = 1) -> str:
    body = {
        "job_id": job_id, "project": "rich", "user": user, "cluster": "slurm-h100", "gpu_type": "H100",
        "gpus": gpus, "priority_class": "standard", "interactive": False, "requested_hours": "0.083333333",
    }  # fmt: skip
    answer = httpx.post(
        f"{platform.url}/v1/admission",
        json=body,
        headers={"Authorization": f"Bearer {SUBMIT_TOKEN}"},
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json()["verdict"] == "admit", answer.text
    ticket: str = answer.json()["ticket"]
    return ticket


def _charged(platform: Platform, slurm: SlurmCluster, job: str) -> None:
    row = slurm.wait_done(job)
    assert row["State"] == "COMPLETED", row
    admission_id = row["AdminComment"].split()[0].removeprefix("allmende:")
    gpus = int(row["AllocTRES"].split("gres/gpu=")[1].split(",")[0])
    charged = wait_for(lambda: platform.gpu_seconds(admission_id), 60, f"the ledger to charge {admission_id}")
    assert charged == int(row["ElapsedRaw"]) * gpus, (charged, row)


def test_a_job_submitted_without_cli_filter_is_held_its_owner_cannot_release_it_and_it_runs_once_admitted(
    configured: SlurmCluster, platform: Platform, tmp_path: Path
) -> None:
    bypass = _bypass_env(configured, tmp_path)
    job, said = _sbatch(bypass, *JOB, user=RESEARCHER)
    assert "held until the GPU budget service admits it" in said, said
    _held(configured, job, "submitted without an admission")

    released = _run(bypass, "scontrol", "release", job, user=RESEARCHER)
    assert released.returncode != 0, released
    more = _run(bypass, "scontrol", "update", f"jobid={job}", "gres=gpu:h100:8", user=RESEARCHER)
    assert more.returncode != 0, more
    time.sleep(2)
    _held(configured, job, "submitted without an admission")  # still: it never ran
    assert "change by uid" in configured.ctld_log() and "refused" in configured.ctld_log()

    admission_id = _admission_id(configured, job)
    agent = RunningAgent(configured, tmp_path / "agent.err")
    try:
        _charged(platform, configured, job)
    finally:
        agent.stop()
    decision = platform.admission.state.decisions[admission_id]
    assert (decision.verdict, decision.user, decision.gpus) == ("admit", RESEARCHER, 1)


def test_a_forged_a_replayed_and_a_stretched_ticket_each_hold_their_job_until_the_service_admits_it(
    configured: SlurmCluster, platform: Platform, tmp_path: Path
) -> None:
    bypass = _bypass_env(configured, tmp_path)
    ticket_id = f"slurm-slurm-h100-{int(time.time())}-t1"
    ticket = _ticket(platform, ticket_id)
    honest, _ = _sbatch(bypass, "--comment", f"allmende-ticket:{ticket}", *JOB)
    replayed, _ = _sbatch(bypass, "--comment", f"allmende-ticket:{ticket}", *JOB)
    forged, _ = _sbatch(bypass, "--comment", f"allmende-ticket:{ticket[:-6]}000000", *JOB)
    stretched, _ = _sbatch(bypass, "--comment", f"allmende-ticket:{ticket}", "-A", "rich",
                           "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 1")  # fmt: skip

    honest_id = _admission_id(configured, honest)
    assert honest_id == ticket_id and "held" not in _state(configured, honest)[2]
    _held(configured, replayed, "was used by another job already")
    _held(configured, forged, "signature is wrong")
    _held(configured, stretched, "for gpus 1, the job asks for 2")
    ids = {_admission_id(configured, j) for j in (replayed, forged, stretched)}
    assert honest_id not in ids and len(ids) == 3  # each held job asks under an id of its own

    _charged(platform, configured, honest)
    agent = RunningAgent(configured, tmp_path / "agent.err")
    try:
        for job in (replayed, forged, stretched):
            _charged(platform, configured, job)
    finally:
        agent.stop()


def test_an_over_budget_job_that_skips_cli_filter_never_runs(
    configured: SlurmCluster, platform: Platform, tmp_path: Path
) -> None:
    bypass = _bypass_env(configured, tmp_path)
    job, _ = _sbatch(bypass, "-A", "poor", "--qos=high", "--gres=gpu:h100:2", "-t", "60", "--wrap", "sleep 1")
    _held(configured, job, "submitted without an admission")
    admission_id = _admission_id(configured, job)
    agent = RunningAgent(configured, tmp_path / "agent.err")
    try:
        row = wait_for(lambda: configured.ended(job), 60, "the agent to cancel the job", configured)
    finally:
        agent.stop()
    # sacct gives a job cancelled while pending its cancel time as Start, and nothing allocated
    assert row["State"].startswith("CANCELLED") and row["ElapsedRaw"] == "0" and row["AllocTRES"] == "", row
    assert configured.hook_ran("prolog", job) is None  # it never started
    decision = platform.admission.state.decisions[admission_id]
    assert (decision.verdict, decision.reasons[0].code) == ("reject", "over-budget")
