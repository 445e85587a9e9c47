"""A single-node Apache Kafka 4 broker (KRaft) on 127.0.0.1, run from jars on Maven Central.

`infra/kafka/pom.xml` copies the broker and its dependencies into `infra/kafka/lib` once; Maven's
local repository then lets later runs work offline. Outside a checkout (an installed wheel),
`ALLMENDE_KAFKA_JARS` names a folder of those jars, or KAFKA_BOOTSTRAP_SERVERS a running
broker. The CLI (`allmende kafka start|stop|status`) and the test fixtures share this module.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import structlog

from allmende.core.paths import source_checkout
from allmende.core.supervisor import running, start_detached, stop_detached

log = structlog.get_logger(__name__)


_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


class BrokerError(RuntimeError):
    pass


def ensure_jars() -> Path:
    """The broker jars: `ALLMENDE_KAFKA_JARS`, else the checkout's (fetched with Maven the first time)."""
    if given := os.environ.get("ALLMENDE_KAFKA_JARS"):
        return Path(given)
    checkout = source_checkout()
    if checkout is None:
        raise BrokerError(
            "no Kafka jars: set ALLMENDE_KAFKA_JARS to a folder of Kafka 4 jars (infra/kafka/pom.xml"
            " of the source fetches them), or KAFKA_BOOTSTRAP_SERVERS to a running broker"
        )
    infra = checkout / "infra" / "kafka"
    jars = infra / "lib"
    if jars.is_dir() and any(jars.glob("kafka_2.13-*.jar")):
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is needed once to fetch the Kafka broker jars")
    log.info("kafka_jars_fetching", pom=str(infra / "pom.xml"))
    subprocess.run([mvn, "-q", "-B", "-f", str(infra / "pom.xml"), "package"], check=True)
    return jars


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url. Like Kafka's own Uuid, never with a
    leading '-', which command-line parsers would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KAFKA_JVM_PERFORMANCE_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)


@dataclass
class LocalBroker:
    home: Path
    port: int = 19092
    controller_port: int = 19093
    heap_mb: int = 768

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def gc_log(self) -> Path:
        """The JVM's garbage-collector log: every pause, with its length (`Pause ... 3.456ms`)."""
        return self.home / "gc.log"

    def _config(self) -> Path:
        data = self.home / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "6",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # A single local node: no reason to delay the first rebalance.
            "group.initial.rebalance.delay.ms": "0",
            # Admission's leader lease is a group session: a standby takes over within seconds.
            "group.min.session.timeout.ms": "1000",
            "auto.create.topics.enable": "false",
        }
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(
            _LOG4J2.format(log_file=self.home / "kafka-server.log", level="INFO")
        )
        return path

    def _java(self, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("Java 17+ is needed to run the local Kafka broker")
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 256)}m",
            # As Kafka's own start scripts run it (kafka-run-class.sh): G1 aiming at 20 ms pauses.
            # The JVM's default aim is 200 ms, and every producer waiting for an acknowledgement
            # (every admission answer) waits through a pause.
            *KAFKA_JVM_PERFORMANCE_OPTS,
            f"-Xlog:gc:file={self.gc_log}:time,uptime:filecount=2,filesize=50m",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.home}",
            "-cp",
            f"{ensure_jars()}/*",
            *args,
        ]

    def running_pid(self) -> int | None:
        return running(self.pid_file)

    def start(self, timeout: float = 90.0) -> str:
        """Start the broker (formatting its storage the first time); idempotent. A pid file that
        names a dead, zombie or reused pid is no broker (`supervisor.inspect`): one is started."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.running_pid() is not None:
            self.wait_ready(timeout)
            return self.bootstrap
        config = self._prepare()
        pid = start_detached(self.pid_file, self.log_file, self._java("kafka.Kafka", str(config)))
        log.info("kafka_starting", pid=pid, bootstrap=self.bootstrap, home=str(self.home))
        self.wait_ready(timeout)
        return self.bootstrap

    def run_foreground(self) -> NoReturn:
        """Become the broker (exec the JVM in this process, no pid file): for a service manager
        that supervises it itself (infra/systemd). Formats the storage the first time."""
        self.home.mkdir(parents=True, exist_ok=True)
        argv = self._java("kafka.Kafka", str(self._prepare()))
        log.info("kafka_exec", bootstrap=self.bootstrap, home=str(self.home))
        sys.stdout.flush()  # exec drops what is still buffered
        sys.stderr.flush()
        os.execv(argv[0], argv)

    def _prepare(self) -> Path:
        """The configuration, written; the storage, formatted the first time; the port, free."""
        if port_open("127.0.0.1", self.port):
            raise BrokerError(f"port {self.port} is taken by another process")
        config = self._config()
        if not (self.home / "data" / "meta.properties").exists():
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", f"--cluster-id={new_cluster_id()}", "-c", str(config)
                ),
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise BrokerError(f"formatting Kafka storage failed: {formatted.stderr or formatted.stdout}")
        return config

    def wait_ready(self, timeout: float = 90.0) -> None:
        wait_for_kafka(self.bootstrap, timeout, is_alive=lambda: self.running_pid() is not None)

    def stop(self, timeout: float = 30.0) -> None:
        pid = self.running_pid()
        if stop_detached(self.pid_file, timeout):
            log.info("kafka_stopped", pid=pid)


@contextmanager
def broker_for_run(home: Path, say: Callable[[str], None] = print) -> Iterator[str]:
    """The bootstrap of KAFKA_BOOTSTRAP_SERVERS if set, else of a local broker started in `home`
    on free ports and stopped after: what the benchmarks and scripts run against."""
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield bootstrap
        return
    broker = LocalBroker(home, port=free_port(), controller_port=free_port())
    say("starting a local Kafka broker")
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def wait_for_kafka(bootstrap: str, timeout: float = 90.0, is_alive: object = None) -> None:
    """Block until the broker answers metadata requests (or raise BrokerError)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if callable(is_alive) and not is_alive():
            raise BrokerError("the Kafka broker process exited; see its broker.log")
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
            try:
                admin.list_topics()
                admin.describe_cluster()
                return
            finally:
                admin.close()
        except (KafkaError, OSError, ValueError) as exc:
            last = exc
            time.sleep(0.5)
    raise BrokerError(f"Kafka at {bootstrap} not ready after {timeout:.0f}s: {last!r}")
