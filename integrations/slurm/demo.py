"""`make slurm-demo`: a real Slurm on localhost uses the platform, and shows what it did.

    python -m allmende.integrations.slurm.demo [--keep] [--state DIR]    # `make slurm-demo`
    python -m allmende.integrations.slurm.demo --stop [--state DIR]      # stop what --keep left running

It starts, in `.allmende/slurm-demo` and on free ports:

- Slurm 22.05 (`infra/slurm/start.sh`: munge, slurmdbd on MariaDB, slurmctld and slurmd with 8
  fake h100 GPUs) with Allmende's job_submit.lua and its PrologSlurmctld/EpilogSlurmctld hook;
- the platform: a local Kafka broker, a meter worker (`allmende worker`) and the API with its
  ledger writer on embedded chDB, with a plan for the current quarter (`integrations/slurm/local.py`);
- the integration's config (`allmende.json`) and the Slurm agent (`--interval 1`).

Then it submits a small mixed workload with sbatch and srun (in budget; opportunistic, requeued
when a time-slice project needs the GPUs; interactive; over budget and refused; two jobs on a
node that is drained; a job squatting its GPUs, seen idle through an exporter stand-in and the
collector, flagged on the squatting page) and prints, per job, what the platform decided, how
Slurm ended it and what the ledger charged against what `sacct` accounts. Everything stops at the
end unless `--keep`.

The API process is `allmende.topology.create_app` as `allmende serve` runs it, plus one read-only
route of the demo's own (`GET /demo/ledger`, admin token): the ledger's GPU-seconds per job and
the admission decisions, which the public API does not list per job.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from fastapi import HTTPException, Request
from rich.console import Console
from rich.table import Table

from allmende.core.supervisor import python_module, running, start_detached, stop_detached, wait_until
from allmende.integrations.slurm.local import (
    ROOT,
    SLURMCTLD,
    SUBMIT_TOKEN,
    SlurmCluster,
    hook_python,
    plan_text,
    slurm_env,
    start_slurm,
    stop_slurm,
)

STATE = ROOT / ".allmende" / "slurm-demo"
# The squatting step: a recorded dcgm-exporter scrape (the shared data beside the checkout) served
# by a stand-in as the node's exporter; the collector's period; the demo's grace period; how long
# the idle job holds its GPUs.
RECORDED_SCRAPE = ROOT.parent / "shared" / "data" / "dcgm" / "l4-gpu-operator.prom"
SCRAPE_S = 10
SQUAT_GRACE_S = 60
SQUAT_RUN_S = 120
SLURM_NAME = "demo"  # Slurm's ClusterName
TOPIC_PREFIX = "allmende"
REASON = "xid 79 on GPU 3, fallen off the bus (demo)"
# A batch job that runs long the first time and briefly once requeued: a requeued job's rerun
# shows in sacct and in the ledger without making anyone wait.
LONG_THEN_SHORT = "sleep $(( ${SLURM_RESTART_COUNT:-0} > 0 ? 3 : 300 ))"


@dataclass(frozen=True)
class Paths:
    state: Path

    @property
    def slurm(self) -> Path:
        return self.state / "slurm"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def kafka(self) -> Path:
        return self.state / "kafka"

    @property
    def admin_token(self) -> Path:
        return self.state / "admin-token"  # where `allmende` finds it with ALLMENDE_RUN_DIR=<state>/run

    @property
    def scheduler_token(self) -> Path:
        return self.state / "scheduler-token"


@dataclass
class DemoJob:
    """One job of the workload and what became of it."""

    label: str
    account: str
    asked: str
    gpus: int
    slurm_id: str | None = None
    platform_id: str | None = None
    said: str = ""  # what sbatch/srun printed on stderr
    final: str = ""
    sacct_gpu_s: int | None = None
    ledger_gpu_s: int | None = None
    verdict: str = ""
    story: list[str] = field(default_factory=list)

    @property
    def accounted(self) -> str:
        return f"{self.final}; sacct {self.sacct_gpu_s} GPU-s, ledger {self.ledger_gpu_s} GPU-s"


# -- the processes ---------------------------------------------------------------------------------


def _write_secret(path: Path) -> str:
    token = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(token)
    return token


def platform_env(
    paths: Paths, kafka: str, api_port: int, admin: str, scheduler: str, ticket_key: Path
) -> dict[str, str]:
    """The environment of the API and the meter worker: everything under the demo's state dir.
    Inherited ALLMENDE_* settings are dropped so that the demo never uses another deployment's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLMENDE_")}
    env.update(
        {
            "KAFKA_BOOTSTRAP_SERVERS": kafka,
            "ALLMENDE_TOPIC_PREFIX": TOPIC_PREFIX,
            "ALLMENDE_TOPIC_PARTITIONS": "2",
            "ALLMENDE_CLICKHOUSE_DSN": f"chdb://{paths.state / 'chdb'}",
            "ALLMENDE_METER_APP_ID": "allmende-slurm-demo-meter",
            "ALLMENDE_METER_DATA_DIR": str(paths.state / "faust"),
            "ALLMENDE_METER_METRICS_PORT": "0",
            "ALLMENDE_WRITER_BATCH_WAIT_MS": "100",
            "ALLMENDE_API_PORT": str(api_port),
            "ALLMENDE_ADMIN_TOKENS": f"admin:{admin}",
            "ALLMENDE_SCHEDULER_TOKENS": f"slurm:{scheduler}",
            "ALLMENDE_SUBMIT_TOKENS": f"cli:{SUBMIT_TOKEN}",
            "ALLMENDE_ADMISSION_TICKET_KEY_FILE": str(ticket_key),
            "ALLMENDE_RUN_DIR": str(paths.run),
            "ALLMENDE_KAFKA_HOME": str(paths.kafka),
            "ALLMENDE_LOG_JSON": "false",
            "ALLMENDE_SQUAT_GRACE_S": str(SQUAT_GRACE_S),  # minutes, not half an hour: a demo
        }
    )
    return env


def _start_detached(paths: Paths, name: str, command: list[str], env: dict[str, str]) -> None:
    """`command` in its own session (it outlives the demo with --keep), its output in
    run/<name>.log, its pid in run/<name>.pid."""
    start_detached(paths.run / f"{name}.pid", paths.run / f"{name}.log", command, env)


def _slurm_stop_env(paths: Paths) -> dict[str, str]:
    return {
        **os.environ,
        "ALLMENDE_SLURM_DIR": str(paths.slurm),
        "SLURM_CONF": str(paths.slurm / "etc/slurm.conf"),
    }


def stop_all(paths: Paths, say: Callable[[str], None]) -> bool:
    """Stop what a demo started in `paths.state` (by pid files): the agent, Slurm, the API, the
    meter worker, Kafka. Safe when nothing runs; False if nothing did."""
    stopped = False
    if stop_detached(paths.run / "agent.pid"):
        say("stopped the Slurm agent")
        stopped = True
    if (paths.slurm / "etc/slurm.conf").exists():
        done = stop_slurm(_slurm_stop_env(paths))
        if "stopped" in done.stdout:
            say("stopped Slurm (slurmd, slurmctld, slurmdbd, MariaDB, munged)")
            stopped = True
    for name, what in (("api", "the API"), ("worker", "the meter worker")):
        if stop_detached(paths.run / f"{name}.pid"):
            say(f"stopped {what}")
            stopped = True
    if stop_detached(paths.kafka / "broker.pid"):
        say("stopped Kafka")
        stopped = True
    return stopped


# -- the API process ---------------------------------------------------------------------------------


def serve_platform() -> None:
    """The API (`allmende serve`: the routes, the admission service, the ledger writer on
    embedded chDB) with the demo's read-only `GET /demo/ledger`, configured from the environment."""
    import uvicorn
    from starlette.concurrency import run_in_threadpool

    from allmende.core.logs import configure_logging
    from allmende.core.settings import Settings
    from allmende.topology import create_app

    settings = Settings()
    configure_logging(settings)
    app = create_app(settings)
    admin = {f"Bearer {pair.partition(':')[2]}" for pair in settings.admin_tokens.split(",") if pair}

    @app.get("/demo/ledger", include_in_schema=False)
    async def demo_ledger(request: Request) -> dict[str, Any]:
        if request.headers.get("authorization") not in admin:
            raise HTTPException(401, "the demo's admin token, please")
        gpu_seconds = await run_in_threadpool(request.app.state.store.job_gpu_seconds)
        admission = request.app.state.admission
        decisions = [] if admission is None else list(admission.state.decisions.values())
        return {"gpu_seconds": gpu_seconds, "decisions": [d.model_dump(mode="json") for d in decisions]}

    uvicorn.run(app, host="127.0.0.1", port=settings.api_port, log_config=None, access_log=False)


# -- the demo ---------------------------------------------------------------------------------------


def _gpus_of(tres: str, default: int) -> int:
    m = re.search(r"gres/gpu=(\d+)", tres)
    return int(m.group(1)) if m else default


class Demo:
    def __init__(self, paths: Paths, console: Console, keep: bool) -> None:
        self.paths = paths
        self.console = console
        self.keep = keep
        self.url = ""
        self.kafka = ""
        self.admin = ""
        self.slurm: SlurmCluster | None = None
        self.node = ""
        self.jobs: list[DemoJob] = []
        self.ledger: dict[str, Any] = {"gpu_seconds": {}, "decisions": []}

    # -- output --------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def done(self, text: str) -> None:
        self.say(f"  [green]✓[/green] {text}")

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        """A spinner while the step runs, then its line with the time it took."""
        t0 = time.monotonic()
        with self.console.status(f"{text} ..."):
            yield
        self.done(f"{text} [dim]({time.monotonic() - t0:.1f} s)[/dim]")

    # -- set-up --------------------------------------------------------------------------------------

    def preflight(self) -> str | None:
        if os.geteuid() != 0:
            return "the local Slurm runs its daemons as root: run the demo as root"
        if not SLURMCTLD.exists() or shutil.which("sbatch") is None:
            return f"{SLURMCTLD} or sbatch is missing: run `make system-packages` (infra/slurm/install.sh)"
        if shutil.which("java") is None:
            return "Java 17+ is needed for the local Kafka broker"
        return None

    def start(self) -> None:
        from allmende.core.kafka_local import LocalBroker, free_port
        from allmende.core.kafka_topics import ensure_topics
        from allmende.core.settings import Settings

        paths = self.paths
        # What an earlier `--keep` left: stopped, then a clean slate (job ids from 1, an empty ledger).
        stop_all(paths, lambda text: self.done(f"{text} (left by an earlier run)"))
        shutil.rmtree(paths.state, ignore_errors=True)
        paths.run.mkdir(parents=True)
        self.admin = _write_secret(paths.admin_token)
        scheduler = _write_secret(paths.scheduler_token)

        env = slurm_env(paths.slurm, SLURM_NAME)
        self.slurm = slurm = SlurmCluster(paths.slurm, env, token=scheduler)
        slurm.configure()  # its ticket key, which the platform reads too, before either starts
        failure: list[BaseException] = []

        def slurm_up() -> None:
            try:
                start_slurm(slurm)
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        t0 = time.monotonic()
        starting = threading.Thread(target=slurm_up, name="start.sh", daemon=True)
        with self.console.status("starting Slurm and the platform ...") as status:
            starting.start()
            status.update("starting Kafka (and Slurm) ...")
            broker = LocalBroker(paths.kafka, port=free_port(), controller_port=free_port())
            self.kafka = kafka = broker.start()
            api_port = free_port()
            penv = platform_env(paths, kafka, api_port, self.admin, scheduler, slurm.ticket_key_file)
            settings = Settings(
                kafka_bootstrap_servers=kafka, topic_prefix=TOPIC_PREFIX, topic_partitions=2, log_json=False
            )
            ensure_topics(settings)
            self.done(f"Kafka at {kafka} [dim]({time.monotonic() - t0:.1f} s)[/dim]")
            status.update("starting the meter worker and the API (and Slurm) ...")
            _start_detached(paths, "worker", python_module("allmende", "worker"), penv)
            _start_detached(
                paths, "api", python_module("allmende.integrations.slurm.demo", "--serve-platform"), penv
            )
            self.url = f"http://127.0.0.1:{api_port}"
            worker_log = paths.run / "worker.log"

            def worker_ready() -> bool:
                if running(paths.run / "worker.pid") is None:
                    raise RuntimeError(f"the meter worker exited; see {worker_log}")
                return b"Worker ready" in worker_log.read_bytes()

            wait_until(worker_ready, 120, f"the meter worker ({worker_log})", every=0.5)
            self.done(f"meter worker [dim]({time.monotonic() - t0:.1f} s)[/dim]")
            wait_until(self._api_up, 120, f"the API ({paths.run / 'api.log'})", every=0.5)
            self.done(
                f"API and ledger writer (chDB) at {self.url} [dim]({time.monotonic() - t0:.1f} s)[/dim]"
            )
            status.update("waiting for Slurm (infra/slurm/start.sh) ...")
            starting.join(240)
            if failure:
                raise failure[0]
            if starting.is_alive():
                raise TimeoutError("infra/slurm/start.sh did not finish in 240 s")
        nodes = slurm.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()
        self.node = nodes[0] if nodes else ""
        self.done(
            f"Slurm 22.05 (cluster {SLURM_NAME!r}): munged, MariaDB, slurmdbd, slurmctld, slurmd; node "
            f"{self.node} with 8 fake h100 GPUs in partition gpu [dim]({time.monotonic() - t0:.1f} s)[/dim]"
        )

        now = dt.datetime.now(dt.UTC)
        with self.step("the quarter's plan applied (rich, broke, lab, team, spent on cluster slurm-h100)"):
            answer = httpx.post(
                f"{self.url}/v1/admin/plan/apply",
                json={"text": plan_text(now, "slurm-demo")},
                headers=self._admin_headers(),
                timeout=60,
            )
            if answer.status_code != 200:
                raise RuntimeError(f"applying the plan: HTTP {answer.status_code}: {answer.text}")

        slurm.configure(
            api_url=self.url, kafka_bootstrap_servers=kafka, topic_prefix=TOPIC_PREFIX, agent_interval_s=1
        )
        self.done(f"integration config written: {slurm.config_file}")
        with self.step("Slurm agent started (python -m allmende.integrations.slurm.agent --interval 1)"):
            agent = [
                hook_python(),
                "-m",
                "allmende.integrations.slurm.agent",
                "--config",
                str(slurm.config_file),
            ]
            _start_detached(paths, "agent", [*agent, "--interval", "1"], slurm.env)
            wait_until(lambda: "agent started" in self._agent_log(), 30, f"the agent ({slurm.agent_log})")

    def _api_up(self) -> bool:
        if running(self.paths.run / "api.pid") is None:
            raise RuntimeError(f"the API exited; see {self.paths.run / 'api.log'}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def _agent_log(self) -> str:
        assert self.slurm is not None
        log = self.slurm.agent_log
        return log.read_text(errors="replace") if log.exists() else ""

    # -- the platform's side ---------------------------------------------------------------------------

    def refresh(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/demo/ledger", headers=self._admin_headers(), timeout=30)
        answer.raise_for_status()
        self.ledger = answer.json()
        return self.ledger

    def charged(self, job: DemoJob) -> int | None:
        if job.platform_id is None:
            return None
        value = self.refresh()["gpu_seconds"].get(job.platform_id)
        return None if value is None else int(value)

    def decision(self, platform_id: str | None) -> dict[str, Any] | None:
        return next((d for d in self.ledger["decisions"] if d["job_id"] == platform_id), None)

    def running_on_platform(self, project: str, platform_id: str) -> bool:
        answer = httpx.get(
            f"{self.url}/v1/dashboard/projects/{project}/running", headers=self._admin_headers(), timeout=30
        )
        return answer.status_code == 200 and any(r["job_id"] == platform_id for r in answer.json()["rows"])

    # -- Slurm's side --------------------------------------------------------------------------------

    @property
    def sl(self) -> SlurmCluster:
        assert self.slurm is not None
        return self.slurm

    def sbatch(self, job: DemoJob, *args: str) -> bool:
        result = self.sl.sbatch("-A", job.account, *args)
        job.said = result.stderr.strip()
        self.jobs.append(job)
        if result.returncode != 0:
            return False
        job.slurm_id = result.stdout.strip().split(";")[0]
        return True

    def started(self, job: DemoJob, timeout: float = 60) -> None:
        """The job's prolog ran (it is published) and slurmdbd has its start."""
        assert job.slurm_id is not None
        jid = job.slurm_id
        wait_until(lambda: self.sl.hook_ran("prolog", jid), timeout, f"job {jid} to start")
        job.platform_id = self.sl.platform_id(jid)
        wait_until(
            lambda: self.sl.sacct(jid).get("Start", "None") not in {"", "None", "Unknown"}, 30, "sacct"
        )

    def finished(self, job: DemoJob, timeout: float = 90) -> dict[str, str]:
        """The job's sacct row once it ended and its last run's epilog published JobFinished."""
        assert job.slurm_id is not None
        jid = job.slurm_id
        row = wait_until(lambda: self.sl.ended(jid), timeout, f"job {jid} to end")
        wait_until(
            lambda: "JobFinished" in (self.sl.hook_ran("epilog", jid) or ""), 30, f"the epilog of job {jid}"
        )
        job.platform_id = job.platform_id or self.sl.platform_id(jid)
        return row

    def requeued(self, job: DemoJob, timeout: float = 30) -> None:
        assert job.slurm_id is not None
        jid = job.slurm_id
        wait_until(
            lambda: "JobPreempted" in (self.sl.hook_ran("epilog", jid) or ""), timeout, f"job {jid} requeued"
        )

    def settle(self, job: DemoJob) -> None:
        """Slurm's final state and sacct's GPU-seconds over every run (`sacct -D`)."""
        if job.slurm_id is None:
            return
        row = self.sl.sacct(job.slurm_id)
        runs = self.sl.runs(job.slurm_id)
        job.sacct_gpu_s = sum(int(r["ElapsedRaw"] or 0) * _gpus_of(r["AllocTRES"], job.gpus) for r in runs)
        requeues = sum(1 for r in runs if r["State"] in {"REQUEUED", "PREEMPTED"})
        job.final = row.get("State", "?") + (f" (requeued {requeues}×)" if requeues else "")

    def wait_ledger(self, job: DemoJob, timeout: float = 60) -> None:
        """Until the ledger charged the job what sacct shows (or the timeout: then as it is)."""
        self.settle(job)
        if job.platform_id is None or job.sacct_gpu_s is None:
            return
        want = job.sacct_gpu_s
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: self.charged(job) == want, timeout, f"the ledger to charge {job.platform_id}", 0.5
            )
        job.ledger_gpu_s = self.charged(job)

    # -- the workload --------------------------------------------------------------------------------

    def workload(self) -> None:
        sl = self.sl
        self.say("")
        self.console.rule("the workload")

        # 1. In budget: runs; the ledger charges what sacct accounts, to the second.
        budget = DemoJob("in budget", "rich", "sbatch 2×h100, 5 min", 2)
        with self.step(f"{budget.label}: sbatch -A rich --gres=gpu:h100:2 -t 5 --wrap 'sleep 5'"):
            if self.sbatch(budget, "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 5"):
                self.started(budget)
                self.finished(budget)
                self.wait_ledger(budget)
        budget.story.append("ran in the budget lane; the hooks published its start and end")
        self.done(f"job {budget.slurm_id}: {budget.accounted}")

        # 2. Opportunistic: broke is over budget, preemptible: runs on idle GPUs, QOS preemptible.
        low = DemoJob("opportunistic", "poor", "sbatch --qos=preemptible 8×h100, 60 min", 8)
        with self.step(
            f"{low.label}: sbatch -A poor --qos=preemptible --gres=gpu:h100:8 (broke is over budget)"
        ):
            if self.sbatch(
                low, "--qos=preemptible", "--gres=gpu:h100:8", "-t", "60", "--wrap", LONG_THEN_SHORT
            ):
                self.started(low)
                assert low.platform_id is not None
                pid = low.platform_id
                # lab's admission names it only once the platform knows that it runs
                wait_until(lambda: self.running_on_platform("broke", pid), 30, "the platform to see it run")
                time.sleep(3)  # it does some work before it is needed elsewhere
        self.done(f"job {low.slurm_id} runs on all 8 idle GPUs ({low.platform_id})")

        # 3. A time-slice project needs the GPUs: the API names the opportunistic job, the agent requeues it.
        lab = DemoJob("time slice", "lab", "sbatch 8×h100, 5 min", 8)
        with self.step(f"{lab.label}: sbatch -A lab --gres=gpu:h100:8 (inside its time-slice window)"):
            if self.sbatch(lab, "--gres=gpu:h100:8", "-t", "5", "--wrap", "sleep 5"):
                self.requeued(low)
                self.started(lab)
                self.finished(lab)
                self.wait_ledger(lab)
        line = next(
            (ln for ln in self._agent_log().splitlines() if f"job {low.slurm_id}: preempted" in ln), ""
        )
        why = re.search(r" for job \S+ \(\S+\): (.*)$", line)
        low.story.append(
            f"requeued by the agent for job {lab.slurm_id} (time slice); the API's reason: "
            + (why.group(1) if why else "?")
        )
        lab.story.append(
            f"its admission named job {low.slurm_id} as the victim; ran once the agent requeued it"
        )
        self.done(f"job {lab.slurm_id}: the agent requeued job {low.slurm_id} for it; {lab.accounted}")

        # 4. Interactive: srun without a batch script.
        inter = DemoJob("interactive", "team", "srun 1×h100, 2 min", 1)
        self.jobs.append(inter)
        with self.step(f"{inter.label}: srun -A team --gres=gpu:h100:1 -t 2 (no batch script)"):
            result = sl.run(
                "srun", "-A", "team", "--gres=gpu:h100:1", "-t", "2",
                "sh", "-c", "echo $SLURM_JOB_ID; sleep 4",
                timeout=180,
            )  # fmt: skip
            inter.said = result.stderr.strip()
            first = result.stdout.split()
            if result.returncode == 0 and first:
                inter.slurm_id = first[0]
                self.finished(inter)
                self.wait_ledger(inter)
        inter.story.append("an srun session: the plugin saw no batch script and asked as interactive")
        self.done(f"job {inter.slurm_id}: {inter.accounted}")

        # 5. Over budget and not preemptible: refused at submission, with the API's sentence.
        refused = DemoJob("over budget", "poor", "sbatch --qos=high 2×h100, 60 min", 2)
        with self.step(f"{refused.label}: sbatch -A poor --qos=high --gres=gpu:h100:2 -t 60"):
            accepted = self.sbatch(
                refused, "--qos=high", "--gres=gpu:h100:2", "-t", "60", "--wrap", "sleep 1"
            )
        refused.final = "never submitted" if not accepted else "submitted (unexpected)"
        refused.story.append("sbatch said: " + " ".join(refused.said.split()))
        first_line = refused.said.splitlines()[0] if refused.said else "(nothing)"
        self.done(f"refused: {first_line}")

        # The opportunistic job runs again once the GPUs are free (its rerun is short).
        with self.step(f"the requeued job {low.slurm_id} runs again on the freed GPUs and ends"):
            self.finished(low, timeout=120)
            self.wait_ledger(low)
        low.story.append("ran again once the GPUs were free, and ended")

        # 6. A drained node: reported unhealthy; every job on it requeued, non-preemptible too.
        team = DemoJob("on a drained node", "team", "sbatch 2×h100, 10 min", 2)
        high = DemoJob("on a drained node", "rich", "sbatch --qos=high 2×h100, 10 min", 2)
        reason = f"Reason={REASON}"
        with self.step(
            f"drained node: two jobs on {self.node}, then scontrol update NodeName={self.node} State=DRAIN"
        ):
            self.sbatch(team, "--gres=gpu:h100:2", "-t", "10", "--wrap", LONG_THEN_SHORT)
            self.sbatch(high, "--qos=high", "--gres=gpu:h100:2", "-t", "10", "--wrap", LONG_THEN_SHORT)
            for job in (team, high):
                self.started(job)
            time.sleep(2)
            drained = sl.run("scontrol", "update", f"NodeName={self.node}", "State=DRAIN", reason)
            if drained.returncode != 0:
                raise RuntimeError(f"scontrol update State=DRAIN: {drained.stderr}")
            wait_until(lambda: "reported unhealthy" in self._agent_log(), 30, "the agent to report the node")
            for job in (team, high):
                self.requeued(job)
        unhealthy = next((ln for ln in self._agent_log().splitlines() if "reported unhealthy" in ln), "")
        self.done(f"agent: {unhealthy.split(' ', 1)[-1]}")
        with self.step(f"scontrol update NodeName={self.node} State=RESUME; the two jobs run again and end"):
            sl.run("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
            wait_until(
                lambda: self._agent_log().count("reported healthy") >= 2, 30, "the agent to report it healthy"
            )
            for job in (team, high):
                self.finished(job, timeout=120)
                self.wait_ledger(job)
        for job in (team, high):
            line = next(
                (ln for ln in self._agent_log().splitlines() if f"job {job.slurm_id}: requeued: node" in ln),
                "",
            )
            job.story.append(
                "requeued by the agent: node drained" + (" (non-preemptible too)" if job is high else "")
            )
            if line:
                job.story.append(line.split(" ", 1)[1])
            job.story.append("ran again after the node was resumed")

    def squatting(self) -> None:
        """7. A job that holds GPUs and does nothing with them, seen by the GPUs themselves: an
        exporter stand-in serves the recorded dcgm-exporter scrape as this node's 8 GPUs with the
        node's own mapping files (written by the Slurm prolog), the collector reads it every
        SCRAPE_S and publishes the samples, the sample writer keeps them, and the squatting page
        flags the job once it idled SQUAT_GRACE_S (the demo's grace period), with its cost once it
        ended. Skipped without the recorded scrape (../shared/data/dcgm)."""
        from allmende.core.replay import make_producer
        from allmende.integrations.dcgm.collector import Collector, Target, kafka_publisher
        from allmende.integrations.dcgm.stand_in import ExporterStandIn

        if not RECORDED_SCRAPE.exists():
            self.say(f"[dim]squatting: no recorded dcgm-exporter scrape at {RECORDED_SCRAPE}: skipped[/dim]")
            return
        job = DemoJob("squatting", "rich", f"sbatch 2×h100, idle {SQUAT_RUN_S} s", 2)
        stand_in = ExporterStandIn(RECORDED_SCRAPE.read_text(), 8, self.sl.dcgm_mapping_dir, idle_pct=0)
        producer = make_producer(self.kafka)
        topic = f"{TOPIC_PREFIX}.gpu-samples"
        collector = Collector(
            [Target(stand_in.url, self.node)],
            interval_s=SCRAPE_S,
            publish=kafka_publisher(producer, topic, 30),
        )
        stop = threading.Event()

        def collect() -> None:
            while not stop.wait(SCRAPE_S - time.time() % SCRAPE_S):  # rounds on the period's grid
                collector.round()

        path = f"{self.url}/v1/dashboard/projects/rich/squatting"

        def flagged(ongoing: bool | None) -> dict[str, Any] | None:
            """The job's row on the squatting page (ongoing or not; None: either)."""
            rows = httpx.get(path, headers=self._admin_headers(), timeout=30).json().get("rows", [])
            mine = [r for r in rows if r["job_id"] == job.platform_id and ongoing in (None, r["ongoing"])]
            return mine[0] if mine else None

        def costed() -> dict[str, Any] | None:
            row = flagged(None)
            return row if row and Decimal(row["charged_gpu_hours"]) > 0 else None

        stand_in.start()
        thread = threading.Thread(target=collect, name="dcgm-collector", daemon=True)
        thread.start()
        try:
            with self.step(
                f"{job.label}: sbatch -A rich --gres=gpu:h100:2 --wrap 'sleep {SQUAT_RUN_S}'; its GPUs read "
                f"idle by the exporter stand-in, scraped every {SCRAPE_S} s (allmende collect dcgm)"
            ):
                if not self.sbatch(job, "--gres=gpu:h100:2", "-t", "5", "--wrap", f"sleep {SQUAT_RUN_S}"):
                    raise RuntimeError(f"sbatch refused the squatting job: {job.said}")
                self.started(job)
                assert job.platform_id is not None
                stand_in.idle_jobs.add(job.platform_id)  # its GPUs, as the mapping files name them
            with self.step(
                f"the squatting page flags it after {SQUAT_GRACE_S} s idle (the demo's grace period)"
            ):
                row = wait_until(lambda: flagged(True), SQUAT_RUN_S + 60, "the squatting page to flag it", 2)
                assert row is not None
            job.story.append(
                f"flagged squatting from its GPUs' samples: idle since {row['idle_since']}, "
                f"{row['idle_gpu_hours']} idle GPU-h so far"
            )
            with self.step("it ends; the page shows what its idle time cost"):
                self.finished(job, timeout=SQUAT_RUN_S + 60)
                self.wait_ledger(job)
                ended = wait_until(costed, 60, "its cost on the squatting page", 1)
                assert ended is not None  # wait_until returns a truthy answer
            job.story.append(
                f"ended: {ended['idle_gpu_hours']} idle GPU-h of {ended['gpu_hours']} GPU-h, charged "
                f"{ended['charged_gpu_hours']} GPU-h ({ended['idle_charged_gpu_hours']} of it idle)"
            )
        finally:
            stop.set()
            thread.join(SCRAPE_S + 10)
            collector.close()
            producer.close(timeout=5)
            stand_in.stop()

    # -- the report ----------------------------------------------------------------------------------

    def report(self) -> None:
        self.refresh()
        decisions = self.ledger["decisions"]
        for job in self.jobs:
            self.settle(job)
            d = self.decision(job.platform_id)
            if job.slurm_id is None:  # refused: the newest rejection of its project
                project = "broke" if job.account == "poor" else job.account
                d = next(
                    (x for x in reversed(decisions) if x["project"] == project and x["verdict"] == "reject"),
                    None,
                )
                job.platform_id = None if d is None else str(d["job_id"])
            if d is not None:
                lane = f" · {d['lane']}" if d.get("lane") else ""
                code = f" ({d['reasons'][0]['code']})" if d["verdict"] != "admit" and d.get("reasons") else ""
                named = [self._slurm_id(v["job_id"]) for v in d.get("preempt") or ()]
                victims = f", preempts job {', '.join(named)}" if named else ""
                job.verdict = f"{d['verdict']}{lane}{code}{victims}"
            if job.slurm_id is not None and job.platform_id is not None:
                value = self.ledger["gpu_seconds"].get(job.platform_id)
                job.ledger_gpu_s = None if value is None else int(value)

        self.say("")
        table = Table(title="What happened to each job", title_justify="left")
        for name, justify in (("Slurm id", "right"), ("account → project", "left"), ("asked", "left"),
                              ("platform", "left"), ("Slurm's final state", "left"),
                              ("sacct GPU-s", "right"), ("ledger GPU-s", "right"), ("", "left")):  # fmt: skip
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for job in self.jobs:
            project = "broke" if job.account == "poor" else job.account
            same = job.sacct_gpu_s is not None and job.sacct_gpu_s == job.ledger_gpu_s
            mark = "[green]=[/green]" if same else ("" if job.slurm_id is None else "[red]≠[/red]")
            table.add_row(
                job.slurm_id or "-",
                f"{job.account} → {project}" if project != job.account else project,
                f"{job.label}: {job.asked}",
                job.verdict or "?",
                job.final or "?",
                "-" if job.sacct_gpu_s is None else f"{job.sacct_gpu_s:,}",
                "-" if job.ledger_gpu_s is None else f"{job.ledger_gpu_s:,}",
                mark,
            )
        self.console.print(table)
        for job in self.jobs:
            who = f"job {job.slurm_id}" if job.slurm_id else "the refused submission"
            self.say(f"[bold]{who}[/bold] ({job.label}, {job.platform_id or 'no admission id'}):")
            for line in job.story:
                self.say(f"    {line}")

    def _slurm_id(self, platform_id: str) -> str:
        return next(
            (j.slurm_id for j in self.jobs if j.platform_id == platform_id and j.slurm_id), platform_id
        )

    def where_to_look(self) -> None:
        sl = self.sl
        self.say("")
        self.console.rule("where to look" + ("" if self.keep else " (with --keep: all of it stays up)"))
        bearer = f'-H "Authorization: Bearer $(cat {self.paths.admin_token})"'
        example = next((j for j in self.jobs if j.label == "time slice" and j.platform_id), None)
        decision = example.platform_id if example else "<admission id>"
        rows = [
            ("dashboard", f"{self.url}/ui/overview   (a project: {self.url}/ui/projects/broke)"),
            ("sign in with", f"{self.admin}   (the admin token; also in {self.paths.admin_token})"),
            ("API", f"{self.url}/docs"),
            ("a decision", f"curl {bearer} {self.url}/v1/admission/{decision}"),
            ("the ledger", f"curl {bearer} {self.url}/v1/projects/broke/usage"),
            ("admission log", f"Kafka topic {TOPIC_PREFIX}.admission at {self.kafka} (decisions, holds, "
                              "host reports); the plugin's lines: grep allmende: <slurmctld log>"),
            ("agent log", str(sl.agent_log)),
            ("hook log", str(sl.hook_log)),
            ("slurmctld log", str(sl.ctld_log_file)),
            ("platform logs", f"{self.paths.run}/api.log, worker.log, agent.log; Kafka: {self.paths.kafka}"),
            ("config", str(sl.config_file)),
            ("Slurm", f". {sl.state / 'env.sh'}; squeue; sacct -D -o JobID,State,ElapsedRaw,AllocTRES%40"),
        ]  # fmt: skip
        for name, where in rows:
            self.say(f"  [bold]{name:<15}[/bold] {where}")

    def run(self) -> int:
        problem = self.preflight()
        if problem:
            self.say(f"[red]{problem}[/red]")
            return 2
        t0 = time.monotonic()
        self.console.rule("Allmende on a real Slurm: the demo")
        failed = False
        try:
            self.start()
            self.workload()
            self.squatting()
            self.report()
            self.where_to_look()
        except (Exception, KeyboardInterrupt) as exc:
            failed = True
            self.say(f"\n[red]the demo stopped: {type(exc).__name__}: {exc}[/red]")
            self.say(
                f"  logs: {self.paths.run}, {self.paths.slurm / 'log'}, {self.paths.slurm / 'allmende-spool'}"
            )
        finally:
            self.say("")
            if self.keep:
                self.say("[bold]--keep[/bold]: the platform and Slurm keep running. Stop them with")
                self.say("  .venv/bin/python -m allmende.integrations.slurm.demo --stop")
            else:
                with self.console.status("stopping the agent, Slurm, the API, the meter worker, Kafka ..."):
                    stop_all(self.paths, self.done)
        self.say(f"[dim]wall time {time.monotonic() - t0:.0f} s[/dim]")
        return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allmende.integrations.slurm.demo",
        description="Start Slurm on localhost with Allmende's plugin, hooks and agent, and the platform "
        "with a plan for this quarter; submit a small mixed workload; show what happened to each job.",
    )
    parser.add_argument("--keep", action="store_true", help="leave the platform and Slurm running at the end")
    parser.add_argument("--stop", action="store_true", help="stop what a run with --keep left running")
    parser.add_argument("--state", type=Path, default=STATE, help=f"state directory (default {STATE})")
    parser.add_argument("--serve-platform", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = Paths(args.state.resolve())
    if args.serve_platform:
        serve_platform()
        return 0
    from allmende.core.logs import configure_logging
    from allmende.core.settings import Settings

    configure_logging(Settings(log_level="WARNING", log_json=False))  # the broker's and topics' info lines
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.stop:
        if not stop_all(paths, lambda text: console.print(f"  [green]✓[/green] {text}")):
            console.print(f"nothing of the demo runs in {paths.state}")
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop everything on SIGTERM too
    return Demo(paths, console, keep=args.keep).run()


if __name__ == "__main__":
    sys.exit(main())
