"""The ledger writer: `allmende.ledger-entries` -> ClickHouse postings, exactly once in effect.

Kafka delivers at least once; the writer makes that exact. Per batch it keeps the newest version
of each entry, compares with the version already in the ledger (a per-job cache, backed by the
ledger itself), appends the postings as one INSERT, then records the next offset of every
partition in `ingest_offsets`. On (re)assignment it seeks to those offsets, not to Kafka's
committed ones: the record of what was processed lives next to the ledger it fed. Kafka offsets
are committed too, for lag dashboards only.

Every record has one fate: posted, or dead-lettered with its reason. A record the ledger cannot
hold (not JSON, not entries, a field of the wrong type or out of the columns' range) is refused
on its own, never failing its batch; the offsets are saved only once the batch's postings are in
and its dead letters acknowledged. A ClickHouse or Kafka failure fails the batch, which is read
again from the saved offsets: an outage never dead-letters good records.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import structlog

from allmende.core.ledger_store import LedgerStore
from allmende.core.metrics import (
    WRITER,
    WRITER_BATCH_SECONDS,
    WRITER_DEAD_LETTERS,
    WRITER_ENTRIES_READ,
    WRITER_ENTRIES_STALE,
    WRITER_LAG_RECORDS,
    WRITER_POSTINGS_WRITTEN,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.charging import PolicyTimeline, flat_policy
from allmende.domain.gpu_utilisation import IdleRow, JobAttribution, UnaccountedRow, decode_payload
from allmende.domain.postings import newest_per_entry, post
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.ledger import LedgerEntry, decode_entries, retired_job
from allmende.streams.admin_log import AdminLog
from allmende.streams.offsets_beside_data import DeadLetters, OffsetsBesideData, Write

log = structlog.get_logger(__name__)

_JOB_CACHE_MAX = 200_000


@dataclass
class BatchResult:
    records: int
    postings: int
    dead_letters: int


class _JobCache:
    """Current entry versions per job, LRU-bounded; authoritative only for owned partitions."""

    def __init__(self, store: LedgerStore, max_jobs: int = _JOB_CACHE_MAX) -> None:
        self._store = store
        self._jobs: OrderedDict[str, dict[str, LedgerEntry]] = OrderedDict()
        self._max = max_jobs

    def current(self, job_ids: Iterable[str]) -> dict[str, LedgerEntry]:
        wanted = set(job_ids)
        missing = [j for j in wanted if j not in self._jobs]
        if missing:
            loaded = self._store.current_entries(missing)
            for job_id in missing:
                self._jobs[job_id] = {}
            for entry in loaded.values():
                self._jobs[entry.job_id][entry.entry_id] = entry
        found: dict[str, LedgerEntry] = {}
        for job_id in wanted:
            self._jobs.move_to_end(job_id)
            found.update(self._jobs[job_id])
        while len(self._jobs) > self._max:
            self._jobs.popitem(last=False)
        return found

    def accept(self, entries: Iterable[LedgerEntry]) -> None:
        for entry in entries:
            self._jobs.setdefault(entry.job_id, {})[entry.entry_id] = entry

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._jobs.pop(job_id, None)

    def clear(self) -> None:
        self._jobs.clear()


# What the ledger's columns hold (schemas/clickhouse/): `day` is a Date (up to 2149-06-06), `gpus`
# at most what a job event may carry, so gpu_seconds x 10,000 (idle units) fits an Int64.
_LAST_SECOND = 65_536 * 86_400 - 1
_MAX_GPUS = 100_000  # the job events' bound (schemas/events.py)
_FIELDS = tuple(LedgerEntry.__dataclass_fields__)
_fields_of = operator.attrgetter(*_FIELDS)
_INTS = ("version", "interval_start", "interval_end", "gpus", "utilization_bp")
_TYPES = tuple(int if f in _INTS else bool if f == "interactive" else str for f in _FIELDS)


def postable_entries(value: bytes | None) -> list[LedgerEntry]:
    """The entries of one ledger-entry record, each one the ledger can hold; else ValueError or
    TypeError saying why. Checked per record, so a bad one never fails the batch's INSERT."""
    if value is None:
        raise ValueError("no value (a tombstone)")
    entries = decode_entries(value)
    for entry in entries:
        if tuple(map(type, _fields_of(entry))) != _TYPES:  # exact: a bool is no int here
            raise TypeError(f"ledger entry {str(entry.entry_id)[:100]!r} has a field of the wrong type")
        if not (
            0 <= entry.interval_start <= entry.interval_end <= _LAST_SECOND
            and entry.gpus <= _MAX_GPUS
            and entry.version < 2**64
        ):
            raise ValueError(f"ledger entry {entry.entry_id[:100]!r} is out of the ledger's range")
    return entries


class LedgerWriter(OffsetsBesideData):
    thread_name = "ledger-writer"

    def __init__(
        self,
        settings: Settings,
        store: LedgerStore,
        consumer_name: str | None = None,
        admin_log: AdminLog | None = None,
    ) -> None:
        register(WRITER)
        super().__init__(
            settings, store, settings.ledger_entries_topic, consumer_name or settings.writer_group,
            self._session_of_run, on_revoked=self._forget_all, lag_gauge=WRITER_LAG_RECORDS,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20,
        )  # fmt: skip
        # The policy timeline comes from the admin log, read to its end before every batch.
        self.admin_log = admin_log
        self._owns_admin_log = admin_log is None
        # Held while a batch is priced and posted. An admin command that introduces a policy takes
        # it too, so no batch can charge usage past the policy's start while the policy is checked
        # against the charge horizon and published.
        self.posting_lock = threading.Lock()
        self._cache = _JobCache(store)

    # -- one batch (pure of Kafka: testable and reused by replays) -----------------------------
    def post_batch(
        self,
        records: list[tuple[int, int, bytes | None, bytes]],
        dead_letter: Callable[[DeadLetter], None],
        timeline: PolicyTimeline | None = None,
    ) -> BatchResult:
        """Post (partition, offset, key, value) records; returns counts. Offsets not saved here."""
        entries: list[LedgerEntry] = []
        idle: list[IdleRow] = []  # from earlier meters' attributed rows (a replay meets them)
        attributions: list[JobAttribution] = []
        unaccounted: list[UnaccountedRow] = []
        refused = 0
        retired: list[str] = []
        for partition, offset, key, value in records:
            job = retired_job(value)
            if job is not None:  # the meter let go of the job: its entries are final
                retired.append(job)
                continue
            # Whatever a record holds, it is refused here or posts below: nothing it holds may
            # raise out of the batch (the loop would retry the same batch for ever).
            try:
                if value is not None and value[:1] == b"{":  # entries are arrays; the rest objects
                    found = decode_payload(orjson.loads(value))
                    idle.extend(found.idle)
                    attributions.extend(found.attributions)
                    unaccounted.extend(found.unaccounted)
                else:
                    entries.extend(postable_entries(value))
                continue
            except (ValueError, TypeError) as exc:
                reason = f"not a ledger entry: {exc}"
            except Exception as exc:  # a record no rule foresaw: refused with what it raised
                reason = f"not a ledger entry: unexpected {type(exc).__name__}: {exc}"
            refused += 1
            # Bounded (schemas/dead_letter.py): it fits on the topic whatever the record holds.
            dead_letter(
                DeadLetter.of(
                    stage="ledger-writer",
                    reason=reason,
                    code="contract",
                    topic=self.topic,
                    partition=partition,
                    offset=offset,
                    key=key,
                    value=value,
                )
            )
        newest = newest_per_entry(entries)
        current = self._cache.current(e.job_id for e in newest.values())
        postings, accepted = post(newest, current, timeline or PolicyTimeline([flat_policy()]))
        self.store.append(postings)
        self.store.append_attributions(list(dict.fromkeys(attributions)))  # once each (legacy rows repeat it)
        self.store.append_idle(idle, unaccounted)
        self._cache.accept(accepted.values())
        self._cache.forget(retired)  # after `accept`: the job's last entries may share the batch
        WRITER_ENTRIES_READ.inc(len(records))
        WRITER_ENTRIES_STALE.inc(len(entries) - len(accepted))
        WRITER_POSTINGS_WRITTEN.inc(len(postings))
        WRITER_DEAD_LETTERS.inc(refused)
        return BatchResult(len(records), len(postings), refused)

    # -- the loop ------------------------------------------------------------------------------
    def _forget_all(self) -> None:
        self._cache.clear()  # partitions went to another writer: it may post these jobs now

    @contextmanager
    def _session_of_run(self) -> Iterator[Write]:
        """What a run needs: the ledger reconciled, the admin log, the dead-letter producer; and
        the function posting one batch."""
        s = self.settings
        # A batch whose INSERT failed may have landed all the same (a ClickHouse server that wrote
        # the part, then the answer was lost): the ledger, not this cache, says what is posted.
        self._cache.clear()
        report = self.store.reconcile()
        log.info("ledger_reconciled", **asdict(report))
        if self.admin_log is None:
            self.admin_log = AdminLog(s, dead_letters=False)
        admin_log = self.admin_log
        letters = DeadLetters(s)

        def write(batch: Sequence[Any]) -> None:
            records = [(r.partition, r.offset, r.key, r.value) for r in batch]
            with WRITER_BATCH_SECONDS.time(), self.posting_lock:
                admin_log.catch_up()
                self.post_batch(records, letters.send, admin_log.timeline())
                letters.confirm()
                self._save_offsets(batch)

        try:
            yield write
        finally:
            letters.close()
            if self._owns_admin_log:
                admin_log.close()
                self.admin_log = None
