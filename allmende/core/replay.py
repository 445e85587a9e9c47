"""Replay a trace onto Kafka: every job's events, merged in time order, keyed by job id."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kafka import KafkaProducer

from allmende.domain.traces import TraceJob, job_events
from allmende.schemas.events import JobEvent, encode_event


@dataclass
class ReplaySummary:
    jobs: int
    events: int
    gpu_seconds: int
    seconds: float


def timeline(jobs: Iterable[TraceJob], sample_every_s: int) -> Iterator[JobEvent]:
    """All events of all jobs in (occurred_at, job, sequence) order, streaming."""
    streams = (
        ((e.occurred_at, job.job_id, i, e) for i, e in enumerate(job_events(job, sample_every_s)))
        for job in jobs
    )
    for _, _, _, event in heapq.merge(*streams, key=lambda t: t[:3]):
        yield event


def make_producer(bootstrap: str) -> KafkaProducer:
    # acks=all + idempotence: a broker retry does not duplicate; batches amortise round trips.
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=10,
        batch_size=512 * 1024,
        compression_type="lz4",
        max_in_flight_requests_per_connection=5,
    )


def publish(
    producer: KafkaProducer,
    topic: str,
    events: Iterable[JobEvent],
    speed: float | None = None,
    on_event: Callable[[JobEvent], None] | None = None,
) -> int:
    """Send events; with `speed`, trace seconds per wall second (None: as fast as possible)."""
    sent = 0
    wall0 = time.monotonic()
    trace0: int | None = None
    for event in events:
        if speed:
            trace0 = event.occurred_at if trace0 is None else trace0
            ahead = (event.occurred_at - trace0) / speed - (time.monotonic() - wall0)
            if ahead > 0:
                producer.flush()
                time.sleep(ahead)
        producer.send(topic, key=event.job_id.encode(), value=encode_event(event))
        sent += 1
        if on_event is not None:
            on_event(event)
    producer.flush()
    return sent
