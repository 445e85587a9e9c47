"""A real Slurm 22.05 (infra/slurm) with Allmende's job_submit.lua and lifecycle hooks, and the
platform (API with its ledger writer, a meter worker) on the shared test broker and chDB.

The Slurm cluster is one per session, in its own state directory and on free ports; the platform
is one per module (its own topic prefix and database). The integration's config file
(`<state>/etc/allmende.json`) is rewritten by each test for what it needs: job_submit.lua reads it
at every submission and the hooks at every run, so no reload is needed.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.testing.budget_harness import plan_text
from allmende.testing.slurm_harness import (
    PLAN,
    PLATFORM_CLUSTER,
    ROOT,
    SLURMCTLD,
    Platform,
    SlurmCluster,
    current_quarter,
    hook_python,
    quarter_bounds,
    running_platform,
    running_slurm,
    wait_for,
)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if not SLURMCTLD.exists():
        pytest.skip(f"{SLURMCTLD} is missing: install Slurm with infra/slurm/install.sh")
    if os.geteuid() != 0:
        pytest.skip("infra/slurm/start.sh runs the Slurm daemons as root")
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not on PATH (slurm-client)")
    # Under /tmp itself, reachable by the unprivileged test user (pytest's base directory is
    # root's alone): its commands read slurm.conf and the munge socket there.
    state = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    state.chmod(0o755)
    try:
        with running_slurm(state) as cluster:
            yield cluster
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def platform(
    slurm: SlurmCluster, kafka_bootstrap: str, chdb_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """The API (real clock) with the quarter's plan applied, and a meter worker."""
    now = dt.datetime.now(dt.UTC)
    start, end = quarter_bounds(now)
    text = plan_text(PLAN.format(period=current_quarter(now), cluster=PLATFORM_CLUSTER, start=start, end=end))
    tmp = tmp_path_factory.mktemp("platform")
    with running_platform(kafka_bootstrap, chdb_dsn, tmp, text,
                          admission_ticket_key_file=slurm.ticket_key_file) as platform:  # fmt: skip
        yield platform


class RunningAgent:
    """`python -m allmende.integrations.slurm.agent` as a process, with its log read from where it was."""

    def __init__(self, slurm: SlurmCluster, stderr: Path) -> None:
        self.slurm = slurm
        self.log_file = slurm.spool / "agent.log"
        self.offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        command = [
            hook_python(),
            "-m",
            "allmende.integrations.slurm.agent",
            "--config",
            str(slurm.config_file),
        ]
        self.stderr = stderr.open("w")
        self.proc = subprocess.Popen(
            [*command, "--interval", "1"],
            cwd=ROOT,
            env=slurm.env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )

    def log(self) -> str:
        if not self.log_file.exists():
            return ""
        with self.log_file.open() as f:
            f.seek(self.offset)
            return f.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.stderr.close()


@pytest.fixture
def agent(slurm: SlurmCluster, platform: Platform, tmp_path: Path) -> Iterator[RunningAgent]:
    slurm.cancel_all()  # each test finds the node to itself
    slurm.configure(**platform.config())
    running = RunningAgent(slurm, tmp_path / "agent.err")
    try:
        wait_for(lambda: "agent started" in running.log(), 30, "the agent to start")
        yield running
    finally:
        running.stop()
        slurm.configure(**platform.config())
