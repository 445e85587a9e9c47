"""`bench/ingest.py --batch N`: GPU samples through the meter into the ledger (issue 24).

Jobs of a replayed ElasticFlow cluster are submitted (JobSubmitted on the job-events topic), then
each runs on a node of its own for `--rounds` scrapes of 30 s, its GPUs idle (so every record
makes a ledger row: the worst case for the ledger). The same samples are published twice, on
fresh topics each: N GPUs per record (one record per node and scrape, as the collector publishes)
and one GPU per record (each GPU as a node of its own). For each, the bench times one meter worker
and the ledger writer (this process, embedded chDB) from the worker's "ready" until the ledger
holds every row (`gpu_utilisation`), and prints samples/s, records/s and the ratio of the two
paths, measured in the same run, with the CPU other processes took meanwhile.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pipeline_timing import until_complete  # bench/: beside this script

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat
from allmende.schemas.events import JobSubmitted, encode_event
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id
from allmende.streams.ledger_writer import LedgerWriter
from allmende.testing.declared_plan import declare
from allmende.testing.harness import MeterWorker

INTERVAL_S = 30


def _records(jobs: list[JobSubmitted], rounds: int, per_record: int, node_gpus: int) -> Iterator[GpuSamples]:
    """Every job's node, each scrape: `gpus` idle GPUs, `per_record` to a record."""
    for r in range(1, rounds + 1):
        for i, job in enumerate(jobs):
            at = job.occurred_at + INTERVAL_S * r
            for first in range(0, node_gpus, per_record):
                node = f"node{i:05d}" if per_record == node_gpus else f"node{i:05d}-g{first}"
                gpus = range(first, first + per_record)
                yield GpuSamples(
                    event_id=sample_id(node, at, job.job_id), occurred_at=at, producer="bench", node=node,
                    job_id=job.job_id, interval_s=INTERVAL_S,
                    gpus=tuple(GpuSample(gpu=g, utilization_bp=(37 * g) % 400) for g in gpus),
                )  # fmt: skip


def run_path(
    args: argparse.Namespace, bootstrap: str, work: Path, jobs: list[JobSubmitted], per_record: int, cpu: type
) -> dict[str, float]:
    tag = f"bench{uuid.uuid4().hex[:8]}"
    settings = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=args.partitions, meter_app_id=f"{tag}-meter",
        meter_data_dir=work / tag / "faust", writer_group=f"{tag}-writer", log_json=False,
        log_level="WARNING", meter_loop=args.loop, meter_gpu_samples=True,
    )  # fmt: skip
    ensure_topics(settings)
    declare(settings, jobs)
    producer = make_producer(bootstrap)
    for job in jobs:
        producer.send(settings.job_events_topic, key=job.job_id.encode(), value=encode_event(job))
    records = samples = 0
    t0 = time.perf_counter()
    for record in _records(jobs, args.rounds, per_record, args.gpus):
        producer.send(settings.gpu_samples_topic, key=record.key, value=encode_gpu_samples(record))
        records += 1
        samples += len(record.gpus)
    producer.flush()
    producer.close()
    produce_s = time.perf_counter() - t0
    print(f"  {per_record} GPU(s) per record: {records:,} records, {samples:,} samples published "
          f"({records / produce_s:,.0f} records/s)")  # fmt: skip

    ceiling = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "faust_ceiling.py"), bootstrap,
         settings.gpu_samples_topic, str(records), args.loop],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    said = ceiling.stdout + ceiling.stderr
    counting = float(said.split("RATE ", 1)[1].split()[0]) if "RATE " in said else 0.0
    print(f"  faust agent that only counts, same topic: {counting:,.0f} records/s")
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    store = LedgerStore(db)
    writer = LedgerWriter(settings, store)
    writer.start()
    worker = MeterWorker(settings, work / tag / "logs")
    posted = [-1]
    first_rows: list[float] = []

    def complete() -> bool:
        if writer.batches == posted[0]:  # ask chDB only after the writer posted a batch
            return False
        posted[0] = writer.batches
        rows = int(db.rows("SELECT count() FROM {db}.gpu_utilisation")[0][0])
        if rows and not first_rows:
            first_rows.append(time.perf_counter())
        if rows >= records:
            first_rows.append(time.perf_counter())  # [first rows, all rows]
        return rows >= records

    took, other = until_complete(worker, writer, complete, cpu, "every row in the ledger")
    rows = int(db.rows("SELECT count() FROM {db}.gpu_utilisation FINAL")[0][0])
    assert rows == records, f"{rows} rows for {records} records"
    print(
        f"  through the meter into the ledger: {samples / took:,.0f} samples/s, {records / took:,.0f} "
        f"records/s ({took:.2f} s from the worker's ready); rows {rows:,} == records; "
        f"CPU meanwhile: {other}"
    )
    steady = first_rows[-1] - first_rows[0]
    print(
        f"  from the first rows in the ledger to the last: {samples / steady:,.0f} samples/s ({steady:.2f} s)"
    )
    if counting:
        print(f"  records/s through the meter / counting agent: {records / took / counting:.1%}")
    return {"samples_per_s": samples / took, "records_per_s": records / took}  # fmt: skip


def main(args: argparse.Namespace, bootstrap: str, trace: Path, cpu: type) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-samples-"))
    trace_jobs = list(read_trace(trace, TraceFormat.ELASTICFLOW, cluster=args.cluster))
    submitted = [e for e in timeline(trace_jobs, 3600) if isinstance(e, JobSubmitted)][: args.jobs]
    print(f"GPU samples: {len(submitted):,} jobs of {args.cluster}, {args.rounds} scrapes each, "
          f"{args.gpus} GPUs per node, all idle (a ledger row per record)")  # fmt: skip
    batched = run_path(args, bootstrap, work, submitted, args.batch, cpu)
    if args.batch_only:
        return
    single = run_path(args, bootstrap, work, submitted, 1, cpu)
    ratio = batched["samples_per_s"] / single["samples_per_s"]
    print(f"batched ({args.batch} per record): {batched['samples_per_s']:,.0f} samples/s")
    print(f"one per record:            {single['samples_per_s']:,.0f} samples/s")
    print(f"ratio batched / one per record: {ratio:.1f}x")
