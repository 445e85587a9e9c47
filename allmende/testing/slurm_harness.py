"""The pieces of the Slurm tests: the local Slurm cluster, the platform, and waiting on both."""

from __future__ import annotations

import contextlib
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from allmende.core.settings import Settings
from allmende.integrations.slurm import local
from allmende.integrations.slurm.local import (  # noqa: F401  (the tests and bench import them from here)
    JOB_SUBMIT_LUA,
    PLAN,
    PLATFORM_CLUSTER,
    ROOT,
    SLURMCTLD,
    SlurmCluster,
    current_quarter,
    hook_python,
    quarter_bounds,
)
from allmende.testing.budget_harness import ADMIN, ok, serving, with_tokens
from allmende.testing.harness import MeterWorker, wait_until
from allmende.topology import create_app

SLURM_CLUSTER = "pytest"  # Slurm's ClusterName
TOKEN = "sched-secret"  # budget_harness.with_tokens' scheduler token
RESEARCHER = "researcher"  # an unprivileged user with an association in every account


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


@contextlib.contextmanager
def running_platform(
    kafka_bootstrap: str, chdb_dsn: str, tmp: Path, plan: str, prefix: str = "t", **changes: Any
) -> Iterator[Platform]:
    """The API on the real clock (a scheduler's jobs run now) on the test broker and chDB, with
    topics and a database of its own and `plan` applied, and a meter worker; `changes` to its
    settings."""
    tag = f"{prefix}{uuid.uuid4().hex[:10]}"
    settings = Settings(
        kafka_bootstrap_servers=kafka_bootstrap, clickhouse_dsn=chdb_dsn, clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=2, meter_app_id=f"{tag}-meter", meter_data_dir=tmp / "faust",
        writer_group=f"{tag}-writer", writer_batch_wait_ms=100, log_json=False, **changes,
    )  # fmt: skip
    app = create_app(with_tokens(settings))
    with serving(app) as url:
        ok(httpx.post(f"{url}/v1/admin/plan/apply", json={"text": plan}, headers=ADMIN, timeout=60))
        meter = MeterWorker(settings, tmp / "logs")
        try:
            meter.wait_ready()
            yield Platform(settings, url, app, meter)
        finally:
            meter.kill()


def wait_for(check: Any, timeout: float, what: str, slurm: SlurmCluster | None = None) -> Any:
    """`wait_until`; a timeout with `slurm` given says what Slurm's queue and nodes were."""
    try:
        return wait_until(check, timeout, what, every=0.2)
    except TimeoutError as exc:
        if slurm is None:
            raise
        raise TimeoutError(f"{exc}\n{slurm.described()}") from None


def running_slurm(state: Path, hooks: bool = True) -> contextlib.AbstractContextManager[SlurmCluster]:
    """The local Slurm (integrations/slurm/local.py) in `state` on free ports, with Allmende's
    job_submit.lua and cli_filter.lua and, with `hooks`, its lifecycle hooks; stopped after. Its
    users: root and RESEARCHER (a local account made here when missing)."""
    ensure_unix_user(RESEARCHER)
    return local.running_slurm(state, SLURM_CLUSTER, hooks=hooks, token=TOKEN, users=("root", RESEARCHER))


def ensure_unix_user(name: str) -> None:
    """A local user without a home or password (useradd, as root), for tests run as someone else."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True, capture_output=True, timeout=60)
