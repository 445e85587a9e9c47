"""Shared fixtures: a real Kafka broker and a real chDB ledger for the integration tests.

The broker is chosen in this order: KAFKA_BOOTSTRAP_SERVERS if set; testcontainers' Kafka when
a Docker daemon answers; otherwise a local KRaft broker started from the project's jars. Every
test gets its own topic prefix, ClickHouse database and consumer groups, so tests share one
broker and one chDB directory (chDB allows one per process) without seeing each other.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.harness import Pipeline
from allmende.testing.kubernetes import BIN, KubeCluster, missing_binaries, running_kubernetes
from allmende.testing.tagged_settings import tagged_settings

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "data" / "traces"


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    if servers := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield servers
        return
    if _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from allmende.core.kafka_local import LocalBroker, free_port

    home = Path(tempfile.mkdtemp(prefix="allmende-kafka-"))
    broker = LocalBroker(home, port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def chdb_dsn() -> str:
    if dsn := os.environ.get("ALLMENDE_TEST_CLICKHOUSE_DSN"):
        return dsn
    return f"chdb://{tempfile.mkdtemp(prefix='allmende-chdb-')}"


@pytest.fixture
def settings(kafka_bootstrap: str, chdb_dsn: str, tmp_path: Path) -> Settings:
    return tagged_settings(kafka_bootstrap, chdb_dsn, tmp_path)


@pytest.fixture(scope="session")
def elasticflow_tarball() -> Path:
    path = TRACES / "elasticflow" / "raw-traces.tar.gz"
    if not path.exists():
        pytest.skip(f"trace not found at {path}")
    return path


# The ledger of one test and its pipeline (tests/integration, tests/faults).
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


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A real etcd, kube-apiserver and Kueue on 127.0.0.1, one per session (tests/kueue, and the
    Slurm twin in tests/slurm; allmende.testing.kubernetes; built by `make kubernetes`)."""
    if missing := missing_binaries():
        names = ", ".join(str(path.relative_to(BIN)) for path in missing)
        pytest.fail(f"not in {BIN}: {names}: run `make kubernetes` first", pytrace=False)
    with running_kubernetes(tmp_path_factory.mktemp("kubernetes")) as cluster:
        phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in cluster.phase_seconds.items())
        memory = sum(cluster.rss_mb().values())
        # shown with -s
        print(f"\nKubernetes with Kueue ready in {cluster.startup_seconds:.1f}s ({phases}), {memory:.0f} MB")
        yield cluster
