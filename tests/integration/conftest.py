from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.harness import Pipeline

pytestmark = pytest.mark.integration


@pytest.fixture
def store(settings: Settings) -> LedgerStore:
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    ensure_topics(settings)
    return LedgerStore(db)


@pytest.fixture
def writer(settings: Settings, store: LedgerStore) -> Iterator[LedgerWriter]:
    w = LedgerWriter(settings, store)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def pipeline(
    settings: Settings, store: LedgerStore, writer: LedgerWriter, tmp_path: Path
) -> Iterator[Pipeline]:
    """A ledger writer running; start meter workers with `pipeline.start_meter()`."""
    running = Pipeline(settings, store, writer, tmp_path / "logs")
    yield running
    for worker in running.meters:
        worker.kill()
