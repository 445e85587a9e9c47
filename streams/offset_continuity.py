"""The meter's guard against records its consumer skipped: every partition's offsets, in order.

Why: faust can hand the agent a partition's records past a stretch it never delivered. Seen here
with the meter reading two topics after a worker was killed and another took its partitions: the
new worker metered a partition's first records from the committed offset, then went on about 280
offsets further, and never came back (faust's recovery resumes the fetcher before it seeks the
stream partitions to their committed offsets; faust-streaming issues #216 and #221 describe the
same). Faust then refuses to commit past the gap, so nothing is lost for good, but the skipped
events stay unmetered until the worker restarts: their usage is missing from the ledger meanwhile.

The job-event and GPU-sample topics are neither compacted nor written in transactions, so their
offsets have no holes: a record whose offset is past the one expected next means records were
skipped. It is not metered; the partition is sought back to the first one missing (or to the
earliest the broker still holds, when retention took it), and its records come again, in order.
A record at or before the offset expected (a redelivery after a rebalance or a seek) is metered as
ever: its entries are idempotent. What is expected is forgotten at every assignment: a partition
handed back may start further on, where another worker committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Partition = TypeVar("Partition")
# A seek back to a gap is not repeated for records fetched before it (still arriving) for this long.
RESEEK_AFTER_S = 5.0


@dataclass
class OffsetContinuity(Generic[Partition]):
    """Per partition, the offset of the record expected next, and the last seek back to a gap
    (offset, monotonic instant). Pure: the caller seeks."""

    expected: dict[Partition, int] = field(default_factory=dict)
    sought: dict[Partition, tuple[int, float]] = field(default_factory=dict)

    def forget(self) -> None:
        """A new assignment: each partition starts wherever its first record is."""
        self.expected.clear()
        self.sought.clear()

    def to_seek(self, gaps: dict[Partition, int], now: float) -> dict[Partition, int]:
        """The gaps to seek back to now: not one sought less than RESEEK_AFTER_S ago (the records
        fetched before that seek are still arriving, and are skipped without another)."""
        due = {}
        for partition, missing in gaps.items():
            last = self.sought.get(partition)
            if last is not None and last[0] == missing and now - last[1] < RESEEK_AFTER_S:
                continue
            self.sought[partition] = (missing, now)
            due[partition] = missing
        return due

    def sought_to(self, partition: Partition, offset: int) -> None:
        """The partition was sought back to `offset`: its records come again from there."""
        self.expected[partition] = offset

    def seek_failed(self, partition: Partition) -> None:
        """Seek again at the next gap seen (a rebalance forgets it anyway)."""
        self.sought.pop(partition, None)

    def admit(self, records: Iterable[tuple[Partition, int]]) -> tuple[list[bool], dict[Partition, int]]:
        """For each (partition, offset) in order: whether to meter it; and per partition with a gap,
        the first offset missing (where to seek back to)."""
        kept: list[bool] = []
        gaps: dict[Partition, int] = {}
        for partition, offset in records:
            if partition in gaps:  # past a gap: everything after it comes again after the seek
                kept.append(False)
                continue
            expected = self.expected.get(partition)
            if expected is None or offset <= expected:
                self.expected[partition] = offset + 1
                kept.append(True)
            else:
                gaps[partition] = expected
                kept.append(False)
        return kept, gaps
