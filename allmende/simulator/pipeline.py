"""A simulated run through the real pipeline: its own topics and ledger database.

The engine's lifecycle events go to the run's job-events topic (`KafkaSink`), where the real meter
worker (a `allmende.streams.meter_worker` process) and the real ledger writer (a `allmende.simulator.writer`
process, on the run's chDB directory or ClickHouse database) turn them into ledger postings,
priced by the plan's policy (the plan's admin events go to the run's admin topic first). The
platform policy's admission events go to the run's admission topic. At the end the ledger is
checked against the simulation, job by job (`LedgerCheck`): the GPU-seconds the engine ran must
be in the ledger, exactly.

Topic prefix and database are `sim_<run>` (with chDB, in a directory of the run's own): a
simulated run never mixes with production data.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaProducer

from allmende.core.kafka_topics import ensure_topics
from allmende.core.replay import make_producer
from allmende.core.settings import Settings
from allmende.core.supervisor import Child, python_module
from allmende.domain.admin_state import AdminState
from allmende.domain.simulation.engine import Simulation
from allmende.domain.simulation.interfaces import SimEvent, Sink
from allmende.domain.simulation.model import SimulationResult
from allmende.schemas.admin_events import encode_admin_event
from allmende.schemas.admission_events import AdmissionEvent, encode_admission_event
from allmende.schemas.events import encode_event
from allmende.simulator.platform import ObservingSink, PlatformPolicy
from allmende.simulator.writer import LedgerCheck
from allmende.topology import MeterProcess, meter_env

SIMULATED_CLOCK_SKEW_S = 100 * 366 * 86_400  # a simulated quarter may lie ahead: no bound to speak of


def run_settings(base: Settings, work: Path, run: str | None = None) -> Settings:
    """`base` (the broker, the ClickHouse DSN) with topics, database and meter state of a run's own.
    With chDB, the database is in a directory under `work`: the run's writer process owns it."""
    # The run's id keeps names readable; a random part keeps two runs on one broker apart.
    tag = f"sim_{run}_{uuid.uuid4().hex[:8]}" if run else f"sim_{uuid.uuid4().hex[:10]}"
    dsn = base.clickhouse_dsn
    if dsn.startswith("chdb://"):
        dsn = f"chdb://{work / 'chdb' / tag}"
    return base.model_copy(
        update={
            "topic_prefix": tag,
            # A simulated run wants throughput, not latency: fewer, larger inserts into its ledger.
            "writer_batch_wait_ms": max(base.writer_batch_wait_ms, 1000),
            "clickhouse_dsn": dsn,
            "clickhouse_database": tag,
            "meter_app_id": f"{tag}-meter",
            "meter_data_dir": work / "faust",
            "writer_group": f"{tag}-writer",
            # A run's instants are the simulation's, in the plan's period, not the wall clock's.
            "clock_skew_s": SIMULATED_CLOCK_SKEW_S,
        }
    )


class KafkaSink:
    """Sends every lifecycle event to the run's job-events topic, keyed by job (the meter's order)."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.job_events_topic
        self.producer: KafkaProducer = make_producer(settings.kafka_bootstrap_servers)
        self.sent = 0

    def emit(self, event: SimEvent) -> None:
        self.producer.send(self.topic, key=event.job_id.encode(), value=encode_event(event))
        self.sent += 1

    def close(self) -> None:
        self.producer.flush()  # acks=all: once this returns, Kafka holds every event
        self.producer.close()


def publish_admin(settings: Settings, state: AdminState) -> None:
    """The plan's admin events on the run's admin topic: the writer prices with its policy."""
    _send(
        settings, settings.admin_events_topic, [(e.aggregate, encode_admin_event(e)) for e in state.history]
    )


def publish_admission(settings: Settings, events: Sequence[AdmissionEvent]) -> None:
    """The platform's decisions, holds and host reports: the run's admission log."""
    _send(settings, settings.admission_topic, [(e.key, encode_admission_event(e)) for e in events])


def _send(settings: Settings, topic: str, records: Sequence[tuple[str, bytes]]) -> None:
    producer = make_producer(settings.kafka_bootstrap_servers)
    try:
        for key, value in records:
            producer.send(topic, key=key.encode(), value=value, partition=0)
        producer.flush()
    finally:
        producer.close()


class WriterProcess:
    """The run's ledger writer in a process of its own (`allmende.simulator.writer`)."""

    def __init__(self, settings: Settings, work: Path) -> None:
        self.dir = work / f"writer-{uuid.uuid4().hex[:8]}"
        self.dir.mkdir(parents=True)
        (self.dir / "settings.json").write_text(settings.model_dump_json())
        self.child = Child(
            python_module("allmende.simulator.writer", str(self.dir)),
            self.dir / "writer.log",
            meter_env(settings),
        )

    def _wait_for(self, name: str, timeout_s: float) -> Path:
        path = self.dir / name
        self.child.wait_for(path.exists, timeout_s, f"the run's ledger writer (waiting for {name})")
        return path

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        self._wait_for("ready", timeout_s)

    def check(
        self, expected: Mapping[str, int], projects: Sequence[str], timeout_s: float
    ) -> tuple[LedgerCheck, dict[str, int]]:
        """Once the run's events are all in Kafka: the ledger against them, and the charges."""
        asked = {"gpu_seconds": dict(expected), "projects": list(projects), "timeout_s": timeout_s}
        partial = self.dir / "expected.json.part"
        partial.write_text(json.dumps(asked))
        partial.rename(self.dir / "expected.json")
        answer = json.loads(self._wait_for("check.json", timeout_s + 120).read_text())
        mismatched = {job: (int(a), int(b)) for job, (a, b) in answer["mismatched"].items()}
        check = LedgerCheck(answer["jobs"], answer["gpu_seconds"], answer["ledger_gpu_seconds"], mismatched)
        return check, {p: int(units) for p, units in answer["charges"].items()}

    def stop(self) -> None:
        self.child.stop()


@contextlib.contextmanager
def pipeline(settings: Settings, work: Path) -> Iterator[WriterProcess]:
    """The run's topics, its ledger writer and one meter worker, each a process of its own."""
    ensure_topics(settings)
    writer = WriterProcess(settings, work)
    meter = MeterProcess(settings, work / "logs")
    try:
        writer.wait_ready(120)
        meter.wait_ready(120)
        yield writer
    finally:
        meter.stop()
        writer.stop()


@dataclass
class PipelineRun:
    result: SimulationResult
    events: int  # lifecycle events sent to the run's job-events topic
    check: LedgerCheck
    charges: dict[str, int]  # charge units per project, from the ledger
    simulated_s: float = 0.0  # wall time of the engine's loop (deciding, metering, sending)
    exact_s: float = 0.0  # wall time from the first event to the ledger holding the last one


def simulate_through_pipeline(
    settings: Settings,
    work: Path,
    simulation: Callable[[Sink], Simulation],
    admin: AdminState,
    *,
    platform: PlatformPolicy | None = None,
    on_step: Callable[[Simulation], None] | None = None,
    timeout_s: float = 1800.0,
) -> PipelineRun:
    """Run a simulation whose events go through the run's pipeline, then check the ledger.

    `simulation` builds the engine on the sink it is given; with `platform`, that policy observes
    every event first (its state follows the engine) and its admission events are published."""
    with pipeline(settings, work) as writer:
        publish_admin(settings, admin)
        kafka = KafkaSink(settings)
        started = time.perf_counter()
        try:
            sim = simulation(ObservingSink(platform, kafka) if platform is not None else kafka)
            while sim.step():
                if on_step is not None:
                    on_step(sim)
            result = sim.result()
        finally:
            kafka.close()
        simulated_s = time.perf_counter() - started
        if platform is not None:
            publish_admission(settings, platform.recorded)
        expected = {record.job.job_id: sum(r.gpu_seconds for r in record.runs) for record in result.jobs}
        check, charges = writer.check(expected, admin.projects(), timeout_s)
        exact_s = time.perf_counter() - started
    return PipelineRun(result, kafka.sent, check, charges, simulated_s, exact_s)


def replay_through_pipeline(
    settings: Settings,
    work: Path,
    events: Sequence[SimEvent],
    admin: AdminState,
    expected: Mapping[str, int],
    timeout_s: float = 1800.0,
) -> tuple[LedgerCheck, float]:
    """The same events, sent as they are (no simulation, no decisions): the baseline a simulated
    run is measured against. Returns the ledger check and the wall time to an exact ledger."""
    with pipeline(settings, work) as writer:
        publish_admin(settings, admin)
        kafka = KafkaSink(settings)
        started = time.perf_counter()
        try:
            for event in events:
                kafka.emit(event)
        finally:
            kafka.close()
        check, _ = writer.check(expected, admin.projects(), timeout_s)
        return check, time.perf_counter() - started
