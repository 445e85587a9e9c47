"""`allmende collect dcgm`: GPU utilisation from dcgm-exporters to Kafka (integrations/dcgm)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from allmende.cli.api_client import console

if TYPE_CHECKING:
    from kafka import KafkaProducer

    from allmende.core.settings import Settings
    from allmende.integrations.dcgm.collector import Round

collect_app = typer.Typer(help="Collect GPU readings and publish them as samples.", no_args_is_help=True)


@collect_app.command("dcgm")
def dcgm(
    url: Annotated[
        list[str] | None,
        typer.Option("--url", help="an exporter: [NODE=]http://host:9400/metrics (repeat for each node)"),
    ] = None,
    targets: Annotated[
        Path | None,
        typer.Option("--targets", exists=True, dir_okay=False, help="a file of exporters, one per line"),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(help="a Prometheus server that scrapes the exporters (its query API) instead"),
    ] = None,
    interval: Annotated[
        int, typer.Option(help="seconds between rounds (the exporter's own is 30)", min=1)
    ] = 30,
    timeout: Annotated[float, typer.Option(help="seconds a node has to answer", min=0.1)] = 5.0,
    once: Annotated[bool, typer.Option("--once", help="one round, then exit")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the records (JSON lines) instead of publishing them")
    ] = False,
    producer_id: Annotated[
        str, typer.Option("--producer", help="the records' producer id")
    ] = "dcgm-collector",
) -> None:
    """Scrape each node's dcgm-exporter (or ask Prometheus), map every GPU's utilisation, memory and
    power to the job on it, and publish one record per node and job to <prefix>.gpu-samples.

    A node that does not answer is reported, never read as idle. With --once the exit status is 0
    when every node was read and published, 1 when some were not."""
    from allmende.core.logs import configure_logging
    from allmende.core.metrics import serve_metrics
    from allmende.core.settings import Settings
    from allmende.integrations.dcgm.collector import Collector, Target, kafka_publisher

    lines = list(url or [])
    if targets is not None:
        lines += [t.strip() for t in targets.read_text().splitlines() if t.strip() and not t.startswith("#")]
    try:
        parsed = [Target.parse(t) for t in lines]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not parsed and not prometheus:
        raise typer.BadParameter("give exporters (--url, --targets) or --prometheus")
    s = Settings()
    configure_logging(s)
    producer = None if dry_run else _producer(s)
    collector = Collector(
        parsed, prometheus, interval, timeout, producer_id,
        publish=None if producer is None else kafka_publisher(producer, s.gpu_samples_topic, timeout + 10),
    )  # fmt: skip
    if not once:
        serve_metrics(s, "collector", s.collector_metrics_port)
    try:
        while True:
            started = time.monotonic()
            done = collector.round()
            _report(done, collector.pending, dry_run)
            if once:
                raise typer.Exit(1 if done.failed or collector.pending else 0)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
        if producer is not None:
            producer.close(timeout=10)


def _producer(s: Settings) -> KafkaProducer:
    from allmende.core.kafka_topics import ensure_topics
    from allmende.core.replay import make_producer

    ensure_topics(s)
    return make_producer(s.kafka_bootstrap_servers)


def _report(done: Round, pending: int, dry_run: bool) -> None:
    if dry_run:
        from allmende.schemas.gpu_samples import encode_gpu_samples

        for record in done.records:
            sys.stdout.write(encode_gpu_samples(record).decode() + "\n")
        sys.stdout.flush()
    read = len(done.reads) - len(done.failed)
    out = Console(stderr=True) if dry_run else console  # stdout holds the records
    out.print(
        f"{read} of {len(done.reads)} nodes read, {len(done.records)} records, {done.samples} GPU samples"
        + ("" if dry_run else " published")
        + (f", {pending} waiting for Kafka" if pending else "")
    )
    for failed in done.failed:
        out.print(f"[red]node {failed.node} not read[/red] ({failed.outcome}: {failed.error}): no samples")
    for problem in done.problems:
        out.print(f"[yellow]{problem}[/yellow]")
