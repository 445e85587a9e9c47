"""The ledger-entry record: what the meter emits on `allmende.ledger-entries` (key: job id).

One record carries the entries one meter batch produced for one job (a JSON array), so a
job's burst of samples costs one message, not one each.

An entry is the GPU time of one job between two consecutive boundaries (start, usage sample,
preemption, finish). Its id is fixed by the boundary that closes it; as late events arrive the
meter may re-emit the same entry with a larger revision key (`version`, `pred_event_id`). The
writer keeps the largest and posts the difference, so redelivery and reordering never count
anything twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

UNATTRIBUTED = ""  # attribution fields before the job's JobSubmitted is known


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    entry_id: str
    job_id: str
    version: int
    interval_start: int  # Unix seconds, inclusive
    interval_end: int  # Unix seconds, exclusive
    gpus: int
    project: str
    user: str
    cluster: str
    gpu_type: str
    priority_class: str
    interactive: bool
    source_event_id: str
    pred_event_id: str = ""  # the boundary the span starts at; breaks ties between versions
    # GPU utilisation over the span in basis points (10,000 = fully busy), from the usage sample
    # that closes it (or, for a span a run's end closes, the sample before it); 10,000 where no
    # reading exists: nobody is counted idle without evidence.
    utilization_bp: int = 10_000

    def revision_key(self) -> tuple[int, str]:
        """Later revisions of an entry have larger keys; the ledger keeps the largest."""
        return (self.version, self.pred_event_id)

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * (self.interval_end - self.interval_start)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        entry = cls(**data)
        if (
            entry.interval_end < entry.interval_start
            or entry.gpus < 0
            or entry.version < 0
            or not 0 <= entry.utilization_bp <= 10_000
        ):
            raise ValueError(f"ledger entry {entry.entry_id} is not well-formed")
        return entry


def encode_entries(entries: list[LedgerEntry]) -> bytes:
    return orjson.dumps(entries)  # orjson serialises dataclasses natively, far faster than asdict


def decode_entries(raw: bytes) -> list[LedgerEntry]:
    """Entries of one ledger-entry record; ValueError/TypeError when it is not one."""
    data = orjson.loads(raw)
    if not isinstance(data, list):
        raise ValueError("a ledger-entry record is a JSON array of entries")
    return [LedgerEntry.from_dict(item) for item in data]
