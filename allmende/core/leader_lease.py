"""Leadership among the instances of a service, held as a Kafka consumer-group assignment.

Every instance joins one consumer group on a topic of one partition; the member assigned that
partition leads (as Kafka Connect and Schema Registry elect theirs). The broker is the judge: a
member that stops heartbeating (killed, paused, cut off) is out of the group after the session
timeout, and the partition goes to another. The sticky assignor keeps it where it is when a
member joins or leaves (by generation: an evicted member that comes back does not take it back),
so a standby coming up does not take the lead from a healthy leader. Each rebalance revokes every
partition first (the eager protocol); the leader keeps leading through it unless the assignment
that follows names another: between the two, the fencing keeps the log whole.

The lease says who should write; it does not stop a paused leader that wakes from writing: the
writer's transactional producer does (a new leader's producer fences the old one's id). So a
callback here only starts or stops the work, and a lost lease is acted on at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

log = structlog.get_logger(__name__)
POLL_S = 0.1  # a rebalance completes in the poll: often, so a takeover waits on the session alone


class LeaderLease:
    """Join `group` on `topic` (one partition) and call `elected()` when this instance is given
    the lead, `deposed()` when it loses it (revoked, or evicted from the group). Callbacks run on
    the lease's thread and must return at once."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        instance: str,
        elected: Callable[[], None],
        deposed: Callable[[], None],
        session_timeout_ms: int = 3000,
    ) -> None:
        self._config = {
            "bootstrap_servers": bootstrap,
            "group_id": group,
            "client_id": instance,
            "enable_auto_commit": False,
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": max(100, session_timeout_ms // 6),
            "max_poll_interval_ms": max(10_000, session_timeout_ms),
            "partition_assignment_strategy": (StickyPartitionAssignor,),
        }
        self.topic = topic
        self.instance = instance
        self._elected, self._deposed = elected, deposed
        self._leading = False
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        return self._leading

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-lease", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Leave the group (the others re-elect at once, not after a session timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def rejoin(self) -> None:
        """Leave and join again: the writer was fenced while the lease still named this instance
        (it was paused, and the group moved on without its knowing). The group decides afresh."""
        self._restart.set()

    def _set(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info("leader_elected" if leading else "leader_deposed", instance=self.instance, topic=self.topic)
        (self._elected if leading else self._deposed)()

    def _run(self) -> None:
        lease = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
                pass  # every rebalance revokes all first: the assignment that follows decides

            def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
                lease._set(any(tp.topic == lease.topic for tp in assigned))

            def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
                lease._set(False)  # evicted (paused past the session): another may lead already

        while not self._stop.is_set():
            self._restart.clear()
            consumer = None
            try:
                consumer = KafkaConsumer(**self._config)
                consumer.subscribe([self.topic], listener=Listener())
                while not (self._stop.is_set() or self._restart.is_set()):
                    consumer.poll(timeout_ms=int(POLL_S * 1000), max_records=1)
            except Exception as exc:  # Kafka away: not leading; join again once it is back
                log.warning("leader_lease_failed", instance=self.instance, error=repr(exc))
                self._stop.wait(1.0)
            finally:
                self._set(False)
                if consumer is not None:
                    try:
                        consumer.close(autocommit=False)
                    except Exception as exc:
                        log.warning("leader_lease_close_failed", error=repr(exc))
