"""A plan that declares what test events need: the meter checks every event against the plan
(domain/usage_checks.py), so a test's jobs run in projects and on clusters the admin log declares.

Each project under one organisation; each cluster with the GPU type its jobs ask for and room
for all of them at once (the sum of their GPUs), so only a test's deliberately bad events fail.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from kafka import KafkaProducer

from allmende.core.settings import Settings
from allmende.domain.traces import TraceJob
from allmende.schemas.admin_events import AdminEvent, ClusterDeclared, NodeDeclared, encode_admin_event
from allmende.schemas.events import JobEvent, JobSubmitted

ORGANISATION = "test-org"
MAX_CLUSTER_GPUS = 1_000_000  # ClusterDeclared's bound


def plan_for(jobs: Iterable[TraceJob | JobEvent]) -> list[AdminEvent]:
    """Admin events declaring the projects and clusters of `jobs` (trace jobs or job events; only
    submissions declare anything)."""
    projects: set[str] = set()
    clusters: dict[str, str] = {}
    gpus: dict[str, int] = defaultdict(int)
    for job in jobs:
        if isinstance(job, TraceJob | JobSubmitted):
            projects.add(job.project)
            clusters.setdefault(job.cluster, job.gpu_type)
            gpus[job.cluster] += job.gpus
    now = int(time.time())
    envelope = {"occurred_at": now, "actor": "tests", "source": "plan:tests"}
    events: list[AdminEvent] = [
        NodeDeclared(
            event_id=f"tests:node:{ORGANISATION}", node_id=ORGANISATION, kind="organisation", **envelope
        )
    ]
    events += [
        NodeDeclared(event_id=f"tests:node:{p}", node_id=p, parent=ORGANISATION, kind="project", **envelope)
        for p in sorted(projects)
    ]
    events += [
        ClusterDeclared(
            event_id=f"tests:cluster:{c}:{gpus[c]}",
            cluster=c,
            gpu_type=t,
            gpus=max(1, min(MAX_CLUSTER_GPUS, gpus[c])),
            **envelope,
        )
        for c, t in sorted(clusters.items())
    ]
    return events


def declare(settings: Settings, jobs: Iterable[TraceJob | JobEvent]) -> list[AdminEvent]:
    """Publish `plan_for(jobs)` on the admin topic (acknowledged); returns the events."""
    events = plan_for(jobs)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    try:
        for event in events:
            producer.send(
                settings.admin_events_topic,
                key=event.aggregate.encode(),
                value=encode_admin_event(event),
                partition=0,
            )
        producer.flush()
    finally:
        producer.close()
    return events
