"""Settings of one test's platform: its own topic prefix, ClickHouse database and consumer
groups (`<prefix><10 hex>`), so tests share one broker and one chDB directory without seeing each
other."""

from __future__ import annotations

import uuid
from pathlib import Path

from allmende.core.settings import Settings

FICTIONAL_FUTURE_S = 5 * 366 * 86_400


def tagged_settings(kafka_bootstrap: str, chdb_dsn: str, workdir: Path, prefix: str = "t") -> Settings:
    tag = f"{prefix}{uuid.uuid4().hex[:10]}"
    return Settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        clickhouse_dsn=chdb_dsn,
        clickhouse_database=tag,
        topic_prefix=tag,
        topic_partitions=4,
        meter_app_id=f"{tag}-meter",
        meter_data_dir=workdir / "faust",
        checkpoint_dir=workdir / "checkpoints",
        writer_group=f"{tag}-writer",
        writer_batch_wait_ms=100,
        # A loaded test machine may take longer than the 250 ms default to acknowledge a write;
        # the outage tests set the default back to show that bound.
        write_timeout_ms=3000,
        # Many tests' fictional instants lie in 2027 (a quarter ahead of any real clock); the
        # meter's check against its wall clock is tested where the default is set back.
        clock_skew_s=FICTIONAL_FUTURE_S,
        log_json=False,
    )
