"""The pieces of the Slurm tests: the local Slurm cluster, the platform, and waiting on both."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allmende.kafka_local import free_port
from allmende.settings import Settings
from tests.integration.harness import MeterWorker, wait_until

ROOT = Path(__file__).resolve().parents[2]
SLURMCTLD = Path("/usr/sbin/slurmctld")
START, STOP = ROOT / "infra/slurm/start.sh", ROOT / "infra/slurm/stop.sh"
JOB_SUBMIT_LUA = ROOT / "integrations/slurm/job_submit.lua"
HOOK = ROOT / "integrations/slurm/hooks/allmende_slurmctld.sh"

SLURM_CLUSTER = "pytest"  # Slurm's ClusterName
PARTITION = "gpu"
PLATFORM_CLUSTER = "slurm-h100"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}  # fmt: skip


@dataclass
class SlurmCluster:
    state: Path
    env: dict[str, str]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def etc(self) -> Path:
        return self.state / "etc"

    @property
    def spool(self) -> Path:
        return self.state / "allmende-spool"

    @property
    def hook_log(self) -> Path:
        return self.spool / "hooks.log"

    @property
    def config_file(self) -> Path:
        return self.etc / "allmende.json"

    def configure(self, **values: Any) -> dict[str, Any]:
        """Write the integration's config (atomically): the base, then `values`."""
        self.config = {**self.base_config(), **values}
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.config, indent=2))
        os.replace(tmp, self.config_file)
        return self.config

    def base_config(self) -> dict[str, Any]:
        return {
            "api_url": "http://127.0.0.1:9",
            "token": "sched-secret",
            "timeout_s": 5,
            "fail_open": False,
            "dry_run": False,
            "clusters": {PARTITION: PLATFORM_CLUSTER},
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

    def wait_done(self, job: str, timeout: float = 60) -> dict[str, str]:
        """The job's sacct row once it ended and its EpilogSlurmctld has run (so a test that
        changes the config next does not change it under a hook still running)."""

        def ended() -> dict[str, str]:
            row = self.sacct(job)
            return row if row and row["State"].split()[0] in TERMINAL else {}

        row = wait_until(ended, timeout, f"Slurm job {job} to end (sacct)")
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
        return (self.state / "log/slurmctld.log").read_text(errors="replace")


def current_quarter(now: dt.datetime) -> str:
    return f"{now.year}-Q{(now.month - 1) // 3 + 1}"


def quarter_bounds(now: dt.datetime) -> tuple[str, str]:
    """The current quarter's first instant and the next quarter's, as the plan writes them."""
    first = dt.datetime(now.year, (now.month - 1) // 3 * 3 + 1, 1, tzinfo=dt.UTC)
    following = dt.datetime(first.year + first.month // 10, (first.month + 2) % 12 + 1, 1, tzinfo=dt.UTC)
    return first.strftime("%Y-%m-%dT%H:%M:%SZ"), following.strftime("%Y-%m-%dT%H:%M:%SZ")


# lab is inside its time-slice window all quarter (8 GPUs guaranteed); team (a plain budget
# project) and spent (over budget) are each used by one agent test only.
PLAN = """
plan: slurm-test
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


@dataclass
class Platform:
    settings: Settings
    url: str
    app: Any
    meter: MeterWorker

    @property
    def admission(self) -> Any:
        return self.app.state.admission

    @property
    def store(self) -> Any:
        return self.app.state.store

    def gpu_seconds(self, job_id: str) -> int | None:
        """The GPU-seconds the ledger charged the job so far (None: nothing yet)."""
        seconds: dict[str, int] = self.store.job_gpu_seconds()
        return seconds.get(job_id)

    def config(self, **values: Any) -> dict[str, Any]:
        """The integration config's platform part: this API, this broker, this topic prefix."""
        return {
            "api_url": self.url,
            "kafka_bootstrap_servers": self.settings.kafka_bootstrap_servers,
            "topic_prefix": self.settings.topic_prefix,
            **values,
        }


def hook_python() -> str:
    return str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable


def wait_for(check: Any, timeout: float, what: str) -> Any:
    return wait_until(check, timeout, what, every=0.2)


@contextlib.contextmanager
def running_slurm(state: Path, hooks: bool = True) -> Iterator[SlurmCluster]:
    """infra/slurm/start.sh in `state` (short: the munge socket path has a length limit) on free
    ports, with Allmende's job_submit.lua and, with `hooks`, its lifecycle hooks; stopped after."""
    env = {
        **os.environ,
        "ALLMENDE_SLURM_DIR": str(state),
        "ALLMENDE_SLURM_CLUSTER": SLURM_CLUSTER,
        "ALLMENDE_SLURM_PARTITIONS": PARTITION,
        "ALLMENDE_SLURM_ACCOUNTS_LIST": "rich,poor,lab,team,spent",
        "ALLMENDE_SLURM_CTLD_PORT": str(free_port()),
        "ALLMENDE_SLURM_SLURMD_PORT": str(free_port()),
        "ALLMENDE_SLURM_DBD_PORT": str(free_port()),
        "ALLMENDE_SLURM_MYSQL_PORT": str(free_port()),
        "ALLMENDE_SLURM_JOB_SUBMIT_LUA": str(JOB_SUBMIT_LUA),
        **(
            {"ALLMENDE_SLURM_PROLOG_SLURMCTLD": str(HOOK), "ALLMENDE_SLURM_EPILOG_SLURMCTLD": str(HOOK)}
            if hooks
            else {}
        ),
        "SLURM_CONF": str(state / "etc/slurm.conf"),
    }
    for leak in ("SLURM_JOB_ID", "SLURM_JOBID", "ALLMENDE_SLURM_CONFIG"):
        env.pop(leak, None)
    cluster = SlurmCluster(state, env)
    cluster.etc.mkdir(parents=True, exist_ok=True)
    cluster.configure()
    try:
        started = subprocess.run([str(START)], env=env, capture_output=True, text=True, timeout=180)
        if started.returncode != 0:
            raise RuntimeError(f"infra/slurm/start.sh failed:\n{started.stdout}\n{started.stderr}")
        yield cluster
    finally:
        subprocess.run([str(STOP)], env=env, capture_output=True, text=True, timeout=180)
