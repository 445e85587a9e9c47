"""The ledger-entry record: what the meter emits on `allmende.ledger-entries` (key: job id).

An entry is the GPU time of one job between two consecutive boundaries (start, usage sample,
preemption, finish). Its id is fixed by the boundary that closes it; as late events arrive the
meter may re-emit the same entry with a higher `version`. The writer keeps the highest version
and posts the difference, so redelivery and reordering never count anything twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * (self.interval_end - self.interval_start)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> LedgerEntry:
        data: dict[str, Any] = orjson.loads(raw)
        entry = cls(**data)
        if entry.interval_end < entry.interval_start or entry.gpus < 0 or entry.version < 0:
            raise ValueError(f"ledger entry {entry.entry_id} is not well-formed")
        return entry
