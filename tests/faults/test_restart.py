"""Processes come back (issue 22): the real `allmende up`, `status` and `down`, as a user runs them,
on a state directory, ports and topics of the test's own (its own local broker too).

With a few ElasticFlow jobs metered, each process is killed in turn with SIGKILL (the broker, the
meter worker, the API with its ledger writer); `allmende status` then says which one is down, and
`allmende up` starts that one again, keeps the others and waits for the API's /healthz, saying how
long the API took. Afterwards every process runs, the API is healthy, the ledger holds the jobs
metered before exactly once, and jobs replayed after the restarts are metered too, to the
GPU-second. Last, with everything stopped, pid files naming live processes that are not the
components (a `sleep` whose pid was "reused", the test's own pid in an older pid file) are not
taken for them: `status` says so, `up` starts the real ones, and neither `up` nor `down` signals
the unrelated processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from allmende.core import supervisor
from allmende.core.kafka_local import free_port
from allmende.core.supervisor import PidRecord, wait_until
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="the local Kafka broker needs Java"),
    pytest.mark.skipif(not supervisor.proc_available(), reason="pid identity needs Linux's /proc"),
]

REPO = Path(__file__).resolve().parents[2]
# Jobs replayed before the kills, and after them (another cluster, so the counts are apart).
BEFORE = ("cluster01", 20)
AFTER = ("cluster02", 10)
UP_TIMEOUT_S = 420  # `up` waits up to 180 s for the broker, then up to 180 s for the API
METERED_WITHIN_S = 180
PLAN = """\
    plan: restart-check
    period: {start: 2021-03-01, end: 2021-06-01}
    clusters:
      - {name: ef-cluster01, gpu_type: V100, gpus: 384}
      - {name: ef-cluster02, gpu_type: V100, gpus: 384}
    organisation:
      - {id: institute, kind: organisation, shares: 100}
      - {id: ef-cluster01, parent: institute, kind: project, shares: 50}
      - {id: ef-cluster02, parent: institute, kind: project, shares: 50}
    policy:
      id: flat-2021
      effective_from: 2021-01-01T00:00:00Z
      gpu_type_weights: {V100: 1.00}
      priority_multipliers: {preemptible: 1.00, standard: 1.00, non-preemptible: 1.00}
      interactive_rate: 1.00
    allocations:
      - {project: ef-cluster01, gpu_hours: 1000}
      - {project: ef-cluster02, gpu_hours: 1000}
"""
API_HEALTHY = re.compile(r"API healthy in (\d+(?:\.\d+)?) s")


def _port_pair() -> int:
    """A free port whose next one is free too (`allmende up` puts the controller there)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free ports in a row")


@dataclass
class Platform:
    """The `allmende` command of the dev virtualenv, on the test's own state directory."""

    env: dict[str, str]
    cwd: Path
    state: Path
    api_url: str

    def run(self, *args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "allmende", *args]
        return subprocess.run(
            argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=timeout
        )

    def ok(self, *args: str, timeout: float = UP_TIMEOUT_S) -> str:
        done = self.run(*args, timeout=timeout)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"allmende {' '.join(args)} exited {done.returncode}:\n{output[-6000:]}"
        return output

    def up(self) -> str:
        try:
            return self.ok("up")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def status(self) -> tuple[int, dict[str, Any]]:
        done = self.run("status", "--json", timeout=60)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def pid_file(self, component: str) -> Path:
        return (
            self.state / "kafka" / "broker.pid"
            if component == "broker"
            else self.state / "run" / f"{component}.pid"
        )

    def logs(self) -> str:
        parts = []
        kafka, run = self.state / "kafka", self.state / "run"
        for log in (kafka / "broker.log", kafka / "kafka-server.log", run / "worker.log", run / "api.log"):
            text = log.read_text(errors="replace") if log.exists() else "<none>"
            parts.append(f"--- the end of {log}:\n{text[-3000:]}")
        return "\n".join(parts)

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.state / 'admin-token').read_text().strip()}"}

    def total(self, project: str) -> int | None:
        try:
            response = httpx.get(
                f"{self.api_url}/v1/projects/{project}/usage", headers=self.admin(), timeout=30
            )
        except httpx.HTTPError:
            return None
        return int(response.json()["total_gpu_seconds"]) if response.status_code == 200 else None

    def wait_for_totals(self, expected: dict[str, int]) -> None:
        def exact() -> bool:
            return all(self.total(project) == total for project, total in expected.items())

        try:
            wait_until(exact, METERED_WITHIN_S, f"the ledger totals {expected}", every=1.0)
        except TimeoutError as exc:
            found = {project: self.total(project) for project in expected}
            raise AssertionError(f"{exc}; found {found}\n{self.logs()}") from None


def _all_running(platform: Platform) -> dict[str, Any]:
    code, report = platform.status()
    components = report["components"]
    assert code == 0 and report["ok"], json.dumps(report, indent=2)
    assert all(c["running"] and c["state"] == "running" for c in components.values()), components
    assert all(isinstance(c["pid"], int) and c["uptime_s"] is not None for c in components.values()), (
        components
    )
    assert components["api"]["healthz"]["status_code"] == 200, components["api"]
    assert components["api"]["healthz"]["body"]["status"] == "ok", components["api"]
    return dict(components)


def _gone(pid: int) -> Callable[[], bool]:
    return lambda: not supervisor.alive(pid)


def _wait(check: Callable[[], bool], what: str) -> None:
    wait_until(check, 30, what, every=0.1)


def test_killed_processes_come_back_with_up_and_the_ledger_stays_exact(
    elasticflow_tarball: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    state = tmp_path / "state"
    work = tmp_path / "work"
    work.mkdir()
    api_port = free_port()
    kafka_port = _port_pair()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALLMENDE_", "KAFKA_", "COV_CORE_")) and k != "XDG_STATE_HOME"
    }
    env.update(
        {
            "ALLMENDE_STATE_DIR": str(state),
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
            "ALLMENDE_API_PORT": str(api_port),
            "ALLMENDE_METER_METRICS_PORT": "0",
            "ALLMENDE_TOPIC_PREFIX": f"restart{uuid.uuid4().hex[:10]}",
            "ALLMENDE_TOPIC_PARTITIONS": "2",
            "ALLMENDE_LOG_JSON": "false",
            "ALLMENDE_KAFKA_JARS": os.environ.get(
                "ALLMENDE_KAFKA_JARS", str(REPO / "infra" / "kafka" / "lib")
            ),
            "COLUMNS": "200",  # rich: `up`'s lines unwrapped
        }
    )
    platform = Platform(env, work, state, f"http://127.0.0.1:{api_port}")
    expected: dict[str, int] = {}
    times: list[float] = []
    unrelated = subprocess.Popen(["sleep", "900"])
    try:
        # Before: up, a plan, jobs metered.
        first = platform.up()
        assert API_HEALTHY.search(first), first
        running = _all_running(platform)
        plan = work / "plan.yaml"
        plan.write_text(textwrap.dedent(PLAN))
        assert "changes applied" in platform.ok("budget", "apply", str(plan))
        cluster, limit = BEFORE
        jobs = list(read_trace(elasticflow_tarball, TraceFormat.ELASTICFLOW, cluster=cluster, limit=limit))
        expected[f"ef-{cluster}"] = sum(j.gpu_seconds for j in jobs)
        replay = ["replay", str(elasticflow_tarball), "--format", "elasticflow"]
        assert f"{limit} jobs" in platform.ok(*replay, "--cluster", cluster, "--limit", str(limit))
        platform.wait_for_totals(expected)

        # Each process killed in turn; `status` sees it; `up` brings it back.
        for component in ("broker", "worker", "api"):
            pid = running[component]["pid"]
            os.kill(pid, signal.SIGKILL)
            _wait(_gone(pid), f"pid {pid} ({component}) to die")
            code, report = platform.status()
            assert code != 0 and not report["ok"], report
            down = report["components"][component]
            assert not down["running"] and down["state"] in ("dead", "zombie"), down
            output = platform.up()
            assert re.search(rf"started again \(pid \d+; pid {pid} (is gone|is a zombie)\)", output), output
            if component == "api":
                healthy = API_HEALTHY.search(output)
                assert healthy, f"up did not report the API's time to healthy:\n{output}"
                times.append(float(healthy.group(1)))
            else:
                assert "API healthy (already running" in output or API_HEALTHY.search(output), output
            after = _all_running(platform)
            assert after[component]["pid"] != pid, after
            running = after
        assert times, "no time to healthy reported"
        record_property("api_time_to_healthy_s", times[0])
        print(f"\nthe API healthy again {times[0]:.1f} s after `allmende up` restarted it")

        # Nothing counted twice, nothing lost; the restarted pipeline meters new jobs.
        cluster, limit = AFTER
        jobs = list(read_trace(elasticflow_tarball, TraceFormat.ELASTICFLOW, cluster=cluster, limit=limit))
        expected[f"ef-{cluster}"] = sum(j.gpu_seconds for j in jobs)
        assert f"{limit} jobs" in platform.ok(*replay, "--cluster", cluster, "--limit", str(limit))
        platform.wait_for_totals(expected)

        # Pid files naming live processes that are not the components.
        platform.ok("down")
        code, report = platform.status()
        assert code != 0 and {c["state"] for c in report["components"].values()} == {"stopped"}, report
        real = PidRecord.of(unrelated.pid)
        assert real.start_ticks is not None
        fakes = {
            # the broker's pid, since given to the `sleep` (it started later than recorded)
            "broker": PidRecord(unrelated.pid, real.start_ticks - 100, real.boot_id).render(),
            # an older pid file with the test's own pid: live, but not known to be the worker
            "worker": f"{os.getpid()}\n",
            # the test's own pid, recorded with another start time
            "api": PidRecord(
                os.getpid(), (PidRecord.of(os.getpid()).start_ticks or 0) + 1, real.boot_id
            ).render(),
        }
        for component, text in fakes.items():
            platform.pid_file(component).parent.mkdir(parents=True, exist_ok=True)
            platform.pid_file(component).write_text(text)
        code, report = platform.status()
        states = {name: (c["state"], c["running"]) for name, c in report["components"].items()}
        assert code != 0 and states == {
            "broker": ("reused", False),
            "worker": ("unverified", False),
            "api": ("reused", False),
        }, report
        output = platform.up()
        assert output.count("started again") == 3, output
        assert API_HEALTHY.search(output), output
        started = _all_running(platform)
        assert not {c["pid"] for c in started.values()} & {unrelated.pid, os.getpid()}, started
        assert unrelated.poll() is None, "up signalled an unrelated process"
        platform.wait_for_totals(expected)  # the ledger, as it was, after a stop and a start
        platform.ok("down")
        assert unrelated.poll() is None, "down signalled an unrelated process"
        for component in ("broker", "worker", "api"):
            assert not supervisor.alive(started[component]["pid"]), f"{component} still runs after down"
    finally:
        platform.run("down", timeout=180)
        unrelated.kill()
        unrelated.wait()
