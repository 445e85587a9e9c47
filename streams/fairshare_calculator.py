"""The fair-share calculator: the ledger-entry stream -> decayed usage -> factors, published.

It reads every partition of `<prefix>.ledger-entries` (one reader: fair share is one global
computation over the whole tree) and the admin log (the tree, the charge policy). Its state lives
in memory and is rebuilt by replay at every start: the usage it derives (`UsageLedger`) depends
only on the latest revision of each entry, so a replay gives the same integers, and the factors
are computed from them in one canonical order.

After a change it publishes, at most every `fairshare_publish_s`, every node's row to the compacted
topic `<prefix>.fairshare` (key: node id) and to the ClickHouse table `fairshare_history`, and
keeps the latest snapshot for the API. Published figures are taken at the stream's clock (the
latest end of use seen), so a snapshot says exactly which usage it includes.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Literal

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from allmende.core.checkpoints import Checkpoint, CheckpointStore
from allmende.core.clickhouse import Database
from allmende.core.kafka_reading import LagWatch, replaying_consumer, resume
from allmende.core.metrics import (
    FAIRSHARE,
    FAIRSHARE_FACTOR,
    FAIRSHARE_LAG_RECORDS,
    FAIRSHARE_SNAPSHOTS,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.allocations import quarter_start
from allmende.domain.fairshare.compute import compute_fairshare
from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.result import FairShareResult, ShareRow
from allmende.domain.fairshare.usage import (
    BUCKET_S,
    FOLD_HALF_LIVES,
    UsageLedger,
    decayed_usage,
    share_tree,
)
from allmende.domain.postings import newest_per_entry
from allmende.schemas.fairshare import FairShareRecord
from allmende.schemas.ledger import retired_job
from allmende.streams.admin_log import AdminLog
from allmende.streams.ledger_writer import postable_entries

log = structlog.get_logger(__name__)
CHECKPOINT_KIND = "fairshare-usage"

_HISTORY_COLUMNS = (
    "as_of", "algorithm", "node_id", "parent_id", "depth", "is_leaf", "raw_shares", "norm_shares",
    "raw_usage", "norm_usage", "effective_usage", "level_fs", "factor",
)  # fmt: skip


@dataclass(frozen=True)
class Snapshot:
    as_of: int
    algorithm: Literal["classic", "fair_tree"]
    records: tuple[FairShareRecord, ...]
    admin_version: int = 0  # admin events seen when taken: a newer tree or policy makes it stale
    caught_up: bool = False  # taken with every record up to the partitions' ends folded in

    @functools.cached_property
    def factors(self) -> dict[str, float]:
        return {r.node_id: r.factor for r in self.records}


def record_of(row: ShareRow, as_of: int, algorithm: Literal["classic", "fair_tree"]) -> FairShareRecord:
    level = row.level_fs
    return FairShareRecord(
        as_of=as_of, algorithm=algorithm, node_id=row.node_id, parent_id=row.parent_id, depth=row.depth,
        is_leaf=row.is_leaf, raw_shares=row.raw_shares, norm_shares=row.norm_shares, raw_usage=row.raw_usage,
        norm_usage=row.norm_usage, effective_usage=row.effective_usage,
        level_fs="inf" if level is not None and math.isinf(level) else level, factor=row.factor,
    )  # fmt: skip


class FairShareCalculator:
    def __init__(self, settings: Settings, admin_log: AdminLog, db: Database | None = None) -> None:
        register(FAIRSHARE)
        self.settings = settings
        self.admin_log = admin_log
        self.db = db
        self.usage = UsageLedger()
        self.latest: Snapshot | None = None
        self._fresh: Snapshot | None = None  # computed for admission between published ones
        self._lag = LagWatch(every_s=0.2)  # a snapshot waits for this: check often
        self.caught_up = self._lag.caught_up
        # Set once a snapshot taken after catching up is published: budgets and factors from a
        # half-replayed ledger would admit what the full one refuses.
        self.ready = threading.Event()
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self._published_key: tuple[int, int, int] | None = None
        self._changes = 0  # bumped by every revision taken: a new snapshot is due
        self._policies: dict[str, int] = {}  # policy id -> effective from, as last priced
        # The next offset per ledger-entry partition that `usage` has not folded: what a
        # checkpoint covers, changed only with the usage (in `take`, under the lock).
        self._positions: dict[int, int] = {}
        self.resumed_from: dict[int, int] | None = None  # the checkpoint's offsets the last start loaded
        self.checkpoints = (
            CheckpointStore(settings.checkpoint_dir, settings.topic_prefix)
            if settings.checkpoint_every_s > 0
            else None
        )

    # -- the maths on the current state (pure of Kafka) ----------------------------------------
    def compute(self) -> FairShareResult:
        s = self.settings
        with self.lock:
            clock = self.usage.clock
            resets = [quarter_start(clock)] if s.fairshare_reset == "quarterly" and clock else []
            self.usage.fold(s.fairshare_half_life_s, resets)  # memory bounded by what is live
            hours = self.usage.project_hours()
        usage = decayed_usage(hours, clock, s.fairshare_half_life_s, resets)
        tree, leaves = share_tree(self.admin_log.state.nodes, usage)
        return compute_fairshare(tree, leaves, Algorithm(s.fairshare_algorithm))

    def snapshot(self) -> Snapshot:
        version = len(self.admin_log.state.history)  # read first: a change during compute is seen later
        result = self.compute()
        algorithm = self.settings.fairshare_algorithm
        records = tuple(record_of(row, self.usage.clock, algorithm) for row in result.rows())
        return Snapshot(self.usage.clock, algorithm, records, version)

    def current_factors(self) -> dict[str, float]:
        """The factors admission decides with: the latest snapshot's, unless the tree or a policy
        changed since it was taken; then computed here, so a decision never uses a tree the admin
        log no longer holds (the published stream follows on the loop's next turn)."""
        version = len(self.admin_log.state.history)
        for snapshot in (self.latest, self._fresh):
            if snapshot is not None and snapshot.admin_version == version:
                return snapshot.factors
        if self.latest is None:
            return {}
        self._fresh = self.snapshot()
        return self._fresh.factors

    def take(self, values: list[bytes], positions: dict[int, int] | None = None) -> bool:
        """Fold ledger-entry records into the usage; True if anything changed. A `retired` record
        lets go of its job's entries (the totals stay): the meter sends no revision of them after
        it (it dead-letters a timed event of a job it let go of)."""
        timeline = self.admin_log.timeline()
        policies = {p.policy_id: p.effective_from for p in self.admin_log.state.policies.values()}
        entries = []
        retired: list[str] = []
        for value in values:
            job = retired_job(value)
            if job is not None:  # the meter let go of the job: keep its totals, not its entries
                retired.append(job)
                continue
            try:  # what the ledger can hold, by the writer's own rule: usage the ledger refuses is no usage
                entries.extend(postable_entries(value))
            except (ValueError, TypeError):
                continue  # the ledger writer dead-letters these; fair share just skips them
        changed = False
        with self.lock:
            fresh = [at for pid, at in policies.items() if pid not in self._policies]
            if fresh:
                changed |= self.usage.reprice(timeline, min(fresh)) > 0
                self._policies = policies
            for entry in newest_per_entry(entries).values():
                changed |= self.usage.apply(entry, timeline)
            for job in retired:  # after the batch's entries: a job's last ones may share it
                self.usage.retire(job)
            self._changes += changed
            if positions:
                self._positions.update(positions)
        return changed

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="fairshare", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.run(self._stop)
                self.last_error = None
            except Exception as exc:  # Kafka away: retry; the state is rebuilt from the topic
                self.last_error = repr(exc)
                log.exception("fairshare_failed", error=repr(exc))
                self._stop.wait(2.0)

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        consumer, partitions = replaying_consumer(
            s.kafka_bootstrap_servers,
            s.ledger_entries_topic,
            client_id="allmende-fairshare",
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        producer = KafkaProducer(bootstrap_servers=s.kafka_bootstrap_servers, acks="all", linger_ms=20)
        with self.lock:
            self.usage = UsageLedger()  # rebuilt by replay: nothing is trusted from before
            self._policies = {}
            self._positions = {tp.partition: 0 for tp in partitions}
        self.resumed_from = None
        self.caught_up.clear()
        self.ready.clear()
        try:
            self._resume(consumer, partitions)
            last_publish = 0.0
            last_checkpoint = (time.monotonic(), dict(self._positions))
            while not stop.is_set():
                polled = consumer.poll(timeout_ms=200, max_records=20_000)
                self.admin_log.catch_up()
                values = [r.value for records in polled.values() for r in records]
                positions = {
                    tp.partition: records[-1].offset + 1 for tp, records in polled.items() if records
                }
                self.take(values, positions)  # also when empty: a new policy re-prices what it covers
                behind = self._lag.check(consumer, partitions)
                if behind is not None:
                    FAIRSHARE_LAG_RECORDS.set(sum(behind.values()))
                key = (self.usage.clock, self._changes, len(self.admin_log.state.history))
                first = self.caught_up.is_set() and not self.ready.is_set()
                # A new tree or policy is published at once; usage changes at most every publish_s.
                admin_changed = self._published_key is not None and key[2] != self._published_key[2]
                due = first or admin_changed or time.monotonic() - last_publish >= s.fairshare_publish_s
                if (key != self._published_key or first) and due:
                    # Checked now, not up to every_s ago: the flag a snapshot carries must be true
                    # of the records it folds in (another partition may have moved on since).
                    self._lag.check(consumer, partitions, force=True)
                    caught_up = self.caught_up.is_set()
                    try:
                        self.publish(producer, key, caught_up)
                        if caught_up:
                            self.ready.set()
                        self.last_error = None
                    except Exception as exc:  # one bad snapshot must not stop the stream
                        self.last_error = repr(exc)
                        log.exception("fairshare_snapshot_failed", error=repr(exc))
                    last_publish = time.monotonic()
                last_checkpoint = self._checkpoint_if_due(last_checkpoint)
        finally:
            consumer.close(autocommit=False)
            producer.close(timeout=5)

    # -- checkpoints ---------------------------------------------------------------------------
    def _fingerprint(self) -> dict[str, object]:
        """What the usage depends on besides the stream: another value, another state."""
        s = self.settings
        return {
            "topic": s.ledger_entries_topic, "half_life_s": s.fairshare_half_life_s,
            "reset": s.fairshare_reset, "bucket_s": BUCKET_S, "fold_half_lives": FOLD_HALF_LIVES,
        }  # fmt: skip

    def _resume(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        """Start from the latest checkpoint that fits the topic as it is now, and seek to the
        offsets it covers; else (none, or not to be trusted: logged) replay from the beginning."""
        if self.checkpoints is None:
            return
        started = time.monotonic()
        checkpoint = self.checkpoints.load(CHECKPOINT_KIND, self._fingerprint())
        if checkpoint is None:
            return
        try:
            usage = UsageLedger.restore(checkpoint.body["usage"])
            policies = {str(k): int(v) for k, v in checkpoint.body["policies"].items()}
            offsets = checkpoint.offsets[self.settings.ledger_entries_topic]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "checkpoint_ignored", kind=CHECKPOINT_KIND, reason=f"its body cannot be read: {exc!r}"
            )
            return
        problem = resume(consumer, partitions, offsets)
        if problem is not None:
            log.warning("checkpoint_ignored", kind=CHECKPOINT_KIND, reason=problem)
            return
        with self.lock:
            self.usage, self._policies, self._positions = usage, policies, dict(offsets)
        self.resumed_from = dict(offsets)
        log.info(
            "checkpoint_loaded", kind=CHECKPOINT_KIND, entries=len(usage.entries),
            taken_at=checkpoint.taken_at, records_covered=sum(offsets.values()),
            seconds=round(time.monotonic() - started, 3),
        )  # fmt: skip

    def _checkpoint_if_due(self, last: tuple[float, dict[int, int]]) -> tuple[float, dict[int, int]]:
        """Write a checkpoint every `checkpoint_every_s` once caught up, when the usage moved. In
        this thread, the only one that changes entries, hours and clock: the dump needs no lock
        (a fold from admission's thread moves only what `restore` derives)."""
        every = self.settings.checkpoint_every_s
        if self.checkpoints is None or not self.caught_up.is_set() or time.monotonic() - last[0] < every:
            return last
        with self.lock:
            positions, policies = dict(self._positions), dict(self._policies)
        if positions == last[1]:
            return (time.monotonic(), positions)
        try:
            started = time.monotonic()
            body = {"usage": self.usage.dump(), "policies": policies}
            topic = self.settings.ledger_entries_topic
            size = self.checkpoints.save(
                Checkpoint(CHECKPOINT_KIND, {topic: positions}, self._fingerprint(), body)
            )
            entries = len(body["usage"]["entries"])
            seconds = round(time.monotonic() - started, 3)
            log.info("checkpoint_saved", kind=CHECKPOINT_KIND, bytes=size, entries=entries, seconds=seconds)
        except OSError as exc:  # a full disk must not stop fair share: the next start replays more
            log.warning("checkpoint_failed", kind=CHECKPOINT_KIND, error=repr(exc))
        return (time.monotonic(), positions)

    def publish(
        self, producer: KafkaProducer, key: tuple[int, int, int], caught_up: bool = False
    ) -> Snapshot:
        snapshot = replace(self.snapshot(), caught_up=caught_up)
        for record in snapshot.records:
            producer.send(self.settings.fairshare_topic, key=record.node_id.encode(), value=record.to_json())
        producer.flush()
        if self.db is not None:
            self.db.insert("fairshare_history", [_history_row(r) for r in snapshot.records], _HISTORY_COLUMNS)
        for record in snapshot.records:
            if record.is_leaf:
                FAIRSHARE_FACTOR.labels(project=record.node_id).set(record.factor)
        self.latest = snapshot
        self._published_key = key
        FAIRSHARE_SNAPSHOTS.inc()
        log.info("fairshare_published", as_of=snapshot.as_of, nodes=len(snapshot.records))
        return snapshot


def _history_row(r: FairShareRecord) -> tuple[object, ...]:
    level = math.inf if r.level_fs == "inf" else r.level_fs
    return (
        r.as_of, r.algorithm, r.node_id, r.parent_id or "", r.depth, r.is_leaf, str(r.raw_shares),
        r.norm_shares, r.raw_usage, r.norm_usage, r.effective_usage, level, r.factor,
    )  # fmt: skip
