"""The Slurm agent (integrations/slurm/agent.py) against the real local Slurm: a drained node is a
host report and its jobs are requeued; a queued job is released once the platform admits it; the
victims the API names are requeued; freed GPUs go to the job the platform's fair share ranks first."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import time

import httpx
import pytest

from allmende.domain.traces import TraceJob, job_events
from allmende.integrations.slurm.scontrol import parse_job
from allmende.schemas.events import FinishStatus
from allmende.testing.budget_harness import ADMIN, ok
from allmende.testing.harness import send_events
from allmende.testing.slurm_harness import (
    PLATFORM_CLUSTER,
    Platform,
    SlurmCluster,
    current_quarter,
    wait_for,
)
from tests.slurm.conftest import RunningAgent

pytestmark = pytest.mark.slurm
# Longer than sinfo's default column: the agent must read it whole.
REASON = "xid 79 on GPU 3, fallen off the bus (ticket 4711)"


def _job_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"sbatch failed: {result.stderr}"
    return result.stdout.strip().split(";")[0]


def _show(slurm: SlurmCluster, job: str) -> str:
    out = slurm.run("scontrol", "show", "job", "-o", job).stdout
    return next((ln for ln in out.splitlines() if ln.startswith("JobId=")), "")


def _held(slurm: SlurmCluster, job: str) -> bool:
    priority, _, reason = slurm.squeue(job, "%Q|%r").partition("|")
    return priority == "0" or reason.startswith("JobHeld")


def _node(slurm: SlurmCluster) -> str:
    nodes = slurm.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()
    assert nodes, "sinfo shows no node"
    return nodes[0]


def test_a_drained_node_is_reported_unhealthy_and_every_job_on_it_requeued(
    agent: RunningAgent, platform: Platform
) -> None:
    slurm = agent.slurm
    node = _node(slurm)
    host = (PLATFORM_CLUSTER, node)
    # At start the agent reports every node's state once: this one healthy.
    wait_for(
        lambda: f"host {node} of cluster {PLATFORM_CLUSTER}: reported healthy" in agent.log(), 15, "a report"
    )
    gres = ("--gres=gpu:h100:2", "-t", "10", "--wrap", "sleep 120")
    standard = _job_id(slurm.sbatch("-A", "rich", *gres))
    high = _job_id(slurm.sbatch("-A", "rich", "--qos=high", *gres))  # non-preemptible
    jobs = (standard, high)
    try:
        for job in jobs:
            wait_for(lambda job=job: slurm.hook_ran("prolog", job), 30, f"job {job} to start", slurm)
        high_id = slurm.platform_id(high)
        assert high_id is not None
        assert platform.admission.state.decisions[high_id].priority_class == "non-preemptible"

        drained = slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={REASON}")
        assert drained.returncode == 0, drained.stderr
        wait_for(
            lambda: host in platform.admission.state.unhealthy, 15, "the platform to have the host report"
        )
        for job in jobs:
            ended = wait_for(
                lambda job=job: "JobPreempted" in (slurm.hook_ran("epilog", job) or ""),
                30,
                f"job {job} requeued",
            )
            assert ended
            wait_for(
                lambda job=job: parse_job(_show(slurm, job)).state == "PENDING", 15, f"job {job} pending"
            )
            shown = parse_job(_show(slurm, job))
            assert shown.restarts == 1, shown.raw
            # The reason is on the job (the admin comment, after the admission id) and in the log.
            assert shown.admin_comment.startswith("allmende:slurm-"), shown.admin_comment
            assert re.search(
                rf"allmende: requeued \S+: node {node} drain\w*: {re.escape(REASON)}", shown.admin_comment
            )
            assert f"job {job}: requeued: node {node}" in agent.log()
        log = agent.log()
        assert re.search(
            rf"host {node} of cluster {PLATFORM_CLUSTER}: reported unhealthy "
            rf"\(slurm: node {node} drain\w*: {re.escape(REASON)}\)",
            log,
        ), log
    finally:
        slurm.run("scancel", *jobs)
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    wait_for(
        lambda: host not in platform.admission.state.unhealthy, 15, "the platform to have it healthy again"
    )
    assert agent.log().count(f"host {node} of cluster {PLATFORM_CLUSTER}: reported healthy") == 2
    for job in jobs:
        assert slurm.wait_done(job)["State"].startswith("CANCELLED")
    # One report per change: a few more passes add none.
    time.sleep(2.5)
    assert len(re.findall(rf"host {node} of cluster \S+: reported", agent.log())) == 3


def test_a_queued_job_is_released_once_an_admin_grants_budget(
    agent: RunningAgent, platform: Platform
) -> None:
    slurm = agent.slurm
    # Over budget and preemptible, on all 8 GPUs: the opportunistic lane.
    blocker = _job_id(
        slurm.sbatch(
            "-A", "poor", "--qos=preemptible", "--gres=gpu:h100:8", "-t", "60", "--wrap", "sleep 120"
        )
    )
    queued = ""
    try:
        wait_for(lambda: slurm.hook_ran("prolog", blocker), 30, "the blocker to start", slurm)
        # Over budget, preemptible, no idle GPUs: queued, submitted held.
        held = slurm.sbatch(
            "-A", "poor", "--qos=preemptible", "--gres=gpu:h100:4", "-t", "120", "--wrap", "sleep 2"
        )
        queued = _job_id(held)
        assert "held for now" in held.stderr, held.stderr
        job = parse_job(_show(slurm, queued))
        admission_id = job.admission_id()
        assert admission_id is not None and "allmende-request:{" in job.admin_comment, job.admin_comment
        first = platform.admission.state.decisions[admission_id]
        assert (first.verdict, first.attempt, first.project) == ("queue", 1, "broke")

        # The agent asks again every second (dry run first): still queued, nothing recorded.
        wait_for(lambda: f"job {queued}: {admission_id}: still queued" in agent.log(), 15, "the agent to ask")
        time.sleep(1.5)
        assert platform.admission.state.decisions[admission_id].attempt == 1
        assert _held(slurm, queued)

        grant = {
            "project": "broke",
            "allocation_id": "broke-extra",
            "period": current_quarter(dt.datetime.now(dt.UTC)),
            "gpu_hours": 1000,
            "reason": "test: more GPU-hours for broke",
        }
        ok(httpx.post(f"{platform.url}/v1/admin/allocations", json=grant, headers=ADMIN, timeout=30))
        wait_for(lambda: not _held(slurm, queued), 30, "the queued job to be released", slurm)
        assert int(slurm.squeue(queued, "%Q")) > 0
        decision = platform.admission.state.decisions[admission_id]
        assert (decision.verdict, decision.lane, decision.attempt) == ("admit", "budget", 2)
        assert slurm.squeue(queued, "%k").startswith("allmende: admitted (lane budget):")
        assert f"job {queued}: {admission_id}: admitted: released (lane budget)" in agent.log()
    except BaseException:
        if queued:
            slurm.run("scancel", queued)
        raise
    finally:
        slurm.run("scancel", blocker)
    slurm.wait_done(blocker)
    # The blocker gone, the released job runs (its QOS cannot preempt the blocker's).
    assert slurm.wait_done(queued, timeout=60)["State"] == "COMPLETED"


def test_an_opportunistic_job_is_requeued_when_a_project_inside_its_time_slice_window_needs_the_gpus(
    agent: RunningAgent, platform: Platform
) -> None:
    slurm = agent.slurm
    # Over budget and preemptible: the opportunistic lane, on all 8 idle GPUs.
    low = _job_id(
        slurm.sbatch(
            "-A", "spent", "--qos=preemptible", "--gres=gpu:h100:8", "-t", "60", "--wrap", "sleep 120"
        )
    )
    lab = ""
    try:
        wait_for(lambda: slurm.hook_ran("prolog", low), 30, "the opportunistic job to start", slurm)
        low_id = slurm.platform_id(low)
        assert low_id is not None and platform.admission.state.decisions[low_id].lane == "opportunistic"
        # slurmdbd has the run's start: a run preempted in the second it started may be
        # recorded without one (sacct: Start=None, Elapsed 0), while it did hold its GPUs.
        wait_for(lambda: slurm.sacct(low).get("Start", "None") not in {"", "None", "Unknown"}, 30, "sacct")
        time.sleep(3)  # a run of whole seconds: one requeued in its first second may be recorded as 0 s

        # lab is inside its window (8 GPUs guaranteed): admitted, naming the opportunistic job.
        lab = _job_id(slurm.sbatch("-A", "lab", "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 2"))
        ended = wait_for(lambda: slurm.hook_ran("epilog", low), 30, "the preempted run's epilog")
        assert "JobPreempted" in ended, ended
        lab_id = wait_for(lambda: slurm.platform_id(lab), 30, "the time-slice job to start", slurm)
        decision = platform.admission.state.decisions[lab_id]
        assert (decision.verdict, decision.lane) == ("admit", "time-slice")
        assert [v.job_id for v in decision.preempt] == [low_id]
        assert re.search(
            rf"job {low}: preempted \(requeued, {low_id}\) for job {lab} \({lab_id}\)", agent.log()
        )
        assert "allmende: preempted (requeued)" in parse_job(_show(slurm, low)).admin_comment
    finally:
        slurm.run("scancel", low)  # requeued and pending: no second run
    assert slurm.wait_done(lab)["State"] == "COMPLETED"

    preempted = [r for r in slurm.runs(low) if r["State"] == "REQUEUED"]  # the agent's scontrol requeue
    assert len(preempted) == 1, slurm.runs(low)
    want = int(preempted[0]["ElapsedRaw"]) * 8
    charged = wait_for(lambda: platform.gpu_seconds(low_id), 60, f"the ledger to charge {low_id}")
    assert charged == want, (charged, preempted, slurm.hook_log.read_text()[-1500:])
    wait_for(lambda: low_id in platform.admission.state.preempted, 30, "the admission service to see it")


def _factors(platform: Platform) -> dict[str, float]:
    answer = httpx.get(f"{platform.url}/v1/fairshare", headers=ADMIN, timeout=30)
    if answer.status_code != 200:
        return {}
    return {n["node_id"]: n["factor"] for n in answer.json()["nodes"] if n["is_leaf"]}


def test_freed_gpus_go_to_the_held_job_the_platforms_fair_share_ranks_first(
    agent: RunningAgent, platform: Platform
) -> None:
    slurm = agent.slurm
    # rich ran 8 GPUs for an hour earlier today; team has run nothing: team ranks above rich.
    now = int(time.time())
    hour_ago = now - 7200
    past = TraceJob(
        "fs-rich-past",
        "rich",
        "alice",
        PLATFORM_CLUSTER,
        "H100",
        8,
        hour_ago,
        hour_ago,
        3600,
        FinishStatus.SUCCEEDED,
    )
    send_events(platform.settings, job_events(past, sample_every_s=600))
    wait_for(
        lambda: _factors(platform).get("team", 0) > _factors(platform).get("rich", 1), 60, "rich's usage"
    )

    # lab's time-slice job holds every GPU and budget jobs may not preempt it: both are queued.
    blocker = _job_id(slurm.sbatch("-A", "lab", "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 300"))
    first = second = ""
    try:
        wait_for(lambda: slurm.hook_ran("prolog", blocker), 30, "the blocker to start", slurm)
        first = _job_id(slurm.sbatch("-A", "rich", "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 1"))
        second = _job_id(slurm.sbatch("-A", "team", "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 30"))
        assert _held(slurm, first) and _held(slurm, second)

        slurm.run("scancel", blocker)
        # The agent asks again in the platform's order: team's job (submitted last) gets the GPUs.
        wait_for(lambda: not _held(slurm, second), 60, "team's job to be released", slurm)
        assert _held(slurm, first), agent.log()
        wait_for(lambda: slurm.hook_ran("prolog", second), 30, "team's job to start", slurm)
        assert _held(slurm, first)
        assert f"job {first}: " in agent.log() and "still queued" in agent.log()
    finally:
        for job in (first, second, blocker):
            if job:
                slurm.run("scancel", job)
    for job in (second, blocker):  # the two that ran (rich's never did: no epilog to wait for)
        slurm.wait_done(job)
