"""The Slurm agent: makes the scheduler follow the platform, every `agent_interval_s` seconds.

    python -m allmende.integrations.slurm.agent [--config FILE] [--interval S] [--once] [--dry-run]
    allmende slurm agent ...                                  # the same

1. Nodes (`sinfo -N`): a node that Slurm has drained or set down *with a reason* (drained,
   draining, down, fail, failing) is reported unhealthy for its platform cluster(s)
   (`POST /v1/hosts/health`; cluster = the node's partitions through `clusters`), and healthy
   again once it is not. Every job running on an unhealthy node is requeued (`scontrol requeue`,
   whatever its QOS: non-preemptible jobs too), the reason appended to its admin comment and
   logged. The agent remembers what it reported and reports changes only; at start it reports
   every node's current state once (the API takes a repeated report as a no-op on its state).
2. Queued jobs: jobs job_submit.lua submitted held (`allmende: queued: ...` in the comment, the
   admission id and the request in the admin comment) are asked about again with the same
   admission id and request. The agent asks with `?dry_run=true` first (records nothing) and
   asks for real only when that answer is not `queue`: so a waiting job does not add a decision
   to the admission log every interval. `admit` -> `scontrol release` (QOS `preemptible_qos` in
   the opportunistic lane); `reject` -> the comment says why and the job is cancelled
   (`scancel`); `queue` -> left held.

3. Preemption: for a pending job (not held) that the API admitted naming victims (the recorded
   decision, `GET /v1/admission/{id}`), the agent stops the victims still running: `scontrol
   requeue` (or `scancel` with `preempt_action: cancel`; a squatting victim is always cancelled,
   `domain.preemption.stop_action`), the reason in each victim's admin comment. Slurm's own
   preemption is off (`PreemptType=preempt/none`): the API alone picks the victims, in its order
   (unhealthy hosts, squatters, opportunistic, then by fair share), so Slurm can neither pick
   others nor preempt a job the lanes protect. Each plan is carried out once.
4. Fair-share order: every pending job's Nice is set to -round(factor x `fairshare_nice_scale`)
   from the platform's fair-share factor of its project (`GET /v1/fairshare`); with Slurm's
   fair-share weight at 0 the pending queue follows the platform's fair share within a QOS.

With `dry_run` (the config's or `--dry-run`) the agent only logs what it would do: no host
reports, no requeue, no release or cancel, admission asked with `?dry_run=true` only.

The log (`agent_log_file`, default `<spool_dir>/agent.log`, and stderr): one line per action.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any

import httpx

from allmende.core.failover_http import FailoverTransport
from allmende.domain.preemption import queue_rank, stop_action
from allmende.integrations.slurm.config import ConfigError, SlurmConfig, load_config
from allmende.integrations.slurm.log import LineLog
from allmende.integrations.slurm.scontrol import SlurmJob, fields, parse_job

UNHEALTHY_STATES = frozenset({"drained", "draining", "drain", "down", "fail", "failing"})
NO_REASON = frozenset({"", "none", "(null)", "n/a"})
QUEUED_MARK = "allmende: queued:"
REQUEST_KEYS = frozenset(
    {"job_id", "project", "user", "cluster", "gpu_type", "gpus", "priority_class", "interactive",
     "requested_hours"}
)  # fmt: skip
MAX_REQUEUE_TRIES = 3
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})


# -- what Slurm shows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    node: str
    partitions: tuple[str, ...]
    state: str  # sinfo's long state, lower case, without the flag suffixes (*, ~, #, ...)
    reason: str  # "" when none

    @property
    def unhealthy(self) -> bool:
        return self.state in UNHEALTHY_STATES and self.reason.lower() not in NO_REASON


def parse_sinfo(text: str) -> list[NodeState]:
    """`sinfo -N -h -o '%N|%P|%T|%E'`: one line per node and partition -> one state per node."""
    states: dict[str, tuple[list[str], str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) < 4 or not parts[0]:
            continue
        node, partition, state, reason = (p.strip() for p in parts)
        partition = partition.rstrip("*")
        state = state.lower().rstrip("*~#!%$@^-+")
        reason = "" if reason.lower() in NO_REASON else reason
        entry = states.setdefault(node, ([], state, reason))
        if partition and partition not in entry[0]:
            entry[0].append(partition)
    return [NodeState(node, tuple(p), s, r) for node, (p, s, r) in states.items()]


@dataclass(frozen=True)
class QueuedJob:
    job: SlurmJob
    admission_id: str
    request: dict[str, Any] | None  # as job_submit.lua stored it; None: rebuilt from the job


def stored_request(text: str) -> dict[str, Any] | None:
    m = re.search(r"allmende-request:(\{\S*\})", text or "")
    if not m:
        return None
    try:
        data = json.loads(m.group(1))
    except ValueError:
        return None
    if not isinstance(data, dict) or not set(data) >= REQUEST_KEYS:
        return None
    return {k: data[k] for k in REQUEST_KEYS}


def hours_of_minutes(minutes: int) -> str:
    """As job_submit.lua sends them: hours truncated to 9 decimals."""
    hours = (Decimal(minutes) / Decimal(60)).quantize(Decimal("0.000000001"), rounding=ROUND_DOWN)
    text = format(hours.normalize(), "f")
    return text


def rebuilt_request(job: SlurmJob, admission_id: str, cfg: SlurmConfig) -> dict[str, Any]:
    """The request job_submit.lua would have sent, from `scontrol show job` and the config (for
    jobs held without a stored request)."""
    cluster = cfg.cluster_of(job.partition)
    qos = job.qos or None
    hours = hours_of_minutes(job.time_limit_minutes) if job.time_limit_minutes else str(cfg.default_hours)
    return {
        "job_id": admission_id,
        "project": cfg.project_of(job.account),
        "user": job.user or "unknown",
        "cluster": cluster,
        "gpu_type": cfg.gpu_type_of(job.gpu_type, cluster),
        "gpus": job.gpus,
        "priority_class": cfg.priority_class_of(qos),
        "interactive": (not job.batch) or (qos in cfg.interactive_qos),
        "requested_hours": hours,
    }


class Slurm:
    """The commands the agent runs (a seam for tests)."""

    def __init__(self, cfg: SlurmConfig, timeout: float = 30.0) -> None:
        self.cfg = cfg
        self.timeout = timeout

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=self.timeout, check=False,
            env=_env(),
        )  # fmt: skip

    def nodes(self) -> list[NodeState]:
        out = self.run(self.cfg.sinfo, "-N", "-h", "-o", "%N|%P|%T|%E")
        if out.returncode != 0:
            raise RuntimeError(f"sinfo failed: {out.stderr.strip()}")
        return parse_sinfo(out.stdout)

    def jobs_on(self, node: str) -> list[str]:
        out = self.run(self.cfg.squeue, "-h", "-w", node, "-t", "RUNNING,CONFIGURING", "-o", "%i")
        if out.returncode != 0:
            raise RuntimeError(f"squeue -w {node} failed: {out.stderr.strip()}")
        return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]

    def jobs(self) -> list[tuple[SlurmJob, dict[str, str]]]:
        out = self.run(self.cfg.scontrol, "show", "job", "-o")
        if out.returncode != 0:
            raise RuntimeError(f"scontrol show job failed: {out.stderr.strip()}")
        found = []
        for line in out.stdout.splitlines():
            if not line.startswith("JobId="):
                continue
            first: dict[str, str] = {}
            for key, value in fields(line):
                first.setdefault(key, value)
            found.append((parse_job(line), first))
        return found

    def admin_comment(self, job_id: str) -> str:
        out = self.run(self.cfg.scontrol, "show", "job", "-o", job_id)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("JobId=")), "")
        return parse_job(line).admin_comment if line else ""

    def update(self, job_id: str, **values: str) -> subprocess.CompletedProcess[str]:
        return self.run(
            self.cfg.scontrol, "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in values.items())
        )

    def requeue(self, job_id: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.cfg.scontrol, "requeue", job_id)

    def release(self, job_id: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.cfg.scontrol, "release", job_id)

    def cancel(self, job_id: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.cfg.scancel, job_id)

    def cluster_name(self) -> str:
        """Slurm's ClusterName: the hooks' job ids of jobs without an admission id carry it."""
        out = self.run(self.cfg.scontrol, "show", "config")
        m = re.search(r"^ClusterName\s*=\s*(\S+)", out.stdout, re.MULTILINE)
        if out.returncode != 0 or not m:
            raise RuntimeError(f"scontrol show config: no ClusterName ({out.stderr.strip()})")
        return m.group(1)


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "SLURM_TIME_FORMAT": "%s"}


def queued_jobs(jobs: Sequence[tuple[SlurmJob, dict[str, str]]], cfg: SlurmConfig) -> list[QueuedJob]:
    """Pending jobs job_submit.lua held: the queued note in the comment, the admission id where
    `id_field` says, and held (priority 0 or a JobHeld* reason)."""
    found = []
    for job, first in jobs:
        if job.state.split()[0:1] != ["PENDING"]:
            continue
        if QUEUED_MARK not in (job.comment or ""):
            continue
        held = first.get("Priority") == "0" or job.reason.startswith("JobHeld")
        admission_id = job.admission_id(cfg.id_field)
        if not held or admission_id is None:
            continue
        source = job.comment if cfg.id_field == "comment" else job.admin_comment
        found.append(QueuedJob(job, admission_id, stored_request(source)))
    return found


def _pending(job: SlurmJob) -> bool:
    return job.state.split()[0:1] == ["PENDING"]


def _held(job: SlurmJob, first: dict[str, str]) -> bool:
    return first.get("Priority") == "0" or job.reason.startswith("JobHeld")


def running_by_platform_id(
    jobs: Sequence[tuple[SlurmJob, dict[str, str]]], cfg: SlurmConfig, cluster_name: str
) -> dict[str, SlurmJob]:
    """Running jobs under the ids the platform knows them by: the admission id, else the hooks'
    `slurm-<ClusterName>-<job id>` (integrations/slurm/lifecycle.py)."""
    found = {}
    for job, _ in jobs:
        if job.state.split()[0:1] and job.state.split()[0] in RUNNING_STATES:
            found[job.admission_id(cfg.id_field) or f"slurm-{cluster_name}-{job.job_id}"] = job
    return found


def _numeric_id(job_id: str) -> int:
    head = job_id.split("_")[0]  # array tasks: 12_3
    return int(head) if head.isdigit() else 0


def nice_of(factor: float, scale: int) -> int:
    """A higher fair-share factor, a lower Nice, a higher priority (negative Nice needs an admin:
    the agent runs as root or SlurmUser)."""
    return -round(min(max(factor, 0.0), 1.0) * scale)


# -- the agent -----------------------------------------------------------------------------------


def _clean(text: str, limit: int = 300) -> str:
    """Text for a job's comment or admin comment: one line, no `=` (which would read as a new
    field in `scontrol show job -o`)."""
    return " ".join(text.replace("=", ":").split())[:limit]


@dataclass
class Agent:
    cfg: SlurmConfig
    log: Callable[[str], None]
    dry_run: bool = False
    slurm: Slurm | None = None
    client: httpx.Client | None = None
    # (cluster, host) -> (healthy, reason) as last reported (accepted or refused for good)
    reported: dict[tuple[str, str], tuple[bool, str]] = field(default_factory=dict)
    # node -> job id -> requeue tries, while the node is unhealthy
    requeued: dict[str, dict[str, int]] = field(default_factory=dict)
    # job id -> the last thing logged about it (log changes only)
    said: dict[str, str] = field(default_factory=dict)
    # admission ids of pending jobs whose recorded preemption plan was carried out (or needs none)
    planned: set[str] = field(default_factory=set)
    fairshare_problem: str = ""  # the last reason the factors could not be read (log changes only)
    _cluster_name: str | None = None

    def __post_init__(self) -> None:
        if self.slurm is None:
            self.slurm = Slurm(self.cfg)
        if self.client is None:
            headers = {"Authorization": f"Bearer {self.cfg.token or ''}"}
            instances = self.cfg.api_urls or (self.cfg.api_url,)
            self.client = httpx.Client(
                base_url=instances[0].rstrip("/"), headers=headers, timeout=self.cfg.agent_timeout_s,
                transport=FailoverTransport(instances),
            )  # fmt: skip

    @property
    def sl(self) -> Slurm:
        assert self.slurm is not None
        return self.slurm

    @property
    def api(self) -> httpx.Client:
        assert self.client is not None
        return self.client

    # -- one pass --------------------------------------------------------------------------------
    def run_once(self) -> None:
        try:
            self.follow_nodes()
        except Exception as exc:  # a failed pass is logged; the next one tries again
            self.log(f"nodes: {type(exc).__name__}: {exc}")
        if not (self.cfg.agent_release or self.cfg.agent_preempt or self.cfg.fairshare_nice_scale):
            return
        try:
            jobs = self.sl.jobs()
            factors = self.fairshare_factors() if any(_pending(job) for job, _ in jobs) else {}
        except Exception as exc:
            self.log(f"jobs: {type(exc).__name__}: {exc}")
            return
        steps: list[tuple[str, Callable[[], None]]] = [
            ("queued jobs", lambda: self.follow_queued(jobs, factors)),
            ("preemptions", lambda: self.follow_preemptions(jobs)),
            ("fair-share order", lambda: self.follow_fairshare(jobs, factors)),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # one step failing leaves the others their turn
                self.log(f"{what}: {type(exc).__name__}: {exc}")

    def run(self, interval: float, stop: threading.Event) -> None:
        mode = " (dry run: logging only)" if self.dry_run else ""
        self.log(f"agent started{mode}: api {self.cfg.api_url}, every {interval:g} s, config {self.cfg.path}")
        while not stop.is_set():
            started = time.monotonic()
            self.run_once()
            stop.wait(max(interval - (time.monotonic() - started), 0.1))
        self.log("agent stopped")

    # -- nodes -----------------------------------------------------------------------------------
    def follow_nodes(self) -> None:
        nodes = self.sl.nodes()
        for node in nodes:
            clusters = sorted({self.cfg.cluster_of(p) for p in node.partitions}) or [self.cfg.cluster_of("")]
            healthy = not node.unhealthy
            reason = "" if healthy else _clean(f"slurm: node {node.node} {node.state}: {node.reason}", 1000)
            for cluster in clusters:
                self.report(cluster, node.node, healthy, reason)
            if healthy:
                self.requeued.pop(node.node, None)
            elif self.cfg.agent_requeue:
                try:
                    self.requeue_jobs_on(node)
                except Exception as exc:  # the other nodes still get their turn
                    self.log(f"node {node.node}: requeueing its jobs failed: {type(exc).__name__}: {exc}")

    def report(self, cluster: str, host: str, healthy: bool, reason: str) -> None:
        key = (cluster, host)
        last = self.reported.get(key)
        if last is not None and last[0] == healthy:
            return
        what = "healthy" if healthy else f"unhealthy ({reason})"
        if self.dry_run:
            self.log(f"dry-run: would report host {host} of cluster {cluster} {what}")
            self.reported[key] = (healthy, reason)
            return
        body = {"cluster": cluster, "host": host, "healthy": healthy, "reason": reason}
        try:
            answer = self.api.post("/v1/hosts/health", json=body)
        except httpx.HTTPError as exc:
            self.log(f"host {host} of cluster {cluster}: could not report it {what}: {exc!r}; trying again")
            return
        if answer.status_code == 200:
            self.log(f"host {host} of cluster {cluster}: reported {what} ({answer.json().get('event_id')})")
            self.reported[key] = (healthy, reason)
        elif answer.status_code in (404, 422):  # unknown cluster, bad host name: again is no use
            self.log(f"host {host} of cluster {cluster}: the API refused the report ({what}): "
                     f"HTTP {answer.status_code} {_detail(answer)}")  # fmt: skip
            self.reported[key] = (healthy, reason)
        else:
            self.log(f"host {host} of cluster {cluster}: could not report it {what}: "
                     f"HTTP {answer.status_code} {_detail(answer)}; trying again")  # fmt: skip

    def requeue_jobs_on(self, node: NodeState) -> None:
        tries = self.requeued.setdefault(node.node, {})
        for job_id in self.sl.jobs_on(node.node):
            if tries.get(job_id, 0) >= MAX_REQUEUE_TRIES:
                continue
            why = _clean(f"node {node.node} {node.state}: {node.reason}")
            if self.dry_run:
                self.log(f"dry-run: would requeue job {job_id} ({why})")
                tries[job_id] = MAX_REQUEUE_TRIES
                continue
            done = self.sl.requeue(job_id)
            tries[job_id] = tries.get(job_id, 0) + 1
            if done.returncode != 0:
                self.log(f"job {job_id}: scontrol requeue failed ({why}): {done.stderr.strip()} "
                         f"[try {tries[job_id]} of {MAX_REQUEUE_TRIES}]")  # fmt: skip
                continue
            tries[job_id] = MAX_REQUEUE_TRIES
            self.log(f"job {job_id}: requeued: {why}{self._note(job_id, 'requeued', why)}")

    def _note(self, job_id: str, what: str, why: str) -> str:
        """Appends `allmende: <what> <UTC stamp>: <why>` to the job's admin comment; "" when done,
        else what went wrong, for the log line."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        note = f"allmende: {what} {stamp}: {why}"
        old = self.sl.admin_comment(job_id)
        noted = self.sl.update(job_id, AdminComment=_clean(f"{old} {note}" if old else note, 2000))
        return "" if noted.returncode == 0 else f" (admin comment not updated: {noted.stderr.strip()})"

    # -- preemptions -----------------------------------------------------------------------------
    def cluster_name(self) -> str:
        if self._cluster_name is None:
            self._cluster_name = self.sl.cluster_name()
        return self._cluster_name

    def follow_preemptions(self, jobs: Sequence[tuple[SlurmJob, dict[str, str]]]) -> None:
        """Carries out the recorded plan of every pending job the API admitted naming victims."""
        if not self.cfg.agent_preempt:
            return
        waiting = {}
        for job, first in jobs:
            admission_id = job.admission_id(self.cfg.id_field)
            if _pending(job) and not _held(job, first) and admission_id:
                waiting[admission_id] = job
        self.planned &= set(waiting)  # a job that started or ended: its plan is history
        running: dict[str, SlurmJob] | None = None
        for admission_id, job in sorted(waiting.items(), key=lambda kv: _numeric_id(kv[1].job_id)):
            if admission_id in self.planned:
                continue
            try:
                answer = self.api.get(f"/v1/admission/{admission_id}")
            except httpx.HTTPError as exc:
                self._say(job.job_id, f"{admission_id}: could not read its decision ({exc!r}); trying again")
                continue
            if answer.status_code == 404:  # admitted untouched (fail open) or never asked: no plan
                self.planned.add(admission_id)
                continue
            if answer.status_code != 200:
                self._say(job.job_id, f"{admission_id}: could not read its decision: HTTP "
                                      f"{answer.status_code} {_detail(answer)}; trying again")  # fmt: skip
                continue
            decision = answer.json()
            victims = (decision.get("preempt") or []) if decision.get("verdict") == "admit" else []
            if victims:
                if running is None:
                    running = running_by_platform_id(jobs, self.cfg, self.cluster_name())
                self.preempt_for(job, admission_id, victims, running)
            self.planned.add(admission_id)

    def preempt_for(
        self,
        job: SlurmJob,
        admission_id: str,
        victims: Sequence[dict[str, Any]],
        running: dict[str, SlurmJob],
    ) -> None:
        for victim in victims:
            action = stop_action(str(victim.get("code", "")), self.cfg.preempt_action)
            victim_id = str(victim.get("job_id"))
            why = _clean(f"for job {job.job_id} ({admission_id}): {victim.get('reason', '')}")
            target = running.get(victim_id)
            if target is None:
                self.log(f"{victim_id}: named to make room {why}, but it is not running: nothing to stop")
                continue
            if self.dry_run:
                self.log(f"job {target.job_id}: dry-run: would {action} it ({victim_id}) {why}")
                continue
            done = self.sl.requeue(target.job_id) if action == "requeue" else self.sl.cancel(target.job_id)
            if done.returncode != 0:
                self.log(f"job {target.job_id}: {action} failed ({victim_id}) {why}: {done.stderr.strip()}")
                continue
            what = "requeued" if action == "requeue" else "cancelled"
            noted = self._note(target.job_id, f"preempted ({what})", why)
            self.log(f"job {target.job_id}: preempted ({what}, {victim_id}) {why}{noted}")
            del running[victim_id]

    # -- fair-share order ------------------------------------------------------------------------
    def _queue_rank(self, job: SlurmJob, factors: Mapping[str, float]) -> tuple[int, int, int, int]:
        klass = self.cfg.priority_class_of(job.qos or None)
        rank = queue_rank(klass, factors.get(self.cfg.project_of(job.account)))
        return (*rank, job.submit_time or 0, _numeric_id(job.job_id))

    def fairshare_factors(self) -> dict[str, float]:
        """Project -> the platform's fair-share factor ({} when the API has none yet)."""
        try:
            answer = self.api.get("/v1/fairshare")
            problem = "" if answer.status_code == 200 else f"HTTP {answer.status_code} {_detail(answer)}"
        except httpx.HTTPError as exc:
            problem = repr(exc)
        if problem:
            if problem != self.fairshare_problem:
                self.log(f"fair-share order: no factors ({problem}); submission order meanwhile")
            self.fairshare_problem = problem
            return {}
        self.fairshare_problem = ""
        nodes = answer.json().get("nodes", [])
        return {str(n["node_id"]): float(n["factor"]) for n in nodes if n.get("is_leaf")}

    def follow_fairshare(
        self, jobs: Sequence[tuple[SlurmJob, dict[str, str]]], factors: Mapping[str, float]
    ) -> None:
        """Every pending job's Nice from its project's fair-share factor, where it changes. Held
        jobs are left alone (an update must not touch a hold); they are asked in that order."""
        scale = self.cfg.fairshare_nice_scale
        if not scale or not factors:
            return
        for job, first in jobs:
            if not _pending(job) or _held(job, first):
                continue
            project = self.cfg.project_of(job.account)
            if project not in factors:
                continue
            nice = nice_of(factors[project], scale)
            if first.get("Nice") == str(nice):
                continue
            if self.dry_run:
                self._say(job.job_id, f"dry-run: would set Nice={nice} (fair share {factors[project]:.3f})",
                          key=f"{job.job_id}:nice")  # fmt: skip
                continue
            done = self.sl.update(job.job_id, Nice=str(nice))
            if done.returncode != 0:
                self._say(
                    job.job_id, f"setting Nice={nice} failed: {done.stderr.strip()}", key=f"{job.job_id}:nice"
                )

    # -- queued jobs -----------------------------------------------------------------------------
    def follow_queued(
        self, jobs: Sequence[tuple[SlurmJob, dict[str, str]]], factors: Mapping[str, float]
    ) -> None:
        """Asks about every held job again, in the platform's order: priority class, then the
        project's fair-share factor (highest first), then submission, so that GPUs freed go to
        the job the platform ranks first."""
        if not self.cfg.agent_release:
            return
        found = queued_jobs(jobs, self.cfg)
        found.sort(key=lambda q: self._queue_rank(q.job, factors))
        for queued in found:
            self.ask_again(queued)
        current = {q.job.job_id for q in found}
        for gone in [k for k in self.said if k not in current and ":" not in k]:
            del self.said[gone]
        known = {job.job_id for job, _ in jobs}
        for gone in [k for k in self.said if k.split(":")[0] not in known]:
            del self.said[gone]

    def _say(self, job_id: str, message: str, key: str | None = None) -> None:
        """Logs `message` about the job when it differs from the last one said under `key`."""
        key = key or job_id
        if self.said.get(key) != message:
            self.said[key] = message
            self.log(f"job {job_id}: {message}")

    def _ask(self, request: dict[str, Any], dry_run: bool) -> tuple[int | None, dict[str, Any], str]:
        try:
            answer = self.api.post(
                "/v1/admission", json=request, params={"dry_run": "true"} if dry_run else None
            )
        except httpx.HTTPError as exc:
            return None, {}, repr(exc)
        try:
            data = answer.json()
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        return answer.status_code, data, _detail(answer)

    def ask_again(self, queued: QueuedJob) -> None:
        job_id = queued.job.job_id
        request = queued.request or rebuilt_request(queued.job, queued.admission_id, self.cfg)
        if request.get("job_id") != queued.admission_id:
            stored_for = request.get("job_id")
            self._say(job_id, f"the stored request is for {stored_for}, not {queued.admission_id}; left held")
            return
        code, answer, detail = self._ask(request, dry_run=True)
        if code == 200 and answer.get("verdict") != "queue" and not self.dry_run:
            code, answer, detail = self._ask(request, dry_run=False)
        if code != 200:
            self._say(
                job_id, f"{queued.admission_id}: could not ask again (HTTP {code}: {detail}); left held"
            )
            return
        verdict, lane = answer.get("verdict"), answer.get("lane")
        sentence = str(answer.get("sentence") or "")
        prefix = "dry-run: would " if self.dry_run else ""
        if verdict == "queue":
            self._say(job_id, f"{queued.admission_id}: still queued: {sentence}")
        elif verdict == "admit":
            self.admit(queued, lane, sentence, prefix)
        elif verdict == "reject":
            self.reject(queued, sentence, prefix)
        else:
            self._say(job_id, f"{queued.admission_id}: unknown verdict {verdict!r}; left held")

    def _comment(self, job: SlurmJob, mark: str) -> str:
        comment = job.comment or ""
        return _clean(
            comment.replace(QUEUED_MARK, mark, 1) if QUEUED_MARK in comment else f"{mark} {comment}", 1000
        )

    def admit(self, queued: QueuedJob, lane: Any, sentence: str, prefix: str) -> None:
        job, job_id = queued.job, queued.job.job_id
        qos = self.cfg.preemptible_qos
        change_qos = lane == "opportunistic" and bool(qos) and job.qos != qos
        action = f"release (lane {lane}" + (f", QOS {job.qos} -> {qos})" if change_qos else ")")
        if self.dry_run:
            self._say(job_id, f"{queued.admission_id}: admitted: {prefix}{action}: {sentence}")
            return
        if change_qos:
            moved = self.sl.update(job_id, QOS=qos)
            if moved.returncode != 0:
                self._say(job_id, f"{queued.admission_id}: admitted, but QOS {qos} could not be set "
                                  f"({moved.stderr.strip()}); left held")  # fmt: skip
                return
        released = self.sl.release(job_id)
        if released.returncode != 0:
            self._say(job_id, f"{queued.admission_id}: admitted, but scontrol release failed: "
                              f"{released.stderr.strip()}")  # fmt: skip
            return
        self.sl.update(job_id, Comment=self._comment(job, f"allmende: admitted (lane {lane}):"))
        self.said.pop(job_id, None)
        self.log(f"job {job_id}: {queued.admission_id}: admitted: released (lane {lane}"
                 + (f", QOS {qos}" if change_qos else "") + f"): {sentence}")  # fmt: skip

    def reject(self, queued: QueuedJob, sentence: str, prefix: str) -> None:
        job_id = queued.job.job_id
        if self.dry_run:
            self._say(job_id, f"{queued.admission_id}: rejected: {prefix}cancel it: {sentence}")
            return
        self.sl.update(job_id, Comment=_clean(f"allmende: rejected: {sentence}", 1000))
        cancelled = self.sl.cancel(job_id)
        if cancelled.returncode != 0:
            self._say(
                job_id, f"{queued.admission_id}: rejected, but scancel failed: {cancelled.stderr.strip()}"
            )
            return
        self.said.pop(job_id, None)
        self.log(f"job {job_id}: {queued.admission_id}: rejected: cancelled: {sentence}")


def _detail(answer: httpx.Response) -> str:
    try:
        data = answer.json()
    except ValueError:
        return answer.text[:300]
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, dict):
        detail = detail.get("detail")
    return str(detail if detail is not None else data)[:300]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m allmende.integrations.slurm.agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--config", help="the JSON config (default: $ALLMENDE_SLURM_CONFIG, ...)")
    parser.add_argument("--interval", type=float, help="seconds between passes (default: agent_interval_s)")
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument("--dry-run", action="store_true", help="only log what it would do")
    args = parser.parse_args(argv)
    return run_agent(args.config, args.interval, args.once, args.dry_run)


def run_agent(config: str | Path | None, interval: float | None, once: bool, dry_run: bool) -> int:
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        sys.stderr.write(f"allmende slurm agent: {exc}\n")
        return 2
    log = LineLog(cfg.agent_log, echo=True)  # to its file and to stderr
    agent = Agent(cfg, log, dry_run=dry_run or cfg.dry_run)
    if once:
        agent.run_once()
        return 0
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run(interval if interval is not None else cfg.agent_interval_s, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
