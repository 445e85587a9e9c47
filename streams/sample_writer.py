"""The sample writer: `<prefix>.gpu-samples` -> ClickHouse `gpu_idle` and `gpu_unaccounted`.

The collector's records are the platform's firehose (issue 24): one per node and scrape, all of
its GPUs. They change no charge and need no job state (a row names its job; whose the job is comes
from `job_attribution` when rows are read), so they are written by a plain batch consumer beside
the ledger writer, not by the meter: no stream framework's per-record work, no state per job,
nothing held for a submission that has not come yet. Exactly once in effect as the other writers:
rows are keyed by (job, node, end) and the offsets are saved beside them after each batch.

Every record has one fate: a row (its GPUs idle, under the squatting cap), a busy or free node
counted, unaccounted use (GPUs busy with no job), or a dead letter with the reason (not a GPU
sample record, or a key that is not the record's). ClickHouse or Kafka away fails the batch,
which is read again from the saved offsets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import structlog

from allmende.core.ledger_store import LedgerStore
from allmende.core.metrics import GPU_SAMPLES, SAMPLE_LAG_RECORDS, SAMPLE_WRITER, register
from allmende.core.settings import Settings
from allmende.domain.gpu_utilisation import IdleRow, UnaccountedRow, row_of, unaccounted_of
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import ContractError
from allmende.schemas.gpu_samples import parse_gpu_samples
from allmende.streams.offsets_beside_data import DeadLetters, OffsetsBesideData, Write

log = structlog.get_logger(__name__)

_IDLE, _BUSY, _NO_JOB, _REFUSED = (GPU_SAMPLES.labels(o) for o in ("idle", "busy", "no-job", "refused"))


def rows_of_batch(
    records: Sequence[Any], topic: str
) -> tuple[list[IdleRow], list[UnaccountedRow], list[DeadLetter]]:
    """The rows a batch of sample records makes (consumer records: partition, offset, key,
    value), and the dead letters of those it refuses; every other record is counted."""
    idle: list[IdleRow] = []
    unaccounted: list[UnaccountedRow] = []
    refused: list[DeadLetter] = []
    busy = no_job = 0
    for record in records:
        try:
            if record.value is None:
                raise ContractError("no value (a tombstone), not a GPU sample record")
            sample = parse_gpu_samples(record.value)
            if record.key is not None and record.key != sample.key:
                raise ContractError(f"key {record.key[:100]!r} is not the record's {sample.key!r}")
        except ContractError as exc:
            reason, code = exc.reason, "contract"
        except Exception as exc:  # nothing a record holds may fail its batch
            reason, code = f"unexpected {type(exc).__name__}: {exc}", "unexpected"
        else:
            row = row_of(sample)
            if row is not None:
                idle.append(row)
            elif sample.job_id is not None:
                busy += 1
            else:
                no_job += 1
                other = unaccounted_of(sample)
                if other is not None:
                    unaccounted.append(other)
            continue
        refused.append(
            DeadLetter.of(
                stage="sample-writer", reason=reason, code=code, topic=topic, partition=record.partition,
                offset=record.offset, key=record.key, value=record.value,
            )
        )  # fmt: skip
    _IDLE.inc(len(idle))
    _BUSY.inc(busy)
    _NO_JOB.inc(no_job)
    _REFUSED.inc(len(refused))
    if refused:
        log.warning("gpu_samples_refused", records=len(refused))
    return idle, unaccounted, refused


class SampleWriter(OffsetsBesideData):
    thread_name = "sample-writer"

    def __init__(self, settings: Settings, store: LedgerStore) -> None:
        register(SAMPLE_WRITER)
        super().__init__(
            settings, store, settings.gpu_samples_topic, f"{settings.writer_group}-samples",
            self._session_of_run, lag_gauge=SAMPLE_LAG_RECORDS,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20,
        )  # fmt: skip

    def write_batch(self, records: Sequence[Any], letters: DeadLetters) -> int:
        """Write one batch's rows, then its offsets; returns the rows written."""
        idle, unaccounted, refused = rows_of_batch(records, self.topic)
        self.store.append_idle(idle, unaccounted)
        for letter in refused:  # once the rows are in: a batch ClickHouse failed sends none twice
            letters.send(letter)
        letters.confirm()
        self._save_offsets(records, wrote=bool(idle or unaccounted or refused))  # no letter sent twice
        return len(idle) + len(unaccounted)

    @contextmanager
    def _session_of_run(self) -> Iterator[Write]:
        letters = DeadLetters(self.settings)
        try:
            yield lambda batch: self.write_batch(batch, letters)
        finally:
            letters.close()
