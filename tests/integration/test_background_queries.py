"""Background work yields the cores to requests (issue 29): the alerter's queries run on one thread
at the lowest priority, and an embedded engine's own background threads are niced. On chDB."""

from __future__ import annotations

import os

import pytest

from allmende.core.clickhouse import Database, background_queries, nice_engine_threads
from allmende.core.settings import Settings

pytestmark = pytest.mark.integration


def _engine_niceness() -> dict[str, int]:
    found = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
        if name.startswith(("MergeMutate", "BgSchPool")):
            found[f"{name}/{tid}"] = os.getpriority(os.PRIO_PROCESS, int(tid))
    return found


def test_background_queries_run_on_one_thread_at_the_lowest_priority(settings: Settings) -> None:
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    ask = "SELECT getSetting('max_threads'), getSetting('os_thread_priority')"
    with background_queries():
        assert db.rows(ask) == [(1, 19)]
    assert db.rows(ask)[0][1] == 0  # a request's query: as the engine sets it


def test_the_engines_merge_threads_are_niced(settings: Settings) -> None:
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()  # the engine is up, its pools started
    assert _engine_niceness(), "chDB's background threads are named as ClickHouse names them"
    nice_engine_threads()
    assert set(_engine_niceness().values()) == {19}
