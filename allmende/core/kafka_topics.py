"""Topic declarations: names, partitions and configs, created idempotently at start."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import structlog
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from allmende.core.settings import Settings

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    keep_forever = {"retention.ms": "-1", "retention.bytes": "-1"}
    return [
        # The source of truth: every projection is rebuilt from these, so they are never expired.
        TopicSpec(settings.job_events_topic, settings.topic_partitions, keep_forever),
        TopicSpec(settings.ledger_entries_topic, settings.topic_partitions, keep_forever),
        # One partition: the admin log is one total order, the audit trail.
        TopicSpec(settings.admin_events_topic, 1, keep_forever),
        # The admission service's own log: decisions, holds, host health; it rebuilds from it.
        TopicSpec(settings.admission_topic, 1, keep_forever),
        TopicSpec(settings.dead_letter_topic, 1, keep_forever),
        # Burn warnings, once per crossing; the alerter rebuilds what it has sent from it.
        TopicSpec(settings.alerts_topic, 1, keep_forever),
        # The latest fair-share row per node: compacted, so a reader gets the current tree.
        TopicSpec(settings.fairshare_topic, 1, {"cleanup.policy": "compact"}),
    ]


def ensure_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers, client_id="allmende-admin")
    try:
        existing = set(admin.list_topics())
        missing = [s for s in (specs or topic_specs(settings)) if s.name not in existing]
        if not missing:
            return
        with contextlib.suppress(TopicAlreadyExistsError):  # a concurrent starter was first
            admin.create_topics([NewTopic(s.name, s.partitions, 1, topic_configs=s.config) for s in missing])
        log.info("topics_created", topics=[s.name for s in missing])
    finally:
        admin.close()
