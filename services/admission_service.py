"""The admission service: per job, admit / queue / reject, from in-memory projections.

Its state (`domain.admission_state.AdmissionState`) is the fold of its own log
(`<prefix>.admission`: decisions, holds, host health) and of the job events; budgets come from the
fair-share calculator's in-memory usage (the ledger-entry stream) and the admin log; fair share
from the calculator's latest snapshot. A request builds a snapshot, `domain.admission.decide`
answers, the decision and its hold are folded in and published; no database is asked.

Decisions are made one at a time under a lock (microseconds: capacity and budgets are shared);
publishing happens outside it, in group commits (`services.group_commit`): concurrent requests share
one record batch and one broker round trip. A request is answered only once its events are
acknowledged by the broker: what was answered can be replayed.

Kafka away: a decision is folded at once (the next decision must see its GPUs and units), and if
the log has not taken it within `write_timeout_ms` it is taken back (`AdmissionState.void`) and
the request answered 503. It never takes effect later: its records carry a `record_by` header,
and a copy the producer delivers once Kafka is back is void wherever the log is read
(`allmende.core.kafka_reading.appended_late`). The
same job asked again then gets a fresh decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from kafka import KafkaConsumer, TopicPartition

from allmende.core.checkpoints import Checkpoint, CheckpointStore, Offsets
from allmende.core.kafka_reading import (
    LagWatch,
    appended_late,
    offsets_misfit,
    read_to_end,
    record_by_header,
    replaying_consumer,
)
from allmende.core.leader_lease import LeaderLease
from allmende.core.metrics import (
    ADMISSION,
    ADMISSION_DECIDE_SECONDS,
    ADMISSION_DECISIONS,
    ADMISSION_ELECTIONS,
    ADMISSION_LATE_EVENTS,
    ADMISSION_LEADING,
    ADMISSION_RETIRED_JOBS,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.admission import decide
from allmende.domain.admission_model import (
    AdmissionSnapshot,
    InteractiveLimits,
    JobRequest,
    RunningJob,
    Victim,
)
from allmende.domain.admission_state import AdmissionState, JobRecord, JobSeen, Tentative, dump_of
from allmende.domain.budget_view import ChargeRowsCache, budget_lines
from allmende.domain.gpu_utilisation import mean_bp
from allmende.domain.preemption import Reach, plan_victims
from allmende.domain.squatting import SquatRule
from allmende.domain.timeslices import active_at
from allmende.schemas.admission_events import (
    AdmissionDecided,
    AdmissionEvent,
    HoldPlaced,
    HoldReleased,
    HostRecovered,
    HostUnhealthy,
    ReasonRecord,
    VictimRecord,
    encode_admission_event,
    parse_admission_event,
)
from allmende.schemas.events import ContractError, parse_job_event
from allmende.schemas.gpu_samples import parse_gpu_samples
from allmende.services.group_commit import GroupCommit
from allmende.streams.admin_log import AdminLog
from allmende.streams.fairshare_calculator import FairShareCalculator

log = structlog.get_logger(__name__)
CHECKPOINT_KIND = "admission"
STOP_TIMEOUT_S = 5.0  # how long a stop waits for the broker to take what is still on its way
# A leader paused or killed mid-commit leaves its transaction open, and every read_committed
# reader waits at it until the next leader fences it or the broker aborts it after this long.
TXN_TIMEOUT_MS = 10_000


RELEASE_CHUNK = 50  # hold releases per turn of the event loop
# GPU samples read at start beyond the squatting grace period: a few scrapes, so that a job idle for
# the whole window is known to have idled longer than the grace (see `_follow_gpu_samples`).
SAMPLES_LOOKBACK_S = 600


class AdmissionRefused(ValueError):
    """The request itself is wrong (unknown project or cluster, too many GPUs): a 4xx, not a verdict;
    or it cannot be decided here now (503: starting, or this instance is a standby)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def not_leader(instance: str) -> AdmissionRefused:
    return AdmissionRefused(
        503, f"instance {instance} is a standby: it follows the admission log and answers reads; "
        "ask another instance (the leader decides)", "not-leader",
    )  # fmt: skip


class AdmissionNotRecorded(RuntimeError):
    """The admission log did not take an event (Kafka away): no answer; asking again is safe."""

    def __init__(self, what: str, cause: BaseException, again: str) -> None:
        super().__init__(f"{what} could not be recorded in the admission log ({cause!r}); {again}")


@dataclass
class _InFlight:
    """A decision folded tentatively, on its way to the log."""

    decided: AdmissionDecided
    tentative: Tentative
    sent: asyncio.Future[int | None]  # the broker's append time (ms), or None if it does not stamp
    deadline: float  # monotonic: past it the request is answered 503 and the decision voided
    record_by: int  # UTC ms: appended later, its records are void
    voided: list[bool] = field(default_factory=lambda: [False])


class AdmissionService:
    def __init__(
        self,
        settings: Settings,
        admin_log: AdminLog,
        calculator: FairShareCalculator,
        clock: Callable[[], float] = time.time,
    ) -> None:
        register(ADMISSION)
        self.settings = settings
        self.admin_log = admin_log
        self.calculator = calculator
        self.clock = clock
        self.state = self._new_state()
        self._lock = threading.Lock()
        self._producer: AIOKafkaProducer | None = None
        self._log: GroupCommit | None = None
        self._charges = ChargeRowsCache()
        # Decided (folded tentatively) but not yet acknowledged by the log, per job.
        self._inflight: dict[str, _InFlight] = {}
        self._release_retry: list[HoldReleased] = []  # releases the log did not take
        self._stop = threading.Event()
        self._jobs_thread: threading.Thread | None = None
        self._samples_thread: threading.Thread | None = None
        self._jobs_lag = LagWatch()
        self.jobs_caught_up = self._jobs_lag.caught_up
        self.last_error: str | None = None
        # What the state covers, for checkpoints: the next own-log offset a replay read to, and per
        # job-event partition the next offset folded (under the lock, with the fold).
        self._log_next = 0
        self._jobs_next: dict[int, int] = {}
        self._unsettled = 0  # host reports and releases between the state and the log (lock)
        self._diverged = False  # the log holds what the state voided: no checkpoint of this state
        self.checkpoints = (
            CheckpointStore(settings.checkpoint_dir, settings.topic_prefix)
            if settings.checkpoint_every_s > 0
            else None
        )
        self.resumed_from: Offsets | None = None  # the checkpoint's offsets the start loaded
        # Hot standby (settings.admission_election): the lease says who leads; a standby folds the
        # log as the leader writes it (`_follow_own_log`) and refuses writes.
        self.instance = settings.instance_name or f"{socket.gethostname()}:{os.getpid()}"
        self.leading = False  # decides and writes (always, once started, without election)
        self._lease: LeaderLease | None = None
        self._lease_changed: asyncio.Event | None = None
        self._broken: BaseException | None = None  # the leader's writer was fenced or gave up
        self._role_task: asyncio.Task[None] | None = None
        self._follow_stop = threading.Event()
        self._follow_thread: threading.Thread | None = None

    def now(self) -> int:
        return int(self.clock())

    def _new_state(self) -> AdmissionState:
        s = self.settings
        squat = SquatRule.of(s.squat_max_utilization, s.squat_grace_s) if s.squat_reclaim else None
        return AdmissionState(squat=squat, retention_s=s.ended_job_retention_s)

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._replay_own_log, True)
        self._jobs_thread = threading.Thread(
            target=self._follow_job_events, name="admission-jobs", daemon=True
        )
        self._jobs_thread.start()
        if self.settings.squat_reclaim:
            self._samples_thread = threading.Thread(
                target=self._follow_gpu_samples, name="admission-gpu-samples", daemon=True
            )
            self._samples_thread.start()
        if not self.settings.admission_election:
            await self._open_log(transactional=False)
            self.leading = True
            ADMISSION_LEADING.set(1)
            return
        s, loop = self.settings, asyncio.get_running_loop()
        changed = self._lease_changed = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        self._start_following()
        self._lease = LeaderLease(
            s.kafka_bootstrap_servers, s.admission_lease_topic, s.admission_lease_topic, self.instance,
            elected=wake, deposed=wake, session_timeout_ms=s.admission_lease_timeout_ms,
        )  # fmt: skip
        self._lease.start()
        self._role_task = asyncio.create_task(self._keep_role(), name="admission-role")

    async def _open_log(self, transactional: bool) -> None:
        """The producer and group commit of the admission log. Transactional (a leader): taking the
        log's one transactional id fences the previous leader's producer: the broker aborts its
        open transaction, and refuses its writes from then on."""
        s = self.settings
        fencing: dict[str, Any] = (
            {"transactional_id": s.admission_writer_id, "transaction_timeout_ms": TXN_TIMEOUT_MS}
            if transactional
            else {}
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            acks="all",
            enable_idempotence=True,
            max_batch_size=1024 * 1024,  # a group commit is one batch: room for a burst of decisions
            **fencing,
        )
        await producer.start()
        try:
            if transactional:  # an empty transaction: it waits for the id, which is the fencing
                await producer.begin_transaction()
                await producer.commit_transaction()
        except BaseException:
            await _close(producer)
            raise
        self._producer = producer
        self._log = GroupCommit(
            producer, s.admission_topic, transactional=transactional, on_broken=self._writer_broken
        )
        self._log.start()

    async def _close_log(self) -> None:
        log_, producer, self._log, self._producer = self._log, self._producer, None, None
        if log_ is not None:
            await log_.stop()
        if producer is not None:
            await _close(producer)

    async def stop(self) -> None:
        self._stop.set()
        self._follow_stop.set()
        if self._role_task is not None:
            self._role_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._role_task
        await self._close_log()
        if self._lease is not None:  # leaving the group: a standby takes over at once
            await asyncio.to_thread(self._lease.stop)
        for thread in (self._jobs_thread, self._samples_thread, self._follow_thread):
            if thread is not None:
                await asyncio.to_thread(thread.join, 10)

    # -- the hot standby -------------------------------------------------------------------------
    def _writer_broken(self, exc: BaseException) -> None:
        """The leader's transactional writer was fenced (another instance leads) or gave up."""
        log.warning("admission_writer_broken", instance=self.instance, error=repr(exc))
        self._broken = exc
        if self._lease_changed is not None:
            self._lease_changed.set()

    async def _keep_role(self) -> None:
        """Lead while the lease names this instance and its writer is not fenced; follow otherwise."""
        assert self._lease is not None and self._lease_changed is not None
        while True:
            await self._lease_changed.wait()
            self._lease_changed.clear()
            try:
                if self._broken is not None:
                    await self._step_down(f"its writes are refused ({self._broken!r})")
                    self._broken = None
                    self._lease.rejoin()  # the lease may still name it: the group decides afresh
                elif self._lease.leading and not self.leading:
                    await self._take_lead()
                elif not self._lease.leading and self.leading:
                    await self._step_down("the lease went to another instance")
            except Exception as exc:  # Kafka away while taking the lead: let the group decide again
                log.exception("admission_role_change_failed", instance=self.instance, error=repr(exc))
                await self._step_down(f"the change failed ({exc!r})")
                self._lease.rejoin()

    async def _take_lead(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self._stop_following)
        try:
            await self._open_log(transactional=True)
            # Fenced, the last leader cannot add to the log: its end is final; fold up to it.
            await asyncio.to_thread(self._catch_up_own_log)
        except BaseException:
            await self._close_log()
            self._start_following()
            raise
        self.leading = True
        ADMISSION_LEADING.set(1)
        ADMISSION_ELECTIONS.inc()
        log.info("admission_leading", instance=self.instance, seconds=round(time.monotonic() - started, 3))

    async def _step_down(self, why: str) -> None:
        """Stop writing and rebuild from the log: the state may hold what the log never took."""
        was_leading, self.leading = self.leading, False
        ADMISSION_LEADING.set(0)
        await self._close_log()  # its waiting requests fail, and void their decisions
        self._release_retry = []  # the next leader finds them due itself
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if was_leading:
            await asyncio.to_thread(self._stop_following)
            await asyncio.to_thread(self._replay_own_log, False)
            self._start_following()
        log.warning("admission_standing_by", instance=self.instance, why=why)

    def _start_following(self) -> None:
        if self._follow_thread is not None and self._follow_thread.is_alive():
            return
        self._follow_stop.clear()
        self._follow_thread = threading.Thread(
            target=self._follow_own_log, name="admission-follow", daemon=True
        )
        self._follow_thread.start()

    def _stop_following(self) -> None:
        self._follow_stop.set()
        if self._follow_thread is not None:
            self._follow_thread.join(30)
        self._follow_thread = None

    def _follow_own_log(self) -> None:
        """A standby folds the admission log as the leader commits to it, from where its state is."""
        s = self.settings
        tp = TopicPartition(s.admission_topic, 0)
        while not self._follow_stop.is_set():
            consumer, _ = replaying_consumer(s.kafka_bootstrap_servers, [tp])
            try:
                consumer.seek(tp, self._log_next)
                while not self._follow_stop.is_set():
                    records = consumer.poll(timeout_ms=100).get(tp, [])
                    self._fold_own(records, consumer.position(tp))
            except Exception as exc:  # Kafka away: start over from where the fold stands
                self.last_error = repr(exc)
                log.warning("admission_follow_failed", error=repr(exc))
                self._follow_stop.wait(1.0)
            finally:
                consumer.close(autocommit=False)

    def _catch_up_own_log(self) -> None:
        s = self.settings
        tp = TopicPartition(s.admission_topic, 0)
        consumer, _ = replaying_consumer(s.kafka_bootstrap_servers, [tp])
        try:
            consumer.seek(tp, self._log_next)
            records: list[Any] = []
            read_to_end(consumer, tp, records.append)
            self._fold_own(records, consumer.position(tp))
        finally:
            consumer.close(autocommit=False)

    def _fold_own(self, records: Sequence[Any], next_offset: int) -> None:
        with self._lock:
            for record in records:
                event = recorded_event(record)
                if event is not None:
                    self.state.apply(event)
            self._log_next = max(self._log_next, next_offset)

    def _replay_own_log(self, starting: bool) -> None:
        """Rebuild from the admission log: what was answered before a restart is answered again.
        From the latest checkpoint that fits the topics as they are, reading only what follows it."""
        s = self.settings
        tp = TopicPartition(s.admission_topic, 0)
        consumer, _ = replaying_consumer(s.kafka_bootstrap_servers, [tp])
        state = self._resume(consumer, tp, starting) or self._new_state()

        def fold(record: Any) -> None:
            event = recorded_event(record)
            if event is not None:
                state.apply(event)

        try:
            events = read_to_end(consumer, tp, fold)
            self._log_next = consumer.position(tp)
            with self._lock:
                self._diverged = False  # whatever this state held, it is the log's now
                jobs = self.state.jobs  # job events folded meanwhile stay
                self.state = state
                state.adopt(jobs)
            log.info("admission_log_replayed", events=events, decisions=len(state.decisions))
        finally:
            consumer.close(autocommit=False)

    # -- checkpoints -----------------------------------------------------------------------------
    def _fingerprint(self) -> dict[str, object]:
        """What the state depends on besides its topics: another value, another state."""
        s = self.settings
        squat = [s.squat_max_utilization, s.squat_grace_s] if s.squat_reclaim else None
        return {
            "admission_topic": s.admission_topic, "job_events_topic": s.job_events_topic,
            "retention_s": s.ended_job_retention_s, "squat": squat,
        }  # fmt: skip

    def _resume(self, consumer: KafkaConsumer, tp: TopicPartition, starting: bool) -> AdmissionState | None:
        """The state of the latest checkpoint that fits both topics as they are now, with the own
        log's consumer sought to the offset it covers and (`starting`) the job-event fold to start
        where it stopped; None (logged when there was one) to replay both from their beginning."""
        if self.checkpoints is None:
            return None
        checkpoint = self.checkpoints.load(CHECKPOINT_KIND, self._fingerprint())
        if checkpoint is None:
            return None
        s = self.settings
        try:
            squat = SquatRule.of(s.squat_max_utilization, s.squat_grace_s) if s.squat_reclaim else None
            state = AdmissionState.restore(checkpoint.body, s.ended_job_retention_s, squat)
            jobs = [
                TopicPartition(s.job_events_topic, p)
                for p in consumer.partitions_for_topic(s.job_events_topic) or ()
            ]
            topics = (tp, *jobs)
            problem = offsets_misfit(consumer, topics, checkpoint.offsets)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = f"its body cannot be read: {exc!r}"
        if problem is not None:
            log.warning("checkpoint_ignored", kind=CHECKPOINT_KIND, reason=problem)
            return None
        consumer.seek(tp, checkpoint.offsets[s.admission_topic][0])
        if starting:  # later (a leader stepping down) the job-event fold is further on: it stays
            with self._lock:
                self._jobs_next = dict(checkpoint.offsets[s.job_events_topic])
            self.resumed_from = checkpoint.offsets
        log.info("checkpoint_loaded", kind=CHECKPOINT_KIND, jobs=len(state.jobs),
                 decisions=len(state.decisions), taken_at=checkpoint.taken_at)  # fmt: skip
        return state

    def checkpoint(self, within_s: float = 5.0) -> int | None:
        """Write a checkpoint of the state at a moment it is the fold of exactly the log up to an
        offset (no decision, release or host report between the state and the log), the job events
        caught up; returns its size (None: no such moment within `within_s`, tried again at the
        next round). The copy is taken under the lock; it is written outside it."""
        if self.checkpoints is None or self._diverged or not self.jobs_caught_up.is_set():
            return None
        s = self.settings
        deadline = time.monotonic() + within_s
        while True:
            with self._lock:
                if not (self._inflight or self._release_retry or self._unsettled):
                    started = time.monotonic()
                    acked = self._log.acked_end if self._log is not None else None
                    own = max(self._log_next, acked or 0)
                    offsets = {s.admission_topic: {0: own}, s.job_events_topic: dict(self._jobs_next)}
                    captured = self.state.capture()  # references and tuples: the sorting comes after
                    held_s = time.monotonic() - started
                    break
            if time.monotonic() > deadline or self._stop.is_set():
                return None
            time.sleep(0.01)  # a decision's commit takes milliseconds: a quiet moment comes soon
        body = dump_of(captured)
        size = self.checkpoints.save(Checkpoint(CHECKPOINT_KIND, offsets, self._fingerprint(), body))
        log.info("checkpoint_saved", kind=CHECKPOINT_KIND, bytes=size, jobs=len(body["jobs"]),
                 lock_s=round(held_s, 4), seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return size

    def _follow_job_events(self) -> None:
        """Fold the job lifecycle from the start of the job-event stream (or from where the state
        left it: a checkpoint, or the fold before Kafka went away), then follow it."""
        s = self.settings
        while not self._stop.is_set():
            consumer, partitions = replaying_consumer(
                s.kafka_bootstrap_servers, s.job_events_topic,
                client_id="allmende-admission", max_partition_fetch_bytes=16 * 1024 * 1024,
            )  # fmt: skip
            first = consumer.beginning_offsets(partitions)
            with self._lock:
                for tp in partitions:  # every partition, so that a checkpoint covers each
                    self._jobs_next.setdefault(tp.partition, first[tp])
                folded = dict(self._jobs_next)
            for tp in partitions:
                consumer.seek(tp, folded[tp.partition])
            try:
                while not self._stop.is_set():
                    polled = consumer.poll(timeout_ms=200, max_records=20_000)
                    events = []
                    for records in polled.values():
                        for record in records:
                            try:
                                events.append((parse_job_event(record.value), record.partition))
                            except ContractError:
                                continue  # the meter dead-letters it; admission only needs the valid ones
                    positions = {
                        tp.partition: records[-1].offset + 1 for tp, records in polled.items() if records
                    }
                    if positions:
                        with self._lock:
                            late = sum(not self.state.observe(e, partition) for e, partition in events)
                            self._jobs_next.update(positions)
                        ADMISSION_LATE_EVENTS.inc(late)
                    self._jobs_lag.check(consumer, partitions)
            except Exception as exc:  # Kafka away: start over, the fold is order-free
                self.last_error = repr(exc)
                log.exception("admission_job_events_failed", error=repr(exc))
                self._stop.wait(2.0)
            finally:
                consumer.close(autocommit=False)

    def _follow_gpu_samples(self) -> None:
        """Fold the GPUs' own samples (dcgm-exporter, docs/dcgm.md) into the running jobs'
        readings, for squatting reclaim, from `grace + SAMPLES_LOOKBACK_S` ago, then follow them.
        The readings are two maxima per job, so reading a sample twice (a restart, Kafka away)
        changes nothing, and that window decides squatting exactly: a job whose samples in it
        were all idle has idled longer than the grace (its idle-since may read earlier than it
        was). Not checkpointed: a restart reads the window again."""
        s = self.settings
        while not self._stop.is_set():
            consumer, partitions = replaying_consumer(
                s.kafka_bootstrap_servers, s.gpu_samples_topic, client_id="allmende-admission-samples"
            )
            try:
                since_ms = int((time.time() - s.squat_grace_s - SAMPLES_LOOKBACK_S) * 1000)
                found = consumer.offsets_for_times({tp: since_ms for tp in partitions})
                for tp in partitions:
                    at = found.get(tp)
                    if at is None:
                        consumer.seek_to_end(tp)  # nothing that recent: only what comes
                    else:
                        consumer.seek(tp, at.offset)
                while not self._stop.is_set():
                    polled = consumer.poll(timeout_ms=500, max_records=20_000)
                    readings = []
                    for records in polled.values():
                        for record in records:
                            try:
                                sample = parse_gpu_samples(record.value)
                            except ContractError:
                                continue  # the meter dead-letters it
                            if sample.job_id is not None:
                                readings.append((sample.job_id, sample.occurred_at, mean_bp(sample)))
                    if readings:
                        with self._lock:
                            for job_id, at_s, bp in readings:
                                self.state.read_gpus(job_id, at_s, bp)
            except Exception as exc:  # Kafka away: start over from the window (order-free)
                self.last_error = repr(exc)
                log.exception("admission_gpu_samples_failed", error=repr(exc))
                self._stop.wait(2.0)
            finally:
                consumer.close(autocommit=False)

    def retire_ended(self, decided_through: Callable[[], int | None] | None = None) -> list[str]:
        """Let go of the jobs that ended (or never ran) a retention period ago: memory holds what
        is live; the admission log and ClickHouse keep the rest (the route reads it there). Not
        while the job events are being read (a job that looks ended may run), nor a job decided
        after what the decision history holds (`decided_through`: its writer's latest decision;
        None: nothing written yet)."""
        if not self.jobs_caught_up.is_set():
            return []
        through = None
        if decided_through is not None:
            through = decided_through()
            if through is None:
                through = -1  # nothing written: only jobs never decided may go
        s = self.settings
        with self._lock:
            retired = self.state.retire(self.now(), s.admission_start_deadline_s, self._inflight, through)
        if retired:
            ADMISSION_RETIRED_JOBS.inc(len(retired))
            log.info("admission_jobs_retired", jobs=len(retired), held=len(self.state.jobs))
        return retired

    def _submit(
        self, events: Sequence[AdmissionEvent], record_by: int | None = None
    ) -> asyncio.Future[int | None]:
        """Queue events for the admission log now (void if appended after `record_by`); the future
        is done once it has them, with the broker's append time."""
        if self._log is None:
            raise RuntimeError("the admission service has not started")
        headers = record_by_header(record_by) if record_by is not None else []
        return self._log.submit([(e.key.encode(), encode_admission_event(e), headers) for e in events])

    async def _publish(self, events: Sequence[AdmissionEvent]) -> None:
        await asyncio.shield(self._submit(events))

    def _record_by(self) -> tuple[float, int]:
        """(monotonic deadline of the answer, `record_by` of its records). They must be
        appended a little before the answer is given up on: an acknowledgement on its way when
        the request is answered 503 would otherwise leave a valid record behind it."""
        timeout_ms = self.settings.write_timeout_ms
        margin_ms = min(100, timeout_ms // 2)
        return time.monotonic() + timeout_ms / 1000, time.time_ns() // 1_000_000 + timeout_ms - margin_ms

    async def _written(self, sent: asyncio.Future[int | None], deadline: float, record_by: int) -> None:
        """Wait (shielded) for the log to take events by `deadline`; raise if it did not, or did
        too late (then the copy there is void)."""
        appended = await asyncio.wait_for(asyncio.shield(sent), timeout=max(0.0, deadline - time.monotonic()))
        if appended is not None and appended > record_by:
            raise TimeoutError(f"appended at {appended} ms, after its record-by instant {record_by} ms")

    # -- deciding ------------------------------------------------------------------------------
    def validate(self, request: JobRequest) -> None:
        admin = self.admin_log.state
        node = admin.nodes.get(request.project)
        if node is None or node.kind != "project":
            raise AdmissionRefused(404, f"no project {request.project!r}")
        cluster = admin.clusters.get(request.cluster)
        if cluster is None:
            raise AdmissionRefused(404, f"no cluster {request.cluster!r}")
        if cluster.gpu_type != request.gpu_type:
            raise AdmissionRefused(
                422, f"cluster {cluster.cluster} has {cluster.gpu_type} GPUs, not {request.gpu_type}"
            )
        if request.gpus > cluster.gpus:
            raise AdmissionRefused(
                422, f"the job asks for {request.gpus} GPUs; cluster {cluster.cluster} has {cluster.gpus}"
            )

    def snapshot(self, request: JobRequest, now: int) -> AdmissionSnapshot:
        """Everything `decide` needs, from memory. Call with the lock held."""
        s = self.settings
        admin = self.admin_log.state
        cluster = admin.clusters[request.cluster]
        usage = self.calculator.usage
        allocations = admin.allocations_of(request.project)
        with self.calculator.lock:
            held = self.state.held(usage.jobs, request.project)
            # Sums per allocation segment kept from the usage's changes while the allocations stand.
            balance = self._charges.balance_of(
                request.project, usage, (id(admin), len(admin.history)), now, allocations, held
            )
        agreements = active_at(admin.active_agreements(), request.cluster, now)
        guarantees: dict[str, int] = {}
        for agreement in agreements:
            guarantees[agreement.project] = guarantees.get(agreement.project, 0) + agreement.gpus
        policy = self.admin_log.timeline().in_force(now)
        return AdmissionSnapshot(
            now=now,
            cluster_gpus=cluster.gpus,
            load=self.state.load_on(request.cluster, now, s.admission_start_deadline_s),
            budget=budget_lines(balance, now, request.cluster, request.gpu_type),
            rate=policy.rate_per_gpu_second(request.gpu_type, request.priority_class, request.interactive),
            guaranteed_gpus=guarantees.get(request.project, 0),
            protected_projects=frozenset(guarantees),
            guarantees=guarantees,
            fairshare=self.calculator.current_factors(),
            unhealthy_hosts=self.state.unhealthy_hosts(request.cluster),
            limits=InteractiveLimits(s.interactive_max_gpus_per_user, s.interactive_max_hours * 3600),
        )

    async def admit(self, request: JobRequest, actor: str, dry_run: bool = False) -> AdmissionDecided:
        """Decide for one job; the same job id gets the same admit or reject again, not a second
        hold. Answered once the decision is in the admission log; not in it within
        `write_timeout_ms` (Kafka away), it is taken back and AdmissionNotRecorded raised."""
        now = self.now()
        if not dry_run:
            self._require_leader()
        with self._lock:
            self.validate(request)
            prior = self.state.decisions.get(request.job_id)
            inflight = self._inflight.get(request.job_id)
            if inflight is not None or (prior is not None and prior.verdict != "queue"):
                answer = inflight.decided if inflight is not None else prior
                assert answer is not None
                if _request_of(answer) != request:
                    raise AdmissionRefused(
                        409,
                        f"job {request.job_id} was decided with other parameters; a new job needs a new id",
                    )
                if dry_run or inflight is None:
                    return answer  # recorded (or, dry, what would happen: this)
            else:
                deadline, record_by = self._record_by()
                answer, events = self._decide(request, prior, now, actor)
                if dry_run:
                    return answer
                tentative = self.state.apply_tentative(events)
                try:
                    sent = self._submit(events, record_by)  # queued now: this turn's decisions share a commit
                except Exception as exc:  # the log is stopped: not even queued
                    self.state.void(tentative)
                    raise self._not_recorded(request.job_id, exc) from exc
                inflight = _InFlight(answer, tentative, sent, deadline, record_by)
                self._inflight[request.job_id] = inflight
                sent.add_done_callback(functools.partial(_settled, self, inflight))
                ADMISSION_DECISIONS.labels(verdict=answer.verdict, lane=answer.lane or "").inc()
        try:
            await self._written(inflight.sent, inflight.deadline, inflight.record_by)
        except Exception as exc:
            self._void(request.job_id, inflight)
            raise self._not_recorded(request.job_id, exc) from exc
        with self._lock:
            if self._inflight.get(request.job_id) is inflight:
                del self._inflight[request.job_id]
        return answer

    def _not_recorded(self, job_id: str, exc: BaseException) -> AdmissionNotRecorded:
        return AdmissionNotRecorded(
            f"the decision for job {job_id}", exc, "it has no effect; ask again with the same job id"
        )

    def _void(self, job_id: str, inflight: _InFlight) -> None:
        """Take a decision back that the log did not take in time (once, whoever asks first)."""
        with self._lock:
            if inflight.voided[0]:
                return
            inflight.voided[0] = True
            self.state.void(inflight.tentative)
            if self._inflight.get(job_id) is inflight:
                del self._inflight[job_id]
        log.warning("admission_decision_voided", job_id=job_id, event_id=inflight.decided.event_id)

    # -- the simulator's entry points: the same decisions, recorded by the caller ---------------
    def decide_unrecorded(self, request: JobRequest, actor: str) -> tuple[AdmissionDecided, list[JobRecord]]:
        """Decide and fold as `admit` does, without the admission log: for the what-if simulator,
        which runs on its own clock and records the events itself, in order, on its own topic. A
        final decision is answered again without events; so is a queue answer for a job already
        queued (no new attempt, as the Slurm agent's dry run first)."""
        with self._lock:
            self.validate(request)
            prior = self.state.decisions.get(request.job_id)
            if prior is not None and prior.verdict != "queue":
                return prior, []
            answer, events = self._decide(request, prior, self.now(), actor)
            if prior is not None and answer.verdict == "queue":
                return answer, []
            for event in events:
                self.state.apply(event)
            return answer, events

    def release_unrecorded(self, actor: str = "allmende-admission") -> list[HoldReleased]:
        """The hold releases due now, folded; the caller records them (the simulator)."""
        now = self.now()
        with self._lock:
            events = []
            for job_id, reason in self.state.releasable(now, self.settings.admission_start_deadline_s):
                event = self._release_event(job_id, reason, now, actor)
                self.state.apply(event)
                events.append(event)
            return events

    def host_unrecorded(
        self, cluster: str, host: str, healthy: bool, reason: str, actor: str
    ) -> AdmissionEvent:
        """A host report with a deterministic id (the report's instant), folded; the simulator
        records it."""
        now = self.now()
        event = _host_event(cluster, host, healthy, reason, actor, now, str(now))
        with self._lock:
            self.state.apply(event)
        return event

    def _release_event(self, job_id: str, reason: str, now: int, actor: str) -> HoldReleased:
        return HoldReleased(
            event_id=f"release:{job_id}:{_attempt(self.state, job_id)}",
            occurred_at=now, actor=actor, job_id=job_id, reason=reason,
        )  # fmt: skip

    @property
    def standing_by(self) -> bool:
        """One of several instances, not the leader: it refuses writes."""
        return self.settings.admission_election and not self.leading

    def _require_leader(self) -> None:
        if self.standing_by:
            raise not_leader(self.instance)

    def _require_ready(self) -> None:
        if not self.calculator.ready.is_set():
            raise AdmissionRefused(
                503,
                "the usage behind budgets and fair share is still being replayed from the ledger; ask again",
            )

    def _decide(
        self, request: JobRequest, prior: AdmissionDecided | None, now: int, actor: str
    ) -> tuple[AdmissionDecided, list[JobRecord]]:
        """The decision and the events that record it. Call with the lock held."""
        self._require_ready()
        started = time.perf_counter()
        decision = decide(request, self.snapshot(request, now))
        ADMISSION_DECIDE_SECONDS.observe(time.perf_counter() - started)
        attempt = prior.attempt + 1 if prior is not None else 1
        decided = AdmissionDecided(
            event_id=f"decision:{request.job_id}:{attempt}", occurred_at=now, actor=actor,
            job_id=request.job_id, project=request.project, user=request.user,
            cluster=request.cluster, gpu_type=request.gpu_type, gpus=request.gpus,
            priority_class=request.priority_class,
            interactive=request.interactive, requested_seconds=request.requested_seconds, attempt=attempt,
            verdict=decision.verdict.value, lane=decision.lane.value if decision.lane else None,
            reasons=tuple(ReasonRecord(code=r.code, message=r.message) for r in decision.reasons),
            rate=decision.rate, expected_units=decision.expected_units,
            available_before_units=decision.available_before_units,
            available_after_units=decision.available_after_units,
            fairshare_factor=decision.fairshare_factor,
            preempt=tuple(_victim_record(v) for v in decision.preempt),
        )  # fmt: skip
        events: list[JobRecord] = [decided]
        if decision.hold:
            events.append(
                HoldPlaced(
                    event_id=f"hold:{request.job_id}:{attempt}",
                    occurred_at=now,
                    actor=actor,
                    job_id=request.job_id,
                    project=request.project,
                    allocations=decision.hold,
                    expires_at=now + request.requested_seconds + self.settings.admission_start_deadline_s,
                )
            )
        return decided, events

    def decision(self, job_id: str) -> AdmissionDecided | None:
        """The decision the admission log holds for the job (one still being recorded is not)."""
        inflight = self._inflight.get(job_id)
        if inflight is not None:
            return inflight.tentative.decision
        return self.state.decisions.get(job_id)

    def preemption_plan(self, cluster: str, gpus: int) -> tuple[tuple[Victim, ...], int]:
        admin = self.admin_log.state
        if cluster not in admin.clusters:
            raise AdmissionRefused(404, f"no cluster {cluster!r}")
        self._require_ready()
        now = self.now()
        factors = self.calculator.current_factors()
        with self._lock:  # the load is a live view
            load = self.state.load_on(cluster, now, self.settings.admission_start_deadline_s)
            return plan_victims(
                load.jobs, gpus, now=now, fairshare=factors,
                unhealthy_hosts=self.state.unhealthy_hosts(cluster), reach=Reach.STANDARD,
            )  # fmt: skip

    async def host_health(
        self, cluster: str, host: str, healthy: bool, reason: str, actor: str
    ) -> AdmissionEvent:
        if cluster not in self.admin_log.state.clusters:
            raise AdmissionRefused(404, f"no cluster {cluster!r}")
        self._require_leader()
        now = self.now()
        deadline, record_by = self._record_by()
        event = _host_event(cluster, host, healthy, reason, actor, now, str(time.time_ns()))
        with self._lock:
            self._unsettled += 1  # the log may hold it before the state does
        try:
            await self._written(self._submit([event], record_by), deadline, record_by)
        except Exception as exc:  # Kafka away: no effect, here or after a restart (void there)
            with self._lock:
                self._unsettled -= 1
            raise AdmissionNotRecorded(f"the report on host {host}", exc, "report it again") from exc
        with self._lock:  # in effect once the log has it, as it will be after a restart
            self.state.apply(event)
            self._unsettled -= 1
        return event

    async def release_due(self, chunk: int = RELEASE_CHUNK) -> list[HoldReleased]:
        """Release the holds of jobs that ended or never started: events, like everything else.

        In chunks, with the event loop free between them: a burst of releases (a wave of jobs
        ending) must not hold up the decisions waiting behind it. A hold the log does not hold
        yet waits (its release must come after it there); releases the log did not take are
        sent again next time (the state has them already)."""
        if self.standing_by:
            return []  # the leader releases; a standby folds its releases from the log
        now = self.now()
        with self._lock:
            due = [
                (job_id, reason)
                for job_id, reason in self.state.releasable(now, self.settings.admission_start_deadline_s)
                if job_id not in self._inflight
            ]
        released: list[HoldReleased] = []
        retry, self._release_retry = self._release_retry, []
        sends = []
        if retry:
            with self._lock:
                self._unsettled += 1  # applied already, and not in the log for sure
            sends.append((retry, asyncio.ensure_future(self._publish(retry))))
        for first in range(0, len(due), chunk):
            with self._lock:
                events = [
                    self._release_event(job_id, reason, now, "allmende-admission")
                    for job_id, reason in due[first : first + chunk]
                ]
                for event in events:
                    self.state.apply(event)
                self._unsettled += 1  # the state holds them before the log does
            released.extend(events)
            sends.append((events, asyncio.ensure_future(self._publish(events))))
            await asyncio.sleep(0)
        failure: BaseException | None = None
        for events, send in sends:
            try:
                await send
            except Exception as exc:  # Kafka away: kept, and sent again next round
                self._release_retry.extend(events)
                failure = exc
            with self._lock:
                self._unsettled -= 1
        if failure is not None:
            raise failure
        return released

    # -- the dashboards' reads (a copy under the lock: the state changes beside them) ---------
    def running_jobs(self, project: str) -> list[tuple[str, RunningJob]]:
        """(cluster, job) of the project's jobs that hold GPUs: running, or admitted and due to start."""
        with self._lock:
            return sorted(
                ((cluster, job) for cluster, load in self.state.live.items() for job in load.jobs
                 if job.project == project),
                key=lambda cj: (cj[1].since, cj[1].job_id),
            )  # fmt: skip

    def job_holds(self, project: str) -> list[tuple[str, int, int]]:
        """(job id, units still held, expiry) of the project's active holds, largest first."""
        with self._lock, self.calculator.lock:
            charged = self.calculator.usage.jobs
            found = [
                (job_id, sum(hold.remaining(charged.get(job_id, 0)).values()), hold.expires_at)
                for job_id, hold in self.state.active_holds.get(project, {}).items()
            ]
        return sorted(found, key=lambda h: (-h[1], h[0]))

    def preemptions(self, project: str) -> list[tuple[JobSeen, int, str]]:
        """(job, at, reason) of every preemption the project's jobs suffered, oldest first."""
        with self._lock:
            jobs = [self.state.jobs[j] for j in self.state.preempted if j in self.state.jobs]
            found = [
                (job, at, reason) for job in jobs if job.project == project for at, reason in job.preemptions
            ]
        return sorted(found, key=lambda p: (p[1], p[0].job_id))

    def held_units(self, project: str) -> dict[str, int]:
        """Units held per allocation of the project now: the balance's `held` column."""
        with self._lock, self.calculator.lock:
            return self.state.held(self.calculator.usage.jobs, project)


def recorded_event(record: Any) -> AdmissionEvent | None:
    """The event of an admission-log record, or None: unreadable (logged), or void (appended after
    its record-by instant: answered 503, delivered later)."""
    try:
        event = parse_admission_event(record.value)
    except ContractError as exc:
        log.error("admission_event_unreadable", offset=record.offset, reason=exc.reason)
        return None
    if appended_late(record):
        log.info("admission_event_void", event_id=event.event_id, offset=record.offset)
        return None
    return event


async def _close(producer: AIOKafkaProducer) -> None:
    # Kafka away, the producer would wait for its batches for good: they are void anyway.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), STOP_TIMEOUT_S)


def _settled(service: AdmissionService, inflight: _InFlight, sent: asyncio.Future[int | None]) -> None:
    """A send finished. One taken in time after its decision was voided (its acknowledgement
    later than the answer's deadline, though appended before `record_by`) is the one case where
    the log holds what the requester was told it does not: said loudly, and the decision folded
    again, so that the state stays the fold of its log (what a replay or a checkpoint holds). Only
    if the job was decided anew meanwhile does the state stay apart from the log: then no
    checkpoint is taken of it (a restart replays the log)."""
    if not inflight.voided[0] or sent.cancelled() or sent.exception() is not None:
        return
    appended = sent.result()
    if appended is None or appended <= inflight.record_by:
        job_id = inflight.decided.job_id
        log.error("admission_recorded_after_refusal", job_id=job_id, appended_ms=appended)
        with service._lock:
            if job_id in service._inflight or not service.state.redo(inflight.tentative):
                service._diverged = True


def _attempt(state: AdmissionState, job_id: str) -> int:
    decided = state.decisions.get(job_id)
    return decided.attempt if decided is not None else 1


def _request_of(decided: AdmissionDecided) -> JobRequest:
    return JobRequest(
        job_id=decided.job_id, project=decided.project, user=decided.user, cluster=decided.cluster,
        gpu_type=decided.gpu_type, gpus=decided.gpus, priority_class=decided.priority_class,
        interactive=decided.interactive, requested_seconds=decided.requested_seconds,
    )  # fmt: skip


def _host_event(
    cluster: str,
    host: str,
    healthy: bool,
    reason: str,
    actor: str,
    now: int,
    nonce: str,
    record_by: int | None = None,
) -> AdmissionEvent:
    """A host report; `nonce` makes its id (the wall clock's nanoseconds live, the instant in a
    simulation, where reports are deterministic)."""
    if healthy:
        return HostRecovered(event_id=f"host:{cluster}/{host}:ok:{nonce}", occurred_at=now, actor=actor,
                             cluster=cluster, host=host)  # fmt: skip
    return HostUnhealthy(event_id=f"host:{cluster}/{host}:bad:{nonce}", occurred_at=now, actor=actor,
                         cluster=cluster, host=host, reason=reason)  # fmt: skip


def _victim_record(victim: Victim) -> VictimRecord:
    return VictimRecord(
        job_id=victim.job_id, project=victim.project, gpus=victim.gpus, code=victim.code, reason=victim.reason
    )
