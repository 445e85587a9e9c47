"""The DCGM collector: scrape dcgm-exporters (or ask a Prometheus server that scrapes them), turn
each node's readings into GPU-sample records (one per node and job: `schemas/gpu_samples.py`) and
publish them to `<prefix>.gpu-samples`.

What it promises (docs/dcgm.md):
- A node that does not answer, answers an error or answers something that is not Prometheus text
  is reported (the round's `failed`, a log line, `allmende_dcgm_scrapes_total{outcome}`) and
  publishes nothing: no sample is never an idle sample, and squatting needs evidence.
- A GPU with a job on it is published under each job on it (the exporter repeats its series per
  job); a GPU with none is free, or busy with nobody to charge (unaccounted use: a metric per node
  and a record without a job).
- Records that could not be published (Kafka away) are kept for the next rounds, up to a bound,
  and sent again; their ids are the scrape's (node, instant, job), so a record sent twice is one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import structlog
from kafka import KafkaProducer

from allmende.core.metrics import (
    DCGM,
    DCGM_FREE_GPUS,
    DCGM_PUBLISH_FAILURES,
    DCGM_SAMPLES_PUBLISHED,
    DCGM_SCRAPES,
    DCGM_UNACCOUNTED_GPUS,
    register,
)
from allmende.integrations.dcgm.scrape import (
    READ,
    GpuReading,
    NodeScrape,
    ScrapeError,
    parse_scrape,
    readings_of,
)
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id

log = structlog.get_logger(__name__)

PENDING_ROUNDS = 20  # rounds of records kept while Kafka is away (10 minutes at the default 30 s)


@dataclass(frozen=True)
class Target:
    """An exporter's /metrics URL, and the node's name if given (`name=url`); else the exporter's
    `Hostname` label names it, else the URL's host."""

    url: str
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        name, sep, url = text.partition("=")
        if sep and "://" not in name:
            return cls(_metrics_url(url.strip()), name.strip() or None)
        return cls(_metrics_url(text.strip()))

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or self.url


def _metrics_url(url: str) -> str:
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url!r} is not an exporter's address (http://host:9400/metrics)")
    return url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


@dataclass(frozen=True)
class NodeRead:
    """One node's answer in a round: its readings, or why there are none."""

    target: str  # the URL, or the Prometheus server's node label
    node: str
    scrape: NodeScrape | None
    outcome: str  # ok | timeout | unreachable | http-error | unparsable
    error: str | None = None


@dataclass
class Round:
    """What one round read and made."""

    at: int
    reads: list[NodeRead]
    records: list[GpuSamples] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[NodeRead]:
        return [r for r in self.reads if r.scrape is None]

    @property
    def samples(self) -> int:
        return sum(len(r.gpus) for r in self.records)

    def free_gpus(self, node: str) -> int:
        return sum(1 for g in self._gpus(node) if not g.jobs and not g.unaccounted)

    def unaccounted_gpus(self, node: str) -> int:
        return sum(1 for g in self._gpus(node) if g.unaccounted)

    def _gpus(self, node: str) -> Iterable[GpuReading]:
        for read in self.reads:
            if read.node == node and read.scrape is not None:
                yield from read.scrape.gpus


def scrape_node(client: httpx.Client, target: Target) -> NodeRead:
    """GET the exporter's /metrics; every way of not answering is said, never read as idle."""
    name = target.name or target.host
    try:
        response = client.get(target.url)
    except httpx.TimeoutException as exc:
        return NodeRead(target.url, name, None, "timeout", f"no answer in time ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        return NodeRead(target.url, name, None, "unreachable", f"{type(exc).__name__}: {exc}")
    if response.status_code != 200:
        return NodeRead(target.url, name, None, "http-error", f"HTTP {response.status_code}")
    try:
        scrape = parse_scrape(response.text, name)
    except ScrapeError as exc:
        return NodeRead(target.url, name, None, "unparsable", str(exc))
    node = target.name or scrape.hostname or target.host
    return NodeRead(target.url, node, _renamed(scrape, node), "ok")


def _renamed(scrape: NodeScrape, node: str) -> NodeScrape:
    return scrape if scrape.node == node else NodeScrape(node, scrape.gpus, scrape.problems, scrape.hostname)


NODE_LABELS = ("Hostname", "hostname", "instance")


def prometheus_reads(client: httpx.Client, base_url: str) -> tuple[int | None, list[NodeRead]]:
    """Every node a Prometheus server holds DCGM series of, from instant queries of the metrics
    read (`/api/v1/query`). A node whose exporter stopped answering has no series there (the
    server marks them stale), so it publishes nothing, as a failed scrape does. The instant is the
    server's evaluation time."""
    by_node: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    at: int | None = None
    for metric in READ:
        response = client.get(f"{base_url.rstrip('/')}/api/v1/query", params={"query": metric})
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"Prometheus refused the query {metric}: {body.get('error')}")
        for series in body["data"]["result"]:
            labels = {k: str(v) for k, v in series["metric"].items()}
            node = next((labels[k] for k in NODE_LABELS if labels.get(k)), "")
            node = node.rsplit(":", 1)[0] if node == labels.get("instance") else node
            stamp, value = series["value"]
            at = max(at or 0, int(float(stamp)))
            by_node.setdefault(node, []).append((metric, labels, float(value)))
    reads = [
        NodeRead(base_url, node, readings_of(samples, node), "ok")
        for node, samples in sorted(by_node.items())
        if node
    ]
    return at, reads


def records_of(
    scrape: NodeScrape, at: int, interval_s: int, producer: str
) -> tuple[list[GpuSamples], list[str]]:
    """One record per job on the node (its GPUs' readings) and one for the GPUs with no job, at
    the scrape's instant. A GPU without a utilisation reading is left out (said), as is a job id
    the contract cannot carry."""
    problems = [f"node {scrape.node}: {p}" for p in scrape.problems]
    by_job: dict[str | None, list[GpuSample]] = {}
    for reading in scrape.gpus:
        if reading.utilization_pct is None:
            problems.append(f"node {scrape.node}: GPU {reading.gpu} has no utilisation reading; left out")
            continue
        sample = GpuSample(
            gpu=reading.gpu,
            utilization_bp=reading.utilization_pct * 100,
            fb_used_mib=reading.fb_used_mib,
            power_mw=reading.power_mw,
        )
        for job in reading.jobs or (None,):
            by_job.setdefault(job, []).append(sample)
    records = []
    for job, samples in by_job.items():
        try:
            records.append(
                GpuSamples(
                    event_id=sample_id(scrape.node, at, job),
                    occurred_at=at,
                    producer=producer,
                    node=scrape.node,
                    job_id=job,
                    interval_s=interval_s,
                    gpus=tuple(samples),
                )
            )
        except ValueError as exc:
            problems.append(f"node {scrape.node}: job {job!r} cannot be published ({exc}); left out")
    return records, problems


Publish = Callable[[Sequence[GpuSamples]], None]


def kafka_publisher(producer: KafkaProducer, topic: str, timeout_s: float) -> Publish:
    """Publish a round's records: every one acknowledged by the broker, or an exception (the
    collector keeps the round and sends it again)."""

    def publish(records: Sequence[GpuSamples]) -> None:
        futures = [producer.send(topic, key=r.key, value=encode_gpu_samples(r)) for r in records]
        producer.flush(timeout=timeout_s)
        for future in futures:
            future.get(timeout=0)

    return publish


@dataclass
class Collector:
    """Reads its targets (exporters, or one Prometheus server) once per `round`, publishing."""

    targets: Sequence[Target] = ()
    prometheus: str | None = None
    interval_s: int = 30
    timeout_s: float = 5.0
    producer: str = "dcgm-collector"
    publish: Publish | None = None  # None: dry run
    clock: Callable[[], float] = time.time
    _pending: deque[list[GpuSamples]] = field(default_factory=lambda: deque(maxlen=PENDING_ROUNDS))

    def __post_init__(self) -> None:
        if not self.targets and not self.prometheus:
            raise ValueError("nothing to collect from: give exporters' URLs or a Prometheus server")
        register(DCGM)
        self._client = httpx.Client(timeout=self.timeout_s, follow_redirects=True)
        self._pool = ThreadPoolExecutor(max_workers=min(32, max(1, len(self.targets))))

    def close(self) -> None:
        self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def read(self) -> tuple[int, list[NodeRead]]:
        at = int(self.clock())
        if self.prometheus:
            try:
                stamp, reads = prometheus_reads(self._client, self.prometheus)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                failed = NodeRead(self.prometheus, "prometheus", None, "unreachable", str(exc))
                return at, [failed]
            return stamp or at, reads
        reads = list(self._pool.map(lambda t: scrape_node(self._client, t), self.targets))
        return at, reads

    def round(self) -> Round:
        at, reads = self.read()
        done = Round(at, reads)
        for read in reads:
            DCGM_SCRAPES.labels(outcome=read.outcome).inc()
            if read.scrape is None:
                log.warning("dcgm_node_unread", node=read.node, target=read.target,
                            outcome=read.outcome, error=read.error)  # fmt: skip
                continue
            records, problems = records_of(read.scrape, at, self.interval_s, self.producer)
            done.records.extend(records)
            done.problems.extend(problems)
        for node in {r.node for r in reads if r.scrape is not None}:
            DCGM_FREE_GPUS.labels(node=node).set(done.free_gpus(node))
            DCGM_UNACCOUNTED_GPUS.labels(node=node).set(done.unaccounted_gpus(node))
        for problem in done.problems:
            log.info("dcgm_reading_left_out", problem=problem)
        if self.publish is not None:
            self._send(done.records)
        return done

    @property
    def pending(self) -> int:
        """Records waiting to be published (Kafka was away)."""
        return sum(len(r) for r in self._pending)

    def _send(self, records: list[GpuSamples]) -> None:
        assert self.publish is not None
        self._pending.append(records)  # the oldest round goes first when the bound is reached
        while self._pending:
            try:
                self.publish(self._pending[0])
            except Exception as exc:  # Kafka away (any of its errors): keep them, try next round
                DCGM_PUBLISH_FAILURES.inc()
                log.warning("dcgm_publish_failed", error=str(exc), pending=self.pending)
                return
            sent = self._pending.popleft()
            DCGM_SAMPLES_PUBLISHED.inc(sum(len(r.gpus) for r in sent))
