"""Metering: turn a job's lifecycle events into exact, order-independent ledger entries.

Model. Each timed event is a *boundary* of the job's GPU time, sorted by
(time, rank, hash(event id), event id). The entry that a boundary closes covers the span from
its predecessor to itself and depends on nothing else:

- a usage sample charges its own `gpus_in_use` over that span (a meter reading covers the time
  since the previous reading);
- a preemption or a finish charges the GPUs in force at the predecessor (the last sample's, or
  the start's);
- a start charges nothing: it opens a run and closes none, so a zero-second run, a stray reading
  between runs or a lost end never charges the gap before a restart;
- any span that begins at a preemption or finish is idle: nothing runs between runs.

Inserting a late boundary only moves predecessors later, never earlier, so an entry's content is
a function of (its boundary, its predecessor, the dispute stage of the job's usage, whether the
job's JobSubmitted is known), and its revision key (`version`, `pred_event_id`) orders exactly
those, growing whenever the content may change (`version` holds the predecessor's time, rank and
a 24-bit hash, then the dispute stage, which only grows, then the submission bit; the
predecessor's event id settles the rare hash tie). A disputed job's entries are unattributed
(charged to no project) until an admin resolves the dispute to charge it. The writer keeps the
largest revision of each entry: duplicates, reordering and redelivery converge to the ledger that
in-order delivery gives.

A JobPreempted or JobFinished that carries `started_at` adds the run's start as a boundary of its
own, so a lost JobStarted costs nothing.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from allmende.domain.admin_state import DISPUTED, DROPPED, NOT_DISPUTED
from allmende.schemas.events import (
    JobEvent,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
)
from allmende.schemas.ledger import UNATTRIBUTED, LedgerEntry, new_entry

# Rank breaks ties at the same second: a reading closes the span before it, then the run ends,
# then a new run may start.
SAMPLE, PREEMPT, FINISH, START = 0, 1, 2, 3
_ENDS = (PREEMPT, FINISH)
_GPUS_FROM_SUBMISSION = -1  # a start recovered from `started_at` takes the submitted GPU count

# A boundary is [time, rank, hash24, event_id, gpus, utilization_bp], and a run's end that knows
# its run's start has that start as a 7th element; lists so that bisect compares keys. State
# written before utilisation was kept has 5 elements (read as busy).
Boundary = list[Any]
BUSY_BP = 10_000  # utilisation of a span without a reading
WITHHELD = (DISPUTED, DROPPED)  # dispute stages whose usage is charged to no project
_Attribution = tuple[str, str, str, str, str, bool]
_UNATTRIBUTED: _Attribution = (UNATTRIBUTED, UNATTRIBUTED, UNATTRIBUTED, UNATTRIBUTED, UNATTRIBUTED, False)


class MeteringRejected(ValueError):
    """The event is well-formed but contradicts what is known of the job (dead-lettered)."""


def _hash24(event_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=3).digest(), "big")


def entry_id_for(job_id: str, boundary_event_id: str) -> str:
    return hashlib.blake2b(f"{job_id}\x1f{boundary_event_id}".encode(), digest_size=16).hexdigest()


def _boundary(time: int, rank: int, event_id: str, gpus: int, utilization_bp: int = BUSY_BP) -> Boundary:
    return [time, rank, _hash24(event_id), event_id, gpus, utilization_bp]


def utilization_bp(utilization: float) -> int:
    """A reading's utilisation in basis points: an integer, so idle time is exact downstream."""
    return min(BUSY_BP, max(0, round(utilization * BUSY_BP)))


def _boundaries_of(event: JobEvent) -> list[Boundary]:
    if isinstance(event, JobStarted):
        return [_boundary(event.occurred_at, START, event.event_id, event.gpus)]
    if isinstance(event, JobUsageSample):
        return [
            _boundary(
                event.occurred_at,
                SAMPLE,
                event.event_id,
                event.gpus_in_use,
                utilization_bp(event.gpu_utilization),
            )
        ]
    if isinstance(event, JobPreempted | JobFinished):
        rank = PREEMPT if isinstance(event, JobPreempted) else FINISH
        end = _boundary(event.occurred_at, rank, event.event_id, 0)
        if event.started_at is not None:
            end.append(event.started_at)  # the run charges nothing before its own start
        found = [end]
        if event.started_at is not None:
            if event.started_at > event.occurred_at:
                raise MeteringRejected(
                    f"{event.type} {event.event_id}: started_at {event.started_at} is after "
                    f"occurred_at {event.occurred_at}"
                )
            found.append(_boundary(event.started_at, START, f"{event.event_id}#start", _GPUS_FROM_SUBMISSION))
        return found
    raise TypeError(f"not a timed event: {type(event).__name__}")


@dataclass(slots=True)
class JobMeter:
    """What the meter knows of one job; serialisable for the stream processor's state table."""

    job_id: str
    submitted: dict[str, Any] | None = None
    boundaries: list[Boundary] = field(default_factory=list)
    # Where the job's disputed usage stands (domain.admin_state.Dispute.stage) as its entries were
    # last emitted: the meter sets it from the admin log and re-emits every entry when it changes.
    dispute_stage: int = NOT_DISPUTED

    # -- persistence ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        state: dict[str, Any] = {"j": self.job_id, "s": self.submitted, "b": self.boundaries}
        if self.dispute_stage:
            state["d"] = self.dispute_stage
        return orjson.dumps(state)

    @classmethod
    def from_bytes(cls, raw: bytes) -> JobMeter:
        data = orjson.loads(raw)
        boundaries = [b if len(b) >= 6 else [*b, BUSY_BP] for b in data["b"]]
        # "p": GPU samples earlier meters held for a submission; the sample writer keeps them now.
        return cls(
            job_id=data["j"],
            submitted=data["s"],
            boundaries=boundaries,
            dispute_stage=data.get("d", NOT_DISPUTED),
        )

    # -- commands -----------------------------------------------------------------------------
    def apply(self, event: JobEvent) -> list[LedgerEntry]:
        """Record the event and return every entry whose content it may have changed.

        A duplicate returns the same entries again: a lost emission heals on redelivery.
        """
        if event.job_id != self.job_id:
            raise MeteringRejected(f"event for job {event.job_id} routed to job {self.job_id}")
        if isinstance(event, JobSubmitted):
            return self._apply_submitted(event)
        boundaries = self.boundaries
        found = _boundaries_of(event)
        if len(found) == 1:
            # One boundary (all but a run's end that carries `started_at`): it touches its own
            # entry and the next one's.
            boundary = found[0]
            key = boundary[:4]
            at = bisect.bisect_left(boundaries, key)
            if at < len(boundaries) and boundaries[at][:4] == key:
                pass  # a duplicate: its entries again
            elif at == len(boundaries):
                boundaries.append(boundary)  # in order, the usual case: no entry after it
                return [self._entry(at, self._attribution())]
            else:
                boundaries.insert(at, boundary)
            attribution = self._attribution()
            return [self._entry(i, attribution) for i in (at, at + 1) if i < len(boundaries)]
        touched: set[int] = set()
        for boundary in found:
            key = boundary[:4]
            at = bisect.bisect_left(boundaries, key)
            present = at < len(boundaries) and boundaries[at][:4] == key
            if not present:
                boundaries.insert(at, boundary)
                touched = {i + 1 if i >= at else i for i in touched}
            touched.update((at, at + 1))
        attribution = self._attribution()
        return [self._entry(i, attribution) for i in sorted(touched) if i < len(boundaries)]

    def _apply_submitted(self, event: JobSubmitted) -> list[LedgerEntry]:
        if self.submitted is not None and self.submitted["event_id"] != event.event_id:
            raise MeteringRejected(
                f"job {self.job_id} already has JobSubmitted {self.submitted['event_id']}; "
                f"{event.event_id} conflicts with it"
            )
        self.submitted = {
            "event_id": event.event_id,
            "project": event.project,
            "user": event.user,
            "cluster": event.cluster,
            "gpu_type": event.gpu_type,
            "priority_class": event.priority_class.value,
            "interactive": event.interactive,
            "gpus": event.gpus,
        }
        # Attribution (and the GPU count of recovered starts) changes every entry of the job.
        return self.entries()

    def dispute(self, stage: int) -> list[LedgerEntry]:
        """Take the dispute stage the admin log gives; every entry again when it changed (their
        attribution and revision change with it), else none."""
        if stage == self.dispute_stage:
            return []
        self.dispute_stage = stage
        return self.entries()

    def attribution(self) -> tuple[str, str, str] | None:
        """(project, user, cluster) for the job's GPU samples, or None before its submission.
        A disputed job's usage is unattributed, its samples are not: they judge, never charge."""
        sub = self.submitted
        if sub is None:
            return None
        return (str(sub.get("project", "")), str(sub.get("user", "")), str(sub.get("cluster", "")))

    # -- queries ------------------------------------------------------------------------------
    def last_instant(self) -> int | None:
        """The latest boundary's instant once the job has finished (a finish is final: no run
        follows it), else None: a job still running or waiting is never let go of. A state with
        neither (earlier meters kept one for GPU samples alone): 0, let go of at once."""
        if self.submitted is None and not self.boundaries:
            return 0
        if not any(b[1] == FINISH for b in self.boundaries):
            return None
        return int(max(b[0] for b in self.boundaries))

    def entries(self) -> list[LedgerEntry]:
        attribution = self._attribution()
        return [self._entry(i, attribution) for i in range(len(self.boundaries))]

    def _attribution(self) -> _Attribution:
        """(project, user, cluster, gpu_type, priority_class, interactive) of every entry now."""
        sub = self.submitted
        if not sub or self.dispute_stage in WITHHELD:
            return _UNATTRIBUTED
        return (
            sub.get("project", UNATTRIBUTED),
            sub.get("user", UNATTRIBUTED),
            sub.get("cluster", UNATTRIBUTED),
            sub.get("gpu_type", UNATTRIBUTED),
            sub.get("priority_class", UNATTRIBUTED),
            bool(sub.get("interactive", False)),
        )

    def _gpus_at(self, boundary: Boundary) -> int:
        rank, gpus = boundary[1], boundary[4]
        if rank in _ENDS:
            return 0
        if gpus == _GPUS_FROM_SUBMISSION:
            return int(self.submitted["gpus"]) if self.submitted else 0
        return int(gpus)

    def _entry(self, index: int, attribution: _Attribution) -> LedgerEntry:
        boundary = self.boundaries[index]
        time, rank, _, event_id, gpus = boundary[:5]
        attributed = 1 if self.submitted else 0
        busy = BUSY_BP
        if index == 0:
            start, charged, pred_key, pred_event_id = time, 0, 0, ""
        else:
            pred = self.boundaries[index - 1]
            start, pred_event_id = pred[0], pred[3]
            pred_key = (pred[0] << 26) | (pred[1] << 24) | pred[2]
            if pred[1] in _ENDS or rank == START:
                charged = 0
            elif rank == SAMPLE:
                charged, busy = int(gpus), _utilization_of(boundary)
            else:
                # A run's end charges the GPUs in force at the last reading, at its utilisation,
                # from its own start at the earliest: when a zero-second run ended at an earlier
                # second, its start (ranked after its end there) is the predecessor, and the time
                # since belongs to no run.
                charged = self._gpus_at(pred)
                busy = _utilization_of(pred) if pred[1] == SAMPLE else BUSY_BP
                if len(boundary) > 6 and boundary[6] > start:
                    start = min(int(boundary[6]), time)
        project, user, cluster, gpu_type, priority_class, interactive = attribution
        # LedgerEntry without its frozen __init__ (schemas/ledger.py): one entry per event.
        return new_entry(
            entry_id=entry_id_for(self.job_id, event_id),
            job_id=self.job_id,
            version=(pred_key << 3) | (self.dispute_stage << 1) | attributed,
            pred_event_id=pred_event_id,
            interval_start=start,
            interval_end=time,
            gpus=charged,
            project=project,
            user=user,
            cluster=cluster,
            gpu_type=gpu_type,
            priority_class=priority_class,
            interactive=interactive,
            source_event_id=event_id,
            utilization_bp=busy if charged else BUSY_BP,
        )

    def gpu_seconds(self) -> int:
        return sum(e.gpu_seconds for e in self.entries())

    def idle_units(self) -> int:
        """Idle GPU-seconds x 10,000 over the job's entries (see `postings.idle_units`)."""
        return sum(e.gpu_seconds * (BUSY_BP - e.utilization_bp) for e in self.entries())


def _utilization_of(boundary: Boundary) -> int:
    return int(boundary[5]) if len(boundary) > 5 else BUSY_BP
