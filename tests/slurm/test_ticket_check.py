"""job_submit.lua's ticket check, run by the real Lua 5.1 interpreter on tickets signed by the
platform's own code (domain/admission_tickets.py): what slurmctld would do with each job, without
slurmctld (the real-Slurm tests in test_slurm_tickets.py show the same end to end).

The driver gives the script the `slurm` table slurmctld gives it (constants and loggers that
print) and a job description as slurmctld passes it, then prints the job description afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from allmende.domain import admission_tickets
from allmende.domain.admission_tickets import Ticket
from allmende.integrations.slurm.local import JOB_SUBMIT_LUA

KEY = "k" * 64
LUA = shutil.which("lua5.1")
DRIVER = r"""
local cjson = require("cjson")
local lines = {}
slurm = {
  SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2002, NO_VAL = 4294967294,
  log_info = function(fmt, ...) lines[#lines + 1] = "info: " .. string.format(fmt, ...) end,
  log_error = function(fmt, ...) lines[#lines + 1] = "error: " .. string.format(fmt, ...) end,
  log_user = function(fmt, ...) lines[#lines + 1] = "user: " .. string.format(fmt, ...) end,
}
dofile(arg[1])
local out = {}
for _, job in ipairs(cjson.decode(io.read("*a"))) do
  lines = {}
  local rc
  if job.modify then -- {modify = {job_desc, job_rec, uid}}: an update of a submitted job
    rc = slurm_job_modify(job.modify[1], job.modify[2], {}, job.modify[3])
  else
    rc = slurm_job_submit(job, {}, 1000)
  end
  out[#out + 1] = { rc = rc, job = job, log = lines }
end
io.write(cjson.encode(out))
"""
pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.1 is not installed (infra/slurm/install.sh)")


def _config(tmp: Path, **values: Any) -> Path:
    key_file = tmp / "ticket.key"
    key_file.write_text(KEY + "\n")
    config = {
        "ticket_key_file": str(key_file), "clusters": {"gpu": "slurm-h100"}, "projects": {"poor": "broke"},
        "gpu_types": {"h100": "H100"}, "spool_dir": str(tmp / "spool"), **values,
    }  # fmt: skip
    (tmp / "spool").mkdir(exist_ok=True)
    path = tmp / "allmende.json"
    path.write_text(json.dumps(config))
    return path


def _submit(tmp: Path, jobs: list[dict[str, Any]], **config: Any) -> list[dict[str, Any]]:
    """Each job through slurm_job_submit in one slurmctld-like Lua state (in order)."""
    env = {"ALLMENDE_SLURM_CONFIG": str(_config(tmp, **config)), "PATH": "/usr/bin:/bin"}
    script = tmp / "driver.lua"
    script.write_text(DRIVER)
    # job_submit.lua loads allmende_slurm.lua from its own directory, as slurmctld's copy does
    done = subprocess.run(
        [str(LUA), str(script), str(JOB_SUBMIT_LUA)], input=json.dumps(jobs), env=env,
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


REQUEST = {
    "project": "rich", "user": "alice", "cluster": "slurm-h100", "gpu_type": "H100", "gpus": 2,
    "priority_class": "standard", "interactive": False, "requested_seconds": 300,
}  # fmt: skip


def _ticket(job_id: str = "slurm-slurm-h100-1-ab", key: str = KEY, **changes: Any) -> str:
    now = int(time.time())
    fields = {**REQUEST, **changes.pop("request", {})}
    ticket = Ticket(job_id, fields, changes.get("verdict", "admit"), changes.get("lane", "budget"), now,
                    now + changes.get("ttl", 300), changes.get("dry_run", False))  # fmt: skip
    return admission_tickets.issue(ticket, key.encode())


def _tampered(ticket: str) -> str:
    """The ticket with its signature's last two characters changed (never to what they were)."""
    tail = "00" if ticket[-2:] != "00" else "11"
    return ticket[:-2] + tail


def _job(ticket: str | None = None, **fields: Any) -> dict[str, Any]:
    job = {
        "account": "rich", "partition": "gpu", "qos": "normal", "tres_per_node": "gres:gpu:h100:2",
        "time_limit": 5, "user_name": "alice", "script": "#!/bin/sh\ntrue\n", **fields,
    }  # fmt: skip
    if ticket is not None:
        job["comment"] = f"allmende-ticket:{ticket} my own words"
    return job


def test_a_valid_ticket_admits_the_job_under_its_id_and_the_comment_is_the_users_again(
    tmp_path: Path,
) -> None:
    [result] = _submit(tmp_path, [_job(_ticket())])
    job = result["job"]
    assert result["rc"] == 0 and job["admin_comment"] == "allmende:slurm-slurm-h100-1-ab", result
    assert job["comment"] == "my own words" and "priority" not in job, result
    # the opportunistic lane moves the job to the preemptible QOS
    [opportunistic] = _submit(tmp_path, [_job(_ticket("slurm-slurm-h100-1-cd", lane="opportunistic"))])
    assert opportunistic["job"]["qos"] == "preemptible", opportunistic


# Tickets are made when the test runs, not when it is collected: they expire.
@pytest.mark.parametrize(
    ("make", "job_changes", "why"),
    [
        (lambda: None, {}, "submitted without an admission"),
        (lambda: _ticket(key="another key"), {}, "signature is wrong"),
        (lambda: _tampered(_ticket()), {}, "signature is wrong"),
        (lambda: _ticket(ttl=-120), {}, "expired"),
        (lambda: _ticket(dry_run=True), {}, "from a dry run"),
        (_ticket, {"tres_per_node": "gres:gpu:h100:8"}, "for gpus 2, the job asks for 8"),
        (_ticket, {"account": "team"}, "for project rich, the job asks for team"),
        (_ticket, {"user_name": "bob"}, "for user alice, the job asks for bob"),
        (_ticket, {"time_limit": 60}, "for 300 s, the job asks for 3600 s"),
        (_ticket, {"qos": "high"}, "priority_class standard, the job asks for non-preemptible"),
        (lambda: "v1.zz.00", {}, "malformed"),
    ],
)
def test_a_job_without_a_valid_ticket_is_held_with_its_request_and_why(
    tmp_path: Path, make: Callable[[], str | None], job_changes: dict[str, Any], why: str
) -> None:
    [result] = _submit(tmp_path, [_job(make(), **job_changes)])
    job = result["job"]
    assert result["rc"] == 0 and job["priority"] == 0, result
    assert why in job["comment"] and job["comment"].startswith("allmende: queued: held until"), result
    tag, request = job["admin_comment"].split(" ")
    stored = json.loads(request.removeprefix("allmende-request:"))
    assert tag == f"allmende:{stored['job_id']}" and stored["job_id"] != "slurm-slurm-h100-1-ab"  # a new id
    assert stored["gpus"] == (8 if "tres_per_node" in job_changes else 2)
    assert any(why in line for line in result["log"] if line.startswith("user: ")), result


def test_a_ticket_is_good_for_one_job_even_after_a_restart(tmp_path: Path) -> None:
    ticket = _ticket("slurm-slurm-h100-1-re")
    first, second = _submit(tmp_path, [_job(ticket), _job(ticket)])
    assert first["job"]["admin_comment"] == "allmende:slurm-slurm-h100-1-re", first
    assert second["job"]["priority"] == 0 and "used by another job" in second["job"]["comment"], second
    # a new Lua state (slurmctld restarted) reads the ids used from the spool
    [third] = _submit(tmp_path, [_job(ticket)])
    assert third["job"]["priority"] == 0 and "used by another job" in third["job"]["comment"], third
    assert "slurm-slurm-h100-1-re" in (tmp_path / "spool/used-tickets").read_text()


def test_a_queue_ticket_holds_the_job_under_the_tickets_id(tmp_path: Path) -> None:
    [result] = _submit(tmp_path, [_job(_ticket("slurm-slurm-h100-1-qq", verdict="queue", lane=None))])
    job = result["job"]
    assert job["priority"] == 0 and job["admin_comment"].startswith("allmende:slurm-slurm-h100-1-qq "), result


def test_dry_run_logs_the_verdict_and_changes_nothing(tmp_path: Path) -> None:
    jobs = [_job(_ticket(verdict="reject", lane=None, dry_run=True)), _job()]
    rejected, unticketed = _submit(tmp_path, jobs, dry_run=True)
    for result in (rejected, unticketed):
        assert "priority" not in result["job"] and "admin_comment" not in result["job"], result
    assert rejected["job"]["comment"] == "my own words"
    assert any("ticket verdict reject, lane none: would reject the job" in ln for ln in rejected["log"]), (
        rejected
    )
    assert any("would hold the job for the agent" in ln for ln in unticketed["log"]), unticketed


def test_a_job_without_gpus_is_not_touched(tmp_path: Path) -> None:
    cpu_only = _job()
    del cpu_only["tres_per_node"]
    [result] = _submit(tmp_path, [cpu_only])
    assert result["job"] == cpu_only and not result["log"], result


NO_VAL, INFINITE = 4294967294, 4294967295
HELD = {"priority": 0, "admin_comment": 'allmende:slurm-x-1-aa allmende-request:{"gpus":1}'}
ADMITTED = {"priority": 1000, "admin_comment": "allmende:slurm-x-1-bb"}


@pytest.mark.parametrize(
    ("change", "record", "uid", "refused"),
    [
        ({"priority": INFINITE}, HELD, 1000, True),  # the owner's `scontrol release`
        ({"priority": INFINITE}, HELD, 0, False),  # the agent's (root)
        ({"priority": 0}, HELD, 1000, False),  # holding it again
        ({"priority": NO_VAL, "comment": "mine"}, HELD, 1000, False),  # its comment
        ({"priority": NO_VAL, "tres_per_node": "gres:gpu:h100:8"}, ADMITTED, 1000, True),
        ({"priority": NO_VAL, "account": "team"}, ADMITTED, 1000, True),
        ({"priority": NO_VAL, "min_nodes": 2}, ADMITTED, 1000, True),
        ({"priority": NO_VAL, "min_nodes": NO_VAL, "time_limit": NO_VAL}, ADMITTED, 1000, False),
        ({"priority": NO_VAL, "tres_per_node": "gres:gpu:h100:8"}, ADMITTED, 0, False),
        ({"priority": INFINITE}, {"priority": 0, "admin_comment": "their own"}, 1000, False),  # not ours
    ],
)
def test_the_owner_can_neither_release_a_held_job_nor_change_what_an_admitted_one_asks(
    tmp_path: Path, change: dict[str, Any], record: dict[str, Any], uid: int, refused: bool
) -> None:
    [result] = _submit(tmp_path, [{"modify": [change, record, uid]}])
    assert (result["rc"] == 2002) is refused and (result["rc"] == 0) is not refused, result
    if refused:
        assert any("refused" in line for line in result["log"]), result
