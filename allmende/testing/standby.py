"""Several admission instances (API processes with the admission role, election on), a steady
admission load against a nearly spent budget, and what the admission log holds: for the hot-standby
fault tests and `bench/standby.py`.

Each instance is `allmende serve --role admission` with a ClickHouse (embedded) and a state
directory of its own, the topics shared. The load's client does what the scheduler's do (Slurm's
cli_filter and agent): it is given every instance, and moves on to the next when one does not
answer, is a standby (503 `not-leader`), or has no answer yet (503).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kafka import TopicPartition

from allmende.core.kafka_local import free_port
from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.supervisor import Child, python_module, wait_until
from allmende.schemas.admission_events import AdmissionDecided
from allmende.services.admission_service import recorded_event

ADMIN_TOKEN, SCHEDULER_TOKEN = "standby-admin", "standby-scheduler"
CLUSTER, PROJECT, GPU_TYPE = "standby-c1", "standby-p1", "H100"
JOB_HOURS = 1  # every job: 1 GPU for an hour, so it holds one GPU-hour of the budget


def plan_yaml(budget_hours: int, policy_from: int) -> str:
    """The plan; its policy takes effect at `policy_from` (later than now: the ledger writer is in
    no instance's process, and a price can only change from now on)."""
    effective = dt.datetime.fromtimestamp(policy_from, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"""\
plan: standby-check
period: {{start: 2026-01-01, end: 2028-01-01}}
clusters:
  - {{name: {CLUSTER}, gpu_type: {GPU_TYPE}, gpus: 1024}}
organisation:
  - {{id: institute, kind: organisation, shares: 100}}
  - {{id: {PROJECT}, parent: institute, kind: project, shares: 100}}
policy:
  id: flat-2026
  effective_from: {effective}
  gpu_type_weights: {{{GPU_TYPE}: 1.00}}
  priority_multipliers: {{preemptible: 1.00, standard: 1.00, non-preemptible: 1.00}}
  interactive_rate: 1.00
allocations:
  - {{project: {PROJECT}, gpu_hours: {budget_hours}}}
"""


class Instance(Child):
    """One API process with the admission role, one of several instances of the admission log."""

    def __init__(self, name: str, bootstrap: str, tag: str, home: Path, lease_timeout_ms: int) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "ALLMENDE_TOPIC_PREFIX": tag,
            "ALLMENDE_STATE_DIR": str(home / name),
            "ALLMENDE_CLICKHOUSE_DSN": f"chdb://{home / name / 'chdb'}",
            "ALLMENDE_CLICKHOUSE_DATABASE": tag,
            "ALLMENDE_ADMIN_TOKENS": f"admin:{ADMIN_TOKEN}",
            "ALLMENDE_SCHEDULER_TOKENS": f"scheduler:{SCHEDULER_TOKEN}",
            "ALLMENDE_ADMISSION_ELECTION": "true",
            "ALLMENDE_ADMISSION_LEASE_TIMEOUT_MS": str(lease_timeout_ms),
            "ALLMENDE_INSTANCE_NAME": name,
            "ALLMENDE_LOG_JSON": "false",
        }
        argv = python_module("allmende", "serve", "--port", str(self.port), "--role", "admission")
        super().__init__(argv, home / f"{name}.log", env, session=True)

    def role(self) -> str | None:
        """ "leader", "standby", or None (not answering)."""
        try:
            answer = httpx.get(f"{self.url}/healthz", timeout=2)
        except httpx.HTTPError:
            return None
        role: str | None = answer.json().get("admission")
        return role

    def wait_role(self, role: str, timeout: float = 60.0) -> float:
        """Seconds until /healthz says this instance is `role`."""
        started = time.monotonic()
        self.wait_for(lambda: self.role() == role, timeout, f"instance {self.name} as {role}")
        return time.monotonic() - started


@contextmanager
def instances(
    names: list[str], bootstrap: str, tag: str, home: Path, lease_timeout_ms: int = 3000
) -> Iterator[list[Instance]]:
    """Start the instances one after the other (the first leads); stop whatever still runs."""
    started: list[Instance] = []
    try:
        for name in names:
            instance = Instance(name, bootstrap, tag, home, lease_timeout_ms)
            started.append(instance)
            instance.wait_role("standby" if len(started) > 1 else "leader", 120)
        yield started
    finally:
        for instance in started:
            with suppress(ProcessLookupError):
                os.kill(instance.pid, signal.SIGCONT)  # a paused one must hear the stop
            instance.stop(signal.SIGINT, timeout=20)


def apply_plan(url: str, budget_hours: int) -> None:
    """Apply the plan and wait until its policy is in force."""
    policy_from = int(time.time()) + 3

    def applied() -> bool:
        answer = httpx.post(
            f"{url}/v1/admin/plan/apply", json={"text": plan_yaml(budget_hours, policy_from)},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30,
        )  # fmt: skip
        if answer.status_code not in (200, 503):  # 503: not recorded yet, no effect; again
            raise RuntimeError(f"plan not applied: {answer.status_code} {answer.text}")
        return answer.status_code == 200

    wait_until(applied, 60, "the plan applied", every=1.0)
    time.sleep(max(0.0, policy_from + 1 - time.time()))


@dataclass(frozen=True)
class Answer:
    job_id: str
    status: int  # 0: no instance answered
    body: dict[str, Any]
    instance: str | None
    asked_at: float  # monotonic
    answered_at: float


def job_request(job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id, "project": PROJECT, "user": "alice", "cluster": CLUSTER,
        "gpu_type": GPU_TYPE, "gpus": 1, "requested_hours": JOB_HOURS,
    }  # fmt: skip


class FailoverClient:
    """Asks each instance in turn, starting with the last that decided, as the scheduler's do."""

    def __init__(self, instances: list[Instance], timeout_s: float = 1.0) -> None:
        self.instances = instances
        self.timeout_s = timeout_s
        self._first = 0
        self._http = httpx.Client(headers={"Authorization": f"Bearer {SCHEDULER_TOKEN}"})

    def admit(self, job_id: str) -> Answer:
        asked = time.monotonic()
        status, body, by = 0, {}, None
        for turn in range(len(self.instances)):
            index = (self._first + turn) % len(self.instances)
            instance = self.instances[index]
            try:
                answer = self._http.post(
                    f"{instance.url}/v1/admission", json=job_request(job_id), timeout=self.timeout_s
                )
            except httpx.HTTPError:
                continue  # away or paused: the next one
            status, body, by = answer.status_code, answer.json(), instance.name
            if status != 503:
                self._first = index
                break
        return Answer(job_id, status, body, by, asked, time.monotonic())

    def close(self) -> None:
        self._http.close()


@dataclass
class Load:
    """A new job asked for admission every `every_s` seconds, on a thread, until stopped."""

    client: FailoverClient
    every_s: float = 0.05
    prefix: str = "job"
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="standby-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            n += 1
            self.answers.append(self.client.admit(f"{self.prefix}-{n:05d}"))
            next_at += self.every_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> list[Answer]:
        """Stop asking (again: nothing); the answers so far."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join(30)
            self.client.close()
        return self.answers


def first_answer_after(answers: list[Answer], instant: float) -> Answer | None:
    """The first decision (200) asked for after `instant`."""
    return next((a for a in answers if a.status == 200 and a.asked_at > instant), None)


def recorded_decisions(bootstrap: str, tag: str) -> list[AdmissionDecided]:
    """Every decision the admission log holds (committed and not void), in order."""
    tp = TopicPartition(f"{tag}.admission", 0)
    consumer, _ = replaying_consumer(bootstrap, [tp])
    found: list[AdmissionDecided] = []
    try:

        def keep(record: Any) -> None:
            event = recorded_event(record)  # what the service folds: void records are not
            if isinstance(event, AdmissionDecided):
                found.append(event)

        read_to_end(consumer, tp, keep)
    finally:
        consumer.close(autocommit=False)
    return found
