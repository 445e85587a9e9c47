"""ClickHouse access: one client per process, serialised, and ordered migrations.

chDB (embedded) allows one data directory per process and its calls block, so every caller goes
through `Database`, which holds the single client behind a lock. Async code calls it through a
thread (`anyio.to_thread.run_sync`), never on the event loop.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.resources import files
from typing import Any

import clickhouse_connect
import structlog
from clickhouse_connect.driver.client import Client

# The DDL ships in the package (schemas/clickhouse), read as a resource: installed or from a checkout.
MIGRATIONS_DIR = files("allmende.schemas") / "clickhouse"
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

log = structlog.get_logger(__name__)

_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()

# Background work (the alerter's sweeps) must not take the cores the requests need: its queries
# run on one thread at the lowest priority. A context variable, so the queries of whatever a
# background round calls (dashboard reads shared with the pages) are marked without a parameter.
_BACKGROUND: ContextVar[bool] = ContextVar("allmende_background_queries", default=False)
BACKGROUND_SETTINGS = {"max_threads": 1, "os_thread_priority": 19}
# chDB's own background threads (merges, schedules, fetches) in an embedded engine: niced like the
# background queries, so the API's event loop is scheduled before them on a busy machine.
_ENGINE_THREADS = (
    "MergeMutate",
    "BgSchPool",
    "BgMBSchPool",
    "BgStrmSchPool",
    "BgDistSchPool",
    "Move",
    "Fetch",
    "Common",
)


@contextmanager
def background_queries() -> Iterator[None]:
    """Queries made within run as background work (`BACKGROUND_SETTINGS`)."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def nice_engine_threads(niceness: int = 19) -> int:
    """Lower the priority of this process's chDB background threads (Linux; new ones appear as
    pools grow, so call it again now and then); returns how many were lowered this time."""
    lowered = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith(_ENGINE_THREADS) and os.getpriority(os.PRIO_PROCESS, int(tid)) < niceness:
                os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
                lowered += 1
        except OSError:  # the thread ended meanwhile, or the system refuses: nothing to do
            continue
    return lowered


def _client_for(dsn: str) -> Client:
    # chDB refuses a second data directory in one process; share one client per DSN.
    with _clients_lock:
        if dsn not in _clients:
            _clients[dsn] = clickhouse_connect.get_client(dsn=dsn)
        return _clients[dsn]


class Database:
    """A ClickHouse database reached through one shared, lock-guarded client."""

    def __init__(self, dsn: str, database: str) -> None:
        if not _DB_NAME.match(database):
            raise ValueError(f"invalid ClickHouse database name {database!r}")
        self.dsn = dsn
        self.name = database
        self._client = _client_for(dsn)
        self._lock = threading.RLock()

    @property
    def embedded(self) -> bool:
        return self.dsn.startswith("chdb:")

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        with self._lock:
            return self._client.command(sql.replace("{db}", self.name), parameters=parameters)

    def _query(self, sql: str, parameters: dict[str, Any] | None) -> Any:
        settings = BACKGROUND_SETTINGS if _BACKGROUND.get() else None
        with self._lock:
            return self._client.query(
                sql.replace("{db}", self.name), parameters=parameters, settings=settings
            )

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._query(sql, parameters).result_rows]

    def columns(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Sequence[Any]]:
        """The result column by column: no tuple per row, for reads of thousands of rows."""
        return list(self._query(sql, parameters).result_columns)  # empty when there are no rows

    def insert(self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        if not rows:
            return
        with self._lock:
            self._client.insert(f"{self.name}.{table}", rows, column_names=list(columns))

    def migrate(self) -> list[str]:
        """Apply the ordered migrations not yet applied; safe to call at every start."""
        self.command("CREATE DATABASE IF NOT EXISTS {db}")
        self.command(
            "CREATE TABLE IF NOT EXISTS {db}.schema_migrations "
            "(version UInt32, name String, checksum String, applied_at DateTime DEFAULT now()) "
            "ENGINE = ReplacingMergeTree ORDER BY version"
        )
        applied = {
            int(v): checksum
            for v, checksum in self.rows("SELECT version, checksum FROM {db}.schema_migrations FINAL")
        }
        done = []
        migrations = [p for p in MIGRATIONS_DIR.iterdir() if re.fullmatch(r"[0-9]{4}_.*\.sql", p.name)]
        for path in sorted(migrations, key=lambda p: p.name):
            version = int(path.name[:4])
            text = path.read_text()
            checksum = hashlib.sha256(text.encode()).hexdigest()
            if version in applied:
                if applied[version] != checksum:
                    # Editing an applied migration would leave databases that differ silently.
                    raise RuntimeError(f"migration {path.name} changed after it was applied")
                continue
            for statement in _statements(text):
                self.command(statement)
            self.insert(
                "schema_migrations", [[version, path.name, checksum]], ["version", "name", "checksum"]
            )
            done.append(path.name)
            log.info("migration_applied", migration=path.name, database=self.name)
        return done


def _statements(sql: str) -> list[str]:
    without_comments = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in without_comments.split(";") if s.strip()]
