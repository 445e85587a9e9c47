"""A local Slurm 22.05 with Allmende's plugin and hooks, and the quarter plan it is tried with:
what `tests/slurm`, `bench/slurm_submit.py` and the demo (`integrations/slurm/demo.py`) share.

`infra/slurm/start.sh` runs the daemons in one state directory on the ports given here;
`SlurmCluster` writes the integration's config (`<state>/etc/allmende.json`, read by the plugin at
every submission and by the hooks at every run) and wraps the client commands.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allmende.core.kafka_local import free_port
from allmende.core.supervisor import wait_until

ROOT = Path(__file__).resolve().parents[2]
SLURMCTLD = Path("/usr/sbin/slurmctld")
START, STOP = ROOT / "infra/slurm/start.sh", ROOT / "infra/slurm/stop.sh"
JOB_SUBMIT_LUA = ROOT / "integrations/slurm/job_submit.lua"
CLI_FILTER_LUA = ROOT / "integrations/slurm/cli_filter.lua"
SUBMIT_TOKEN = "submit-secret"  # the platform's ALLMENDE_SUBMIT_TOKENS: cli_filter's token
HOOK = ROOT / "integrations/slurm/hooks/allmende_slurmctld.sh"
NODE_HOOK = ROOT / "integrations/slurm/hooks/dcgm_job_mapping.sh"  # the node's Prolog and Epilog

PARTITION = "gpu"
PLATFORM_CLUSTER = "slurm-h100"
ACCOUNTS = ("rich", "poor", "lab", "team", "spent")  # Slurm accounts; `poor` is the project `broke`
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}  # fmt: skip


def hook_python() -> str:
    """The interpreter the hooks and the agent run: the checkout's virtualenv if there is one."""
    venv = ROOT / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


@dataclass
class SlurmCluster:
    state: Path
    env: dict[str, str]
    token: str = ""  # the scheduler token the plugin and the agent send
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def etc(self) -> Path:
        return self.state / "etc"

    @property
    def dcgm_mapping_dir(self) -> Path:
        """Where the node's prolog writes dcgm-exporter's per-GPU job files (start.sh's default)."""
        return self.state / "dcgm-jobs"

    @property
    def spool(self) -> Path:
        return self.state / "allmende-spool"

    @property
    def hook_log(self) -> Path:
        return self.spool / "hooks.log"

    @property
    def agent_log(self) -> Path:
        return self.spool / "agent.log"

    @property
    def ctld_log_file(self) -> Path:
        return self.state / "log/slurmctld.log"

    @property
    def config_file(self) -> Path:
        return self.etc / "allmende.json"

    @property
    def ticket_key_file(self) -> Path:
        return self.etc / "allmende-ticket.key"

    def configure(self, **values: Any) -> dict[str, Any]:
        """Write the integration's config (atomically): the base, then `values`. Readable by
        every user (cli_filter.lua runs as the user); the ticket key only by root."""
        self.config = {**self.base_config(), **values}
        self.etc.mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)  # job_submit.lua keeps the tickets used there
        if not self.ticket_key_file.exists():
            self.ticket_key_file.touch(mode=0o600)
            self.ticket_key_file.write_text(secrets.token_hex(32) + "\n")  # the platform reads it too
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.config, indent=2))
        tmp.chmod(0o644)
        os.replace(tmp, self.config_file)
        return self.config

    def base_config(self) -> dict[str, Any]:
        return {
            "api_url": "http://127.0.0.1:9",
            "token": self.token,
            "submit_token": SUBMIT_TOKEN,
            "ticket_key_file": str(self.ticket_key_file),
            "timeout_s": 5,
            "fail_open": False,
            "dry_run": False,
            "clusters": {PARTITION: PLATFORM_CLUSTER},
            "default_partition": PARTITION,  # cli_filter asks scontrol otherwise (a round trip per job)
            "projects": {"poor": "broke"},
            "gpu_types": {"h100": "H100"},
            "default_gpu_type": "H100",
            "priority_classes": {
                "preemptible": "preemptible",
                "normal": "standard",
                "high": "non-preemptible",
            },
            "preemptible_qos": "preemptible",
            "default_hours": 1,
            "spool_dir": str(self.spool),
            "send_timeout_s": 5,
        }

    def env_without_cli_filter(self, where: Path) -> dict[str, str]:
        """The client environment of a user who skips cli_filter.lua (as anyone can: it runs on
        their side): a copy of slurm.conf without CliFilterPlugins, in `where`."""
        conf = where / "slurm.conf"
        lines = (self.etc / "slurm.conf").read_text().splitlines()
        conf.write_text("\n".join(ln for ln in lines if not ln.startswith("CliFilterPlugins")) + "\n")
        conf.chmod(0o644)
        where.chmod(0o755)
        return {**self.env, "SLURM_CONF": str(conf)}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("sbatch", "--parsable", "-o", "/dev/null", *args)

    def sacct(self, job: str) -> dict[str, str]:
        """The job's allocation row (no steps), as a dict; {} while slurmdbd has none."""
        fields = ["JobID", "State", "ElapsedRaw", "AllocTRES", "AdminComment", "Start", "End"]
        out = self.run("sacct", "-j", job, "-X", "-n", "-P", "-o", ",".join(fields)).stdout
        for line in out.splitlines():
            row = dict(zip(fields, line.split("|"), strict=False))
            if row.get("JobID") == job:
                return row
        return {}

    def ended(self, job: str) -> dict[str, str]:
        """The job's sacct row once it is in a terminal state, else {}."""
        row = self.sacct(job)
        return row if row and row["State"].split()[0] in TERMINAL else {}

    def wait_done(self, job: str, timeout: float = 60) -> dict[str, str]:
        """The job's sacct row once it ended and its EpilogSlurmctld has run (so a test that
        changes the config next does not change it under a hook still running)."""
        row = wait_until(lambda: self.ended(job), timeout, f"Slurm job {job} to end (sacct)")
        wait_until(lambda: self.hook_ran("epilog", job), timeout, f"the epilog of Slurm job {job}")
        return row

    def hook_ran(self, kind: str, job: str) -> str | None:
        """The hook log's line for `kind` (prolog|epilog) of `job`, if it ran."""
        if not self.hook_log.exists():
            return None
        lines = self.hook_log.read_text().splitlines()
        return next((ln for ln in reversed(lines) if f" {kind}: job {job} " in ln), None)

    def runs(self, job: str) -> list[dict[str, str]]:
        """Every run of the job (`sacct -D`: a requeued job has one row per run)."""
        fields = ["JobID", "State", "ElapsedRaw", "AllocTRES", "Start", "End"]
        out = self.run("sacct", "-D", "-j", job, "-X", "-n", "-P", "-o", ",".join(fields)).stdout
        rows = [dict(zip(fields, line.split("|"), strict=False)) for line in out.splitlines()]
        return [row for row in rows if row.get("JobID") == job]

    def platform_id(self, job: str) -> str | None:
        """The id the hooks published the job under (from the hook log)."""
        line = self.hook_ran("prolog", job) or ""
        m = re.search(r" as (\S+): ", line)
        return m.group(1) if m else None

    def squeue(self, job: str, fmt: str) -> str:
        return self.run("squeue", "-h", "-j", job, "-o", fmt).stdout.strip()

    def ctld_log(self) -> str:
        return self.ctld_log_file.read_text(errors="replace")

    def described(self) -> str:
        """The queue, the nodes and the tail of slurmctld's log: what a failed wait reports."""
        queue = self.run("squeue", "-h", "-o", "%i %a %q %T %r %Q %b %k").stdout.strip()
        nodes = self.run("sinfo", "-h", "-N", "-o", "%N %T %G %E").stdout.strip()
        alloc = self.run("scontrol", "show", "node", "-o").stdout.strip()
        tail = self.ctld_log().splitlines()[-15:] if self.ctld_log_file.exists() else []
        return "\n".join(
            ["squeue:", queue or "(empty)", "sinfo:", nodes, "node:", alloc, "slurmctld.log:", *tail]
        )

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until the queue is empty and every node idle: a test that
        needs the whole node must not find another test's run on it."""
        self.run("scancel", "-u", getpass.getuser())

        def quiet() -> bool:
            queue = self.run("squeue", "-h", "-o", "%i").stdout.split()
            states = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
            return not queue and bool(states) and all(s == "idle" for s in states)

        try:
            wait_until(quiet, timeout, "Slurm's queue to empty and its nodes to be idle")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.described()}") from None


def slurm_env(
    state: Path,
    cluster_name: str,
    accounts: tuple[str, ...] = ACCOUNTS,
    hooks: bool = True,
    cli_filter: bool = True,
    users: tuple[str, ...] = ("root",),
) -> dict[str, str]:
    """The environment of infra/slurm/start.sh and of the client commands: the state directory
    (short: the munge socket path has a length limit), free ports, Allmende's job_submit.lua and
    cli_filter.lua and, with `hooks`, its lifecycle hooks."""
    env = {
        **os.environ,
        "ALLMENDE_SLURM_DIR": str(state),
        "ALLMENDE_SLURM_CLUSTER": cluster_name,
        "ALLMENDE_SLURM_PARTITIONS": PARTITION,
        "ALLMENDE_SLURM_ACCOUNTS_LIST": ",".join(accounts),
        "ALLMENDE_SLURM_USERS": ",".join(users),  # each in every account
        "ALLMENDE_SLURM_CTLD_PORT": str(free_port()),
        "ALLMENDE_SLURM_SLURMD_PORT": str(free_port()),
        "ALLMENDE_SLURM_DBD_PORT": str(free_port()),
        "ALLMENDE_SLURM_MYSQL_PORT": str(free_port()),
        "ALLMENDE_SLURM_JOB_SUBMIT_LUA": str(JOB_SUBMIT_LUA),
        "ALLMENDE_SLURM_CLI_FILTER_LUA": str(CLI_FILTER_LUA) if cli_filter else "none",
        **(
            {
                "ALLMENDE_SLURM_PROLOG_SLURMCTLD": str(HOOK),
                "ALLMENDE_SLURM_EPILOG_SLURMCTLD": str(HOOK),
                "ALLMENDE_SLURM_PROLOG": str(NODE_HOOK),
                "ALLMENDE_SLURM_EPILOG": str(NODE_HOOK),
            }
            if hooks
            else {}
        ),
        "SLURM_CONF": str(state / "etc/slurm.conf"),
    }
    for leak in ("SLURM_JOB_ID", "SLURM_JOBID", "ALLMENDE_SLURM_CONFIG"):
        env.pop(leak, None)
    return env


def start_slurm(cluster: SlurmCluster, timeout: float = 180) -> None:
    """infra/slurm/start.sh for `cluster` (its config written first); RuntimeError if it fails."""
    cluster.configure()
    started = subprocess.run([str(START)], env=cluster.env, capture_output=True, text=True, timeout=timeout)
    if started.returncode != 0:
        raise RuntimeError(f"infra/slurm/start.sh failed:\n{started.stdout}\n{started.stderr}")


def stop_slurm(env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """infra/slurm/stop.sh for the state directory in `env` (safe when nothing runs)."""
    return subprocess.run([str(STOP)], env=env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def running_slurm(
    state: Path,
    cluster_name: str,
    hooks: bool = True,
    token: str = "",
    accounts: tuple[str, ...] = ACCOUNTS,
    users: tuple[str, ...] = ("root",),
) -> Iterator[SlurmCluster]:
    """Slurm started in `state` on free ports (see `slurm_env`), stopped after."""
    cluster = SlurmCluster(state, slurm_env(state, cluster_name, accounts, hooks, users=users), token=token)
    try:
        start_slurm(cluster)
        yield cluster
    finally:
        stop_slurm(cluster.env)


def current_quarter(now: dt.datetime) -> str:
    return f"{now.year}-Q{(now.month - 1) // 3 + 1}"


def quarter_bounds(now: dt.datetime) -> tuple[str, str]:
    """The current quarter's first instant and the next quarter's, as the plan writes them."""
    first = dt.datetime(now.year, (now.month - 1) // 3 * 3 + 1, 1, tzinfo=dt.UTC)
    following = dt.datetime(first.year + first.month // 10, (first.month + 2) % 12 + 1, 1, tzinfo=dt.UTC)
    return first.strftime("%Y-%m-%dT%H:%M:%SZ"), following.strftime("%Y-%m-%dT%H:%M:%SZ")


# rich has budget; broke is over budget (1 GPU-hour); lab is inside its time-slice window all
# quarter (8 GPUs guaranteed); team is another budget project, spent another over-budget one.
_PLAN = """
plan: {name}
period: {period}
clusters:
  - {{name: {cluster}, gpu_type: H100, gpus: 8}}
organisation:
  - {{id: institute, kind: organisation, shares: 100}}
  - {{id: rich, parent: institute, kind: project, shares: 50}}
  - {{id: broke, parent: institute, kind: project, shares: 50}}
  - {{id: lab, parent: institute, kind: project, shares: 50}}
  - {{id: team, parent: institute, kind: project, shares: 50}}
  - {{id: spent, parent: institute, kind: project, shares: 50}}
allocations:
  - {{project: rich, gpu_hours: 1000}}
  - {{project: broke, gpu_hours: 1}}
  - {{project: lab, gpu_hours: 100}}
  - {{project: team, gpu_hours: 1000}}
  - {{project: spent, gpu_hours: 1}}
agreements:
  - {{id: lab-quarter, project: lab, cluster: {cluster}, gpus: 8, fixed: {{start: {start}, end: {end}}}}}
"""
# The tests' template: PLAN.format(period=..., cluster=..., start=..., end=...).
PLAN = _PLAN.replace("{name}", "slurm-test")


def plan_text(now: dt.datetime, name: str, cluster: str = PLATFORM_CLUSTER) -> str:
    """The plan for the quarter of `now`, with `cluster` (Slurm's partition maps to it)."""
    start, end = quarter_bounds(now)
    return _PLAN.format(
        name=name, period=current_quarter(now), cluster=cluster, start=start, end=end
    ).lstrip()
