"""`bench/ingest.py --batch N`: GPU samples from their topic into the ledger (issue 24).

Jobs of a replayed ElasticFlow cluster each run on a node of their own for `--rounds` scrapes of
30 s, their GPUs idle (so every record makes a ledger row: the worst case for the ledger). The
same samples are published twice, on fresh topics each: N GPUs per record (one record per node
and scrape, as the collector publishes) and one GPU per record (each GPU as a node of its own).
For each, the bench first times a plain consumer that only reads and counts the topic (the floor:
nothing can take records off the broker faster here), then the sample writer
(streams/sample_writer.py, in this process, embedded chDB) from its start until `gpu_idle` holds
every row; it prints samples/s, records/s, the writer against the floor, and the ratio of the two
paths, all measured in the same run, with the CPU other processes took meanwhile.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from allmende.core.clickhouse import Database
from allmende.core.kafka_topics import ensure_topics
from allmende.core.ledger_store import LedgerStore
from allmende.core.replay import make_producer, timeline
from allmende.core.settings import Settings
from allmende.core.trace_files import read_trace
from allmende.domain.traces import TraceFormat
from allmende.schemas.events import JobSubmitted
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id
from allmende.streams.sample_writer import SampleWriter
from allmende.testing.harness import wait_until

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
    from ingest import raw_consume_rate  # bench/: beside this script (it imports this module)

    tag = f"bench{uuid.uuid4().hex[:8]}"
    settings = Settings(
        kafka_bootstrap_servers=bootstrap, clickhouse_dsn=f"chdb://{work / 'chdb'}", clickhouse_database=tag,
        topic_prefix=tag, topic_partitions=args.partitions, writer_group=f"{tag}-writer", log_json=False,
        log_level="WARNING",
    )  # fmt: skip
    ensure_topics(settings)
    producer = make_producer(bootstrap)
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
    seen, read_s = raw_consume_rate(settings, settings.gpu_samples_topic, records)
    floor = seen / read_s
    print(f"  a plain consumer that only counts, same topic: {floor:,.0f} records/s")

    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    writer = SampleWriter(settings, LedgerStore(db))
    watching = cpu([])
    t0 = time.perf_counter()
    writer.start()
    try:
        wait_until(
            lambda: int(db.rows("SELECT count() FROM {db}.gpu_idle")[0][0]) >= records,
            1800, "every row in the ledger", every=0.05,
        )  # fmt: skip
        took = time.perf_counter() - t0
        other = watching.stop()
    finally:
        writer.stop()
    rows = int(db.rows("SELECT count() FROM {db}.gpu_idle FINAL")[0][0])
    assert rows == records, f"{rows} rows for {records} records"
    print(
        f"  through the sample writer into the ledger: {samples / took:,.0f} samples/s, "
        f"{records / took:,.0f} records/s ({took:.2f} s from its start, {writer.batches} batches); "
        f"rows {rows:,} == records; "
        f"CPU meanwhile: {other}"
    )
    print(f"  records/s through the writer / the plain consumer: {records / took / floor:.1%}")
    return {"samples_per_s": samples / took, "records_per_s": records / took}


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
