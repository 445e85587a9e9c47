"""The decision writer: the admission log's decisions -> ClickHouse `admission_decisions`.

The admission service keeps in memory only the decisions of live jobs (and lets ended ones go);
this writer keeps every decision ever recorded, so `GET /v1/admission/{job_id}` answers for any
job ever decided. It reads the admission log (one partition) as the service's replay does: a
record appended after its `record_by` instant is void (`kafka_reading.appended_late`) and is not
written; holds, releases and host reports are passed by.

Exactly once in effect, as the ledger writer: per batch one INSERT of its decisions, then the
next offset saved in `ingest_offsets` beside them (consumer `<writer_group>-decisions`); on
(re)start it seeks to that offset, not to Kafka's committed one. A batch read again after a crash
between the two writes the same rows again: one row per job and attempt once read with FINAL.

A record that is no admission event cannot be on this log but through a bug (the service alone
writes it, and logs what it cannot read when it replays): it is logged and passed by, never
failing its batch. A ClickHouse or Kafka failure fails the batch, which is read again from the
saved offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import structlog

from allmende.core.kafka_reading import appended_late
from allmende.core.ledger_store import LedgerStore
from allmende.core.metrics import DECISION_RECORDS_SKIPPED, DECISION_WRITER, DECISIONS_WRITTEN, register
from allmende.core.settings import Settings
from allmende.schemas.admission_events import AdmissionDecided, parse_admission_event
from allmende.schemas.events import ContractError
from allmende.streams.offsets_beside_data import OffsetsBesideData

log = structlog.get_logger(__name__)


@dataclass
class DecisionBatch:
    records: int
    decisions: int
    void: int
    unreadable: int


def decisions_of(records: Iterable[Any]) -> tuple[list[tuple[int, AdmissionDecided]], DecisionBatch]:
    """The (offset, decision) pairs of admission-log records the table takes, and the counts."""
    found: list[tuple[int, AdmissionDecided]] = []
    count = void = unreadable = 0
    for record in records:
        count += 1
        try:
            event = parse_admission_event(record.value)
        except Exception as exc:  # whatever a record holds, it never fails the batch
            unreadable += 1
            reason = exc.reason if isinstance(exc, ContractError) else repr(exc)
            log.error("decision_writer_unreadable", offset=record.offset, reason=reason)
            continue
        if not isinstance(event, AdmissionDecided):
            continue
        if appended_late(record):  # answered 503, delivered later: void
            void += 1
            log.info("decision_writer_void", event_id=event.event_id, offset=record.offset)
            continue
        if event.attempt >= 2**64:  # beyond the column (UInt64): no service writes it
            unreadable += 1
            log.error("decision_writer_unreadable", offset=record.offset, reason="attempt out of range")
            continue
        found.append((record.offset, event))
    return found, DecisionBatch(count, len(found), void, unreadable)


ALL_WRITTEN = 2**62  # `decided_through` once the writer has read the log to its end


class DecisionWriter(OffsetsBesideData):
    thread_name = "decision-writer"

    def __init__(self, settings: Settings, store: LedgerStore, consumer_name: str | None = None) -> None:
        register(DECISION_WRITER)
        name = consumer_name or f"{settings.writer_group}-decisions"
        super().__init__(
            settings, store, settings.admission_topic, name, lambda: nullcontext(self.write_batch)
        )
        self.decisions_written = 0
        self.records_unreadable = 0
        self._decided_through: int | None = None

    def decided_through(self) -> int | None:
        """The instant of the latest decision written (None: none yet): every decision made by
        then is in the store (the admission service lets go of no later one). Caught up with the
        log (as of its last look, about a second ago), every decision is."""
        return ALL_WRITTEN if self.caught_up.is_set() else self._decided_through

    # -- one batch -----------------------------------------------------------------------------
    def write_batch(self, records: Sequence[Any]) -> DecisionBatch:
        """Write the decisions of these records (Kafka consumer records) and save the offset past
        them: the decisions first, so a crash between the two reads them again, never skips them."""
        decisions, batch = decisions_of(records)
        self.store.append_decisions(decisions)
        self._save_offsets(records)
        if decisions:  # the log is in the order the service decided: all before are written too
            latest = max(d.occurred_at for _, d in decisions)
            self._decided_through = max(self._decided_through or latest, latest)
        self.decisions_written += batch.decisions
        self.records_unreadable += batch.unreadable
        DECISIONS_WRITTEN.inc(batch.decisions)
        DECISION_RECORDS_SKIPPED.labels("void").inc(batch.void)
        DECISION_RECORDS_SKIPPED.labels("unreadable").inc(batch.unreadable)
        return batch
