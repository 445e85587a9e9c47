"""Topic declarations: names, partitions and configs, created idempotently at start."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import structlog
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import TopicAlreadyExistsError

from allmende.core.settings import Settings

log = structlog.get_logger(__name__)
APPEND_TIME = "message.timestamp.type"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    keep_forever = {"retention.ms": "-1", "retention.bytes": "-1"}
    # The logs whose writers answer requests: the broker stamps each record on append, so a record
    # appended after its event's `record_by` (its writer answered 503) is known to be void.
    stamped = {**keep_forever, APPEND_TIME: "LogAppendTime"}
    return [
        # The source of truth: every projection is rebuilt from these, so they are never expired.
        TopicSpec(settings.job_events_topic, settings.topic_partitions, keep_forever),
        TopicSpec(settings.ledger_entries_topic, settings.topic_partitions, keep_forever),
        # One partition: the admin log is one total order, the audit trail.
        TopicSpec(settings.admin_events_topic, 1, stamped),
        # The admission service's own log: decisions, holds, host health; it rebuilds from it.
        TopicSpec(settings.admission_topic, 1, stamped),
        # Never written: its one partition, assigned in a consumer group, is the admission lease.
        TopicSpec(settings.admission_lease_topic, 1),
        TopicSpec(settings.dead_letter_topic, 1, keep_forever),
        # Burn warnings, once per crossing; the alerter rebuilds what it has sent from it.
        TopicSpec(settings.alerts_topic, 1, keep_forever),
        # The latest fair-share row per node: compacted, so a reader gets the current tree.
        TopicSpec(settings.fairshare_topic, 1, {"cleanup.policy": "compact"}),
        # GPU samples, keyed by job like the job events and partitioned alike (the meter reads both
        # for a job in one place); a firehose, so kept for a window, not forever.
        TopicSpec(
            settings.gpu_samples_topic,
            settings.topic_partitions,
            {"retention.ms": str(settings.gpu_samples_retention_days * 86_400_000)},
        ),
    ]


def ensure_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers, client_id="allmende-admin")
    try:
        existing = set(admin.list_topics())
        wanted = specs or topic_specs(settings)
        missing = [s for s in wanted if s.name not in existing]
        # Topics made before their records were stamped on append: stamped from now on.
        stamp = [s.name for s in wanted if s.name in existing and s.config.get(APPEND_TIME)]
        if stamp:
            admin.alter_configs(
                [
                    ConfigResource(ConfigResourceType.TOPIC, name, {APPEND_TIME: "LogAppendTime"})
                    for name in stamp
                ],
                incremental=True,
            )
        if not missing:
            return
        with contextlib.suppress(TopicAlreadyExistsError):  # a concurrent starter was first
            admin.create_topics([NewTopic(s.name, s.partitions, 1, topic_configs=s.config) for s in missing])
        log.info("topics_created", topics=[s.name for s in missing])
    finally:
        admin.close()
