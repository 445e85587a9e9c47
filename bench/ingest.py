"""End-to-end ingest benchmark: job events on Kafka -> ledger rows visible in ClickHouse.

It fills a fresh job-events topic with a replayed ElasticFlow cluster, then starts the ledger
writer (this process, embedded chDB) and one meter worker process, and times from the worker's
"ready" to the moment the ledger holds every GPU-second of the trace. In the same run it times a
plain kafka-python consumer reading the same topic, and a faust agent that only counts records
(bench/faust_ceiling.py: the same event loop, consumer settings and batches as the meter), the
rates the pipeline is compared with. The machine may be shared: for the counting agent and for
the end-to-end run it prints how much CPU other processes took meanwhile (from /proc/stat, less
this process, its children, the meter worker and the local broker).

    .venv/bin/python bench/ingest.py [--cluster cluster02] [--sample-every 600] [--loop uvloop]
    .venv/bin/python bench/ingest.py --batch 8 [--jobs 2000] [--rounds 60]   # GPU samples (issue 24)

Uses KAFKA_BOOTSTRAP_SERVERS if set, else starts a local broker in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from pipeline_timing import until_complete  # bench/: beside this script

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, publish, timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.declared_plan import declare
from allmende.testing.harness import MeterWorker

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "elasticflow" / "raw-traces.tar.gz"


def machine_busy_s() -> float:
    """CPU seconds all cores have been busy since boot (guest time is already inside user)."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first.split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of one process (all its threads); 0 once it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuWatch:
    """How much CPU the bench's own processes and everything else took over one phase."""

    def __init__(self, pids: list[int | None]) -> None:
        self.pids = pids
        self.t0 = time.perf_counter()
        self.busy0 = machine_busy_s()
        self.ours0 = self._ours()

    def _ours(self) -> float:
        me = os.times()  # this process (writer, chDB) and the children it has waited for
        own = me.user + me.system + me.children_user + me.children_system
        return own + sum(process_cpu_s(pid) for pid in self.pids)

    def stop(self) -> str:
        wall = time.perf_counter() - self.t0
        ours = self._ours() - self.ours0
        others = max(0.0, machine_busy_s() - self.busy0 - ours)
        cores = os.cpu_count() or 1
        return (
            f"{ours:.1f} CPU-s ours, {others:.1f} CPU-s other processes' "
            f"({others / (wall * cores):.0%} of {cores} cores over {wall:.1f} s)"
        )


def raw_consume_rate(settings: Settings, topic: str, expected: int) -> tuple[int, float]:
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        enable_auto_commit=False,
        max_poll_records=20_000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    t0 = time.perf_counter()
    seen = 0
    while seen < expected:
        for records in consumer.poll(timeout_ms=500).values():
            seen += len(records)
    elapsed = time.perf_counter() - t0
    consumer.close()
    return seen, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cluster", default="cluster02")
    parser.add_argument("--sample-every", type=int, default=600)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--loop", choices=("uvloop", "aio"), default=os.environ.get("ALLMENDE_METER_LOOP", "uvloop"),
        help="event loop of the meter worker and of the counting agent (ALLMENDE_METER_LOOP)",
    )  # fmt: skip
    parser.add_argument(
        "--batch", type=int, default=0,
        help="time GPU samples instead (issue 24): N GPUs per record beside one per record",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2000, help="with --batch: jobs (one node each)")
    parser.add_argument("--rounds", type=int, default=60, help="with --batch: scrapes per node")
    parser.add_argument("--gpus", type=int, default=8, help="with --batch: GPUs per node")
    parser.add_argument("--batch-only", action="store_true", help="with --batch: only the batched path")
    args = parser.parse_args()
    os.environ["ALLMENDE_METER_LOOP"] = args.loop  # the meter worker's environment is this one's

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from allmende.core.kafka_local import LocalBroker, free_port

        broker = LocalBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-")), free_port(), free_port())
        bootstrap = broker.start()
    if args.batch:
        import ingest_samples  # bench/: beside this script

        broker_pid = broker.running_pid() if broker is not None else None

        class Watch(CpuWatch):  # the broker is the bench's too
            def __init__(self, pids: list[int | None]) -> None:
                super().__init__([broker_pid, *pids])

        try:
            ingest_samples.main(args, bootstrap, TRACE, Watch)
        finally:
            if broker is not None:
                broker.stop()
        return
    tag = f"bench{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    settings = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=args.partitions, meter_app_id=f"{tag}-meter",
        meter_data_dir=work / "faust", writer_group=f"{tag}-writer", log_json=False, log_level="WARNING",
        meter_loop=args.loop,
    )  # fmt: skip
    try:
        jobs = list(read_trace(TRACE, TraceFormat.ELASTICFLOW, cluster=args.cluster))
        expected_gpu_seconds = sum(j.gpu_seconds for j in jobs)
        ensure_topics(settings)
        declare(settings, jobs)  # the meter checks every event against the plan
        producer = make_producer(bootstrap)
        t0 = time.perf_counter()
        events = publish(producer, settings.job_events_topic, timeline(jobs, args.sample_every))
        producer.close()
        produce_s = time.perf_counter() - t0
        print(f"trace: {args.cluster}, {len(jobs):,} jobs, {events:,} events, {expected_gpu_seconds:,} GPU-s")
        print(f"produce: {events / produce_s:,.0f} events/s")

        broker_pid = broker.running_pid() if broker is not None else None
        seen, raw_s = raw_consume_rate(settings, settings.job_events_topic, events)
        raw_rate = seen / raw_s
        watch = CpuWatch([broker_pid])
        ceiling = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "faust_ceiling.py"), bootstrap, settings.job_events_topic,
             str(events), args.loop],
            capture_output=True, text=True, timeout=900, cwd=ROOT,
        )  # fmt: skip
        ceiling_cpu = watch.stop()
        said = ceiling.stdout + ceiling.stderr
        faust_rate = float(said.split("RATE ", 1)[1].split()[0]) if "RATE " in said else 0.0
        ceiling_loop = said.split("LOOP ", 1)[1].split()[0] if "LOOP " in said else "?"

        db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
        db.migrate()
        store = LedgerStore(db)
        writer = LedgerWriter(settings, store)
        writer.start()
        worker = MeterWorker(settings, work / "logs")
        posted = [-1]

        def ledger_complete() -> bool:
            # Ask chDB only after the writer posted a batch: a query per poll competes with it.
            if writer.batches == posted[0]:
                return False
            posted[0] = writer.batches
            return store.total_gpu_seconds() == expected_gpu_seconds

        e2e_s, e2e_cpu = until_complete(
            worker, writer, ledger_complete, lambda pids: CpuWatch([broker_pid, *pids]), "ledger"
        )
        found = re.search(r"meter_loop .*policy=(\S+)", worker.log_path.read_text(errors="replace"))
        meter_loop = found.group(1) if found else "?"
        e2e_rate = events / e2e_s
        postings = db.rows("SELECT count() FROM {db}.ledger_postings")[0][0]
        print(f"raw consumer (kafka-python, same topic): {raw_rate:,.0f} events/s ({raw_s:.2f} s)")
        print(
            "end to end (Kafka -> meter -> writer -> chDB rows visible): "
            f"{e2e_rate:,.0f} events/s ({e2e_s:.2f} s)"
        )
        print(f"ledger postings written: {postings:,}; ledger total == trace total: True")
        print(f"faust agent that only counts (the framework's ceiling): {faust_rate:,.0f} events/s")
        print(f"event loop: meter worker {meter_loop}, counting agent {ceiling_loop} (asked: {args.loop})")
        print(f"CPU during the counting agent: {ceiling_cpu}")
        print(f"CPU during end to end:         {e2e_cpu}")
        print(f"ratio end-to-end / raw consumer: {e2e_rate / raw_rate:.1%}")
        if faust_rate:
            print(f"ratio end-to-end / counting faust agent: {e2e_rate / faust_rate:.1%}")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
