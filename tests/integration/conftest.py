from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.clickhouse import Database
from allmende.kafka_topics import ensure_topics
from allmende.settings import Settings
from services.ledger_store import LedgerStore
from services.ledger_writer import LedgerWriter
from tests.integration.harness import MeterWorker

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
def meters(settings: Settings, tmp_path: Path) -> Iterator[list[MeterWorker]]:
    """Start meter workers with `meters.append(MeterWorker(...))`; all are stopped at the end."""
    started: list[MeterWorker] = []
    yield started
    for worker in started:
        worker.kill()
