"""ClickHouse access: one client per process, serialised, and ordered migrations.

chDB (embedded) allows one data directory per process and its calls block, so every caller goes
through `Database`, which holds the single client behind a lock. Async code calls it through a
thread (`anyio.to_thread.run_sync`), never on the event loop.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
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

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self._lock:
            result = self._client.query(sql.replace("{db}", self.name), parameters=parameters)
            return [tuple(r) for r in result.result_rows]

    def columns(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Sequence[Any]]:
        """The result column by column: no tuple per row, for reads of thousands of rows."""
        with self._lock:
            result = self._client.query(sql.replace("{db}", self.name), parameters=parameters)
            return list(result.result_columns)  # empty when there are no rows

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
