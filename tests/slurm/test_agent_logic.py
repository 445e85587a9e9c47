"""The Slurm agent's decisions without Slurm: parsing sinfo and scontrol, what it reports, requeues,
releases and cancels, against a fake Slurm and a mock API."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from typing import Any

import httpx
import pytest

from allmende.integrations.slurm.agent import (
    Agent,
    Slurm,
    hours_of_minutes,
    nice_of,
    parse_sinfo,
    queued_jobs,
    rebuilt_request,
    stored_request,
)
from allmende.integrations.slurm.config import SlurmConfig
from allmende.integrations.slurm.scontrol import fields, parse_job

CFG = SlurmConfig(clusters={"gpu": "h100-a", "debug": "h100-a"}, projects={"poor": "broke"}, token="t")

SINFO = """n1|gpu*|draining|xid 79 on GPU 3
n1|debug|draining|xid 79 on GPU 3
n2|gpu*|idle*|none
n3|gpu*|down*|Not responding
n4|gpu*|drained|none
n5|gpu*|mixed|none
"""

REQUEST = {
    "job_id": "slurm-h100-a-1-abcd",
    "project": "broke",
    "user": "root",
    "cluster": "h100-a",
    "gpu_type": "H100",
    "gpus": 4,
    "priority_class": "preemptible",
    "interactive": False,
    "requested_hours": "2",
}


def _job_line(job: str, state: str, reason: str, priority: str, admin: str, comment: str) -> str:
    return (
        f"JobId={job} JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority={priority} "
        f"Nice=0 Account=poor QOS=preemptible JobState={state} Reason={reason} Dependency=(null) "
        f"Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=02:00:00 "
        f"Partition=gpu NodeList=(null) TRES=cpu=1,node=1,billing=1,gres/gpu=4 "
        f"Command=(null) WorkDir=/root AdminComment={admin} Comment={comment} StdErr=/dev/null"
    )


class FakeSlurm(Slurm):
    def __init__(self, nodes: str, jobs_on: dict[str, list[str]], jobs: list[str]) -> None:
        super().__init__(CFG)
        self.sinfo_out, self.on, self.lines = nodes, jobs_on, jobs
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        out = ""
        if args[0] == "sinfo":
            out = self.sinfo_out
        elif args[0] == "squeue":
            out = "\n".join(self.on.get(args[args.index("-w") + 1], []))
        elif args[:3] == ("scontrol", "show", "config"):
            out = "Configuration data as of 2026-12-04T20:00:00\nClusterName             = pytest\n"
        elif args[:3] == ("scontrol", "show", "job"):
            out = "\n".join(ln for ln in self.lines if len(args) == 4 or ln.startswith(f"JobId={args[4]} "))
        return subprocess.CompletedProcess(list(args), 0, out, "")


class FakeApi:
    def __init__(
        self,
        verdicts: list[dict[str, Any]],
        factors: dict[str, float] | None = None,
        recorded: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.verdicts = verdicts
        self.factors = factors or {}  # project -> fair-share factor (GET /v1/fairshare)
        self.recorded = recorded or {}  # admission id -> decision (GET /v1/admission/{id})
        self.calls: list[tuple[str, bool, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            self.calls.append((request.url.path, False, {}))
            if request.url.path == "/v1/fairshare":
                nodes = [{"node_id": p, "factor": f, "is_leaf": True} for p, f in self.factors.items()]
                return httpx.Response(200, json={"nodes": nodes})
            decision = self.recorded.get(request.url.path.rsplit("/", 1)[-1])
            return (
                httpx.Response(200, json=decision) if decision else httpx.Response(404, json={"detail": "no"})
            )
        body = json.loads(request.content)
        dry = request.url.params.get("dry_run") == "true"
        self.calls.append((request.url.path, dry, body))
        if request.url.path == "/v1/hosts/health":
            return httpx.Response(200, json={"event_id": f"e{len(self.calls)}", "type": "x"})
        answer = self.verdicts[0] if dry or len(self.verdicts) == 1 else self.verdicts[1]
        return httpx.Response(200, json={"sentence": "because", **answer})


def _agent(slurm: FakeSlurm, api: FakeApi, dry_run: bool = False) -> tuple[Agent, list[str]]:
    lines: list[str] = []
    client = httpx.Client(base_url="http://api", transport=httpx.MockTransport(api))
    return Agent(CFG, lines.append, dry_run=dry_run, slurm=slurm, client=client), lines


def test_sinfo_drained_or_down_with_a_reason_is_unhealthy() -> None:
    nodes = {n.node: n for n in parse_sinfo(SINFO)}
    assert nodes["n1"].partitions == ("gpu", "debug") and nodes["n1"].unhealthy
    assert nodes["n3"].state == "down" and nodes["n3"].unhealthy
    assert not nodes["n2"].unhealthy and nodes["n2"].state == "idle"
    assert not nodes["n4"].unhealthy  # drained without a reason
    assert not nodes["n5"].unhealthy


def test_hours_as_job_submit_lua_sends_them() -> None:
    assert [hours_of_minutes(m) for m in (5, 60, 90, 600, 7)] == [
        "0.083333333",
        "1",
        "1.5",
        "10",
        "0.116666666",
    ]


def test_a_stored_request_is_read_back_and_a_missing_one_rebuilt() -> None:
    admin = "allmende:slurm-h100-a-1-abcd allmende-request:" + json.dumps(REQUEST, separators=(",", ":"))
    assert stored_request(admin) == REQUEST
    assert stored_request("allmende:x allmende-request:{broken") is None
    line = _job_line(
        "7", "PENDING", "JobHeldAdmin", "0", "allmende:slurm-h100-a-1-abcd", "allmende: queued: x"
    )
    assert rebuilt_request(parse_job(line), "slurm-h100-a-1-abcd", CFG) == REQUEST


def test_only_held_jobs_with_the_queued_note_and_an_admission_id_are_asked_about() -> None:
    admin = "allmende:slurm-h100-a-1-abcd allmende-request:" + json.dumps(REQUEST, separators=(",", ":"))
    lines = [
        _job_line("1", "PENDING", "JobHeldAdmin", "0", admin, "allmende: queued: no idle GPUs"),
        _job_line("2", "PENDING", "Priority", "4000", admin, "allmende: queued: no idle GPUs"),  # released
        _job_line("3", "PENDING", "JobHeldUser", "0", "", "allmende: queued: forged"),  # no admission id
        _job_line("4", "RUNNING", "None", "4000", admin, "allmende: queued: x"),
        _job_line(
            "5", "PENDING", "JobHeldAdmin", "0", "allmende:slurm-x-2-ef", "allmende: queued: old plugin"
        ),
    ]
    jobs = []
    for line in lines:
        first: dict[str, str] = {}
        for key, value in fields(line):
            first.setdefault(key, value)
        jobs.append((parse_job(line), first))
    found = {q.job.job_id: q for q in queued_jobs(jobs, CFG)}
    assert sorted(found) == ["1", "5"]
    assert found["1"].request == REQUEST and found["5"].request is None


def test_nodes_are_reported_on_change_and_jobs_on_an_unhealthy_node_requeued_once() -> None:
    slurm = FakeSlurm(SINFO, {"n1": ["11", "12"], "n3": []}, [])
    api = FakeApi([])
    agent, log = _agent(slurm, api)
    agent.run_once()
    reports = [(c[2]["host"], c[2]["healthy"]) for c in api.calls if c[0] == "/v1/hosts/health"]
    assert sorted(reports) == [("n1", False), ("n2", True), ("n3", False), ("n4", True), ("n5", True)]
    assert [c for c in slurm.calls if c[:2] == ("scontrol", "requeue")] == [
        ("scontrol", "requeue", "11"),
        ("scontrol", "requeue", "12"),
    ]
    notes = [c for c in slurm.calls if c[:2] == ("scontrol", "update")]
    assert notes[0][2] == "JobId=11" and "node n1 draining: xid 79 on GPU 3" in notes[0][3]
    assert any("job 12: requeued: node n1 draining: xid 79 on GPU 3" in line for line in log)
    bad = next(c[2] for c in api.calls if c[2].get("host") == "n1")
    assert bad["cluster"] == "h100-a" and "xid 79" in bad["reason"]

    # Again: nothing new to report or requeue.
    calls, requeues = len(api.calls), len(slurm.calls)
    agent.run_once()
    assert len(api.calls) == calls
    assert not [c for c in slurm.calls[requeues:] if c[:2] == ("scontrol", "requeue")]

    # n1 resumes: reported healthy; drained again later: its jobs are requeued again.
    slurm.sinfo_out = SINFO.replace("draining|xid 79 on GPU 3", "idle|none")
    agent.run_once()
    assert api.calls[-1][2] == {"cluster": "h100-a", "host": "n1", "healthy": True, "reason": ""}
    assert "n1" not in agent.requeued


def test_dry_run_reports_and_requeues_nothing() -> None:
    slurm = FakeSlurm(SINFO, {"n1": ["11"]}, [])
    api = FakeApi([])
    agent, log = _agent(slurm, api, dry_run=True)
    agent.run_once()
    assert not [c for c in api.calls if c[0] == "/v1/hosts/health"]
    assert not [c for c in slurm.calls if c[1] in {"requeue", "update"}]
    assert any("dry-run: would requeue job 11" in line for line in log)


def _queued_slurm() -> FakeSlurm:
    admin = "allmende:slurm-h100-a-1-abcd allmende-request:" + json.dumps(REQUEST, separators=(",", ":"))
    line = _job_line("9", "PENDING", "JobHeldAdmin", "0", admin, "allmende: queued: no idle GPUs")
    return FakeSlurm("", {}, [line])


def test_a_queued_job_still_queued_is_asked_in_dry_run_only() -> None:
    slurm, api = _queued_slurm(), FakeApi([{"verdict": "queue", "lane": "opportunistic"}])
    agent, log = _agent(slurm, api)
    agent.run_once()
    agent.run_once()
    asked = [c for c in api.calls if c[0] == "/v1/admission"]
    assert [(c[0], c[1]) for c in asked] == [("/v1/admission", True)] * 2
    assert asked[0][2] == REQUEST
    assert not [c for c in slurm.calls if c[1] in {"release", "update"}]
    assert sum("still queued" in line for line in log) == 1  # logged when it changes


def test_an_admitted_job_is_released_in_the_opportunistic_lane_on_the_preemptible_qos() -> None:
    slurm = _queued_slurm()
    slurm.lines = [slurm.lines[0].replace("QOS=preemptible", "QOS=normal")]
    api = FakeApi([{"verdict": "admit", "lane": "opportunistic"}])
    agent, _log = _agent(slurm, api)
    agent.run_once()
    asked = [(c[0], c[1]) for c in api.calls if c[0] == "/v1/admission"]
    assert asked == [("/v1/admission", True), ("/v1/admission", False)]
    acts = [c for c in slurm.calls if c[1] in {"release", "update"}]
    assert acts[0] == ("scontrol", "update", "JobId=9", "QOS=preemptible")
    assert acts[1] == ("scontrol", "release", "9")
    assert acts[2][3].startswith("Comment=allmende: admitted (lane opportunistic): no idle GPUs")


def test_a_rejected_job_is_cancelled_with_the_reason() -> None:
    slurm, api = _queued_slurm(), FakeApi([{"verdict": "reject", "lane": None, "sentence": "no budget"}])
    agent, log = _agent(slurm, api)
    agent.run_once()
    assert ("scontrol", "update", "JobId=9", "Comment=allmende: rejected: no budget") in slurm.calls
    assert slurm.calls[-1] == ("scancel", "9")
    assert any("rejected: cancelled: no budget" in line for line in log)


def _line(
    job: str, state: str, account: str, qos: str, admin: str, reason: str = "None", nice: str = "0"
) -> str:
    line = _job_line(job, state, reason, "0" if reason.startswith("JobHeld") else "100", admin, "(null)")
    return line.replace("Account=poor QOS=preemptible", f"Account={account} QOS={qos}").replace(
        "Nice=0", f"Nice={nice}"
    )


def _victim(job_id: str, code: str = "opportunistic") -> dict[str, Any]:
    return {"job_id": job_id, "project": "broke", "gpus": 8, "code": code, "reason": f"{job_id} runs"}


def _admit(*victims: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": "admit", "lane": "budget", "preempt": list(victims)}


def test_a_pending_jobs_plan_is_carried_out_once_on_the_victims_still_running() -> None:
    slurm = FakeSlurm("", {}, [
        _line("20", "RUNNING", "poor", "preemptible", "allmende:slurm-x-1-aaaa"),
        _line("21", "RUNNING", "poor", "preemptible", "(null)"),  # known by the hooks' id
        _line("22", "PENDING", "rich", "normal", "allmende:slurm-x-2-bbbb", reason="Resources"),
    ])  # fmt: skip
    victims = [_victim("slurm-x-1-aaaa"), _victim("slurm-pytest-21"), _victim("slurm-x-9-gone")]
    api = FakeApi(
        [], recorded={"slurm-x-2-bbbb": {"verdict": "admit", "lane": "time_slice", "preempt": victims}}
    )
    agent, log = _agent(slurm, api)
    agent.run_once()
    agent.run_once()  # the plan is history: nothing stopped twice
    assert [c for c in slurm.calls if c[1] == "requeue"] == [
        ("scontrol", "requeue", "20"),
        ("scontrol", "requeue", "21"),
    ]
    assert [c[0] for c in api.calls].count("/v1/admission/slurm-x-2-bbbb") == 1
    notes = [c[3] for c in slurm.calls if c[1] == "update" and c[3].startswith("AdminComment=")]
    assert len(notes) == 2 and "allmende: preempted (requeued)" in notes[0]
    assert "for job 22 (slurm-x-2-bbbb): slurm-x-1-aaaa runs" in notes[0]
    assert any("slurm-x-9-gone: named to make room" in line and "not running" in line for line in log)


@pytest.mark.parametrize(
    ("action", "decision", "stopped"),
    [
        ("cancel", _admit(), []),
        ("cancel", {"verdict": "queue", "lane": None, "preempt": [_victim("slurm-x-1-aaaa")]}, []),
        ("cancel", _admit(_victim("slurm-x-1-aaaa")), [("scancel", "20")]),
        ("requeue", _admit(_victim("slurm-x-1-aaaa")), [("scontrol", "requeue", "20")]),
        ("requeue", _admit(_victim("slurm-x-1-aaaa", "squatting")), [("scancel", "20")]),
    ],
    ids=[
        "no victims named",
        "not admitted",
        "cancelled by policy",
        "requeued by policy",
        "a squatting victim is cancelled whatever the policy",
    ],
)  # fmt: skip
def test_only_an_admitted_jobs_victims_are_stopped_as_the_policy_says(
    action: str, decision: dict[str, Any], stopped: list[tuple[str, ...]]
) -> None:
    slurm = FakeSlurm("", {}, [
        _line("20", "RUNNING", "poor", "preemptible", "allmende:slurm-x-1-aaaa"),
        _line("22", "PENDING", "rich", "normal", "allmende:slurm-x-2-bbbb", reason="Priority"),
    ])  # fmt: skip
    api = FakeApi([], recorded={"slurm-x-2-bbbb": decision})
    lines: list[str] = []
    client = httpx.Client(base_url="http://api", transport=httpx.MockTransport(api))
    cfg = dataclasses.replace(CFG, preempt_action=action)
    slurm.cfg = cfg
    Agent(cfg, lines.append, slurm=slurm, client=client).run_once()
    assert [c for c in slurm.calls if c[0] == "scancel" or c[1] == "requeue"] == stopped


def test_held_jobs_are_asked_in_fair_share_order_and_pending_jobs_get_their_nice() -> None:
    queued = "allmende: queued: no idle GPUs"
    first = _line("30", "PENDING", "poor", "normal", "allmende:slurm-x-3-cccc", reason="JobHeldAdmin")
    second = _line("31", "PENDING", "rich", "normal", "allmende:slurm-x-4-dddd", reason="JobHeldAdmin")
    settled = _line(
        "32", "PENDING", "rich", "normal", "allmende:slurm-x-5-eeee", reason="Resources", nice="-9000"
    )
    waiting = _line("33", "PENDING", "poor", "normal", "allmende:slurm-x-6-ffff", reason="Resources")
    slurm = FakeSlurm("", {}, [ln.replace("Comment=(null)", f"Comment={queued}") for ln in (first, second)]
                      + [settled, waiting])  # fmt: skip
    # rich is further below its share than broke (poor's project): its held job is asked first
    api = FakeApi([{"verdict": "queue", "lane": None}], factors={"broke": 0.2, "rich": 0.9})
    agent, _log = _agent(slurm, api)
    agent.run_once()
    asked = [c[2]["job_id"] for c in api.calls if c[0] == "/v1/admission"]
    assert asked == ["slurm-x-4-dddd", "slurm-x-3-cccc"]
    nice = [c for c in slurm.calls if c[1] == "update" and c[3].startswith("Nice=")]
    # held jobs keep their Nice (an update must not touch a hold); 32 has rich's already
    assert nice == [("scontrol", "update", "JobId=33", "Nice=-2000")]
    assert nice_of(1.7, 100) == -100 and nice_of(-0.1, 100) == 0
