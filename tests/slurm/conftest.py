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
import uuid
from collections.abc import Iterator

import httpx
import pytest

from allmende.core.settings import Settings
from allmende.testing.budget_harness import ADMIN, ok, plan_text, serving, with_tokens
from allmende.testing.harness import MeterWorker
from allmende.testing.slurm_harness import (
    PLAN,
    PLATFORM_CLUSTER,
    SLURMCTLD,
    Platform,
    SlurmCluster,
    current_quarter,
    quarter_bounds,
    running_slurm,
)
from allmende.topology import create_app


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if not SLURMCTLD.exists():
        pytest.skip(f"{SLURMCTLD} is missing: install Slurm with infra/slurm/install.sh")
    if os.geteuid() != 0:
        pytest.skip("infra/slurm/start.sh runs the Slurm daemons as root")
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not on PATH (slurm-client)")
    with running_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def platform(
    slurm: SlurmCluster, kafka_bootstrap: str, chdb_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """The API (real clock) with the quarter's plan applied, and a meter worker."""
    tag = f"t{uuid.uuid4().hex[:10]}"
    tmp = tmp_path_factory.mktemp("platform")
    settings = Settings(
        kafka_bootstrap_servers=kafka_bootstrap, clickhouse_dsn=chdb_dsn, clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=2, meter_app_id=f"{tag}-meter", meter_data_dir=tmp / "faust",
        writer_group=f"{tag}-writer", writer_batch_wait_ms=100, log_json=False,
    )  # fmt: skip
    app = create_app(with_tokens(settings))  # the real clock: Slurm's jobs run now
    with serving(app) as url:
        now = dt.datetime.now(dt.UTC)
        start, end = quarter_bounds(now)
        text = PLAN.format(period=current_quarter(now), cluster=PLATFORM_CLUSTER, start=start, end=end)
        body = {"text": plan_text(text)}
        ok(httpx.post(f"{url}/v1/admin/plan/apply", json=body, headers=ADMIN, timeout=60))
        meter = MeterWorker(settings, tmp / "logs")
        try:
            meter.wait_ready()
            yield Platform(settings, url, app, meter)
        finally:
            meter.kill()
