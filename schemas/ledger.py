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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

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
        # The common case, a record this module encoded: every field, nothing else.
        fast = type(data) is dict and len(data) == len(_FIELDS) and data.keys() == _FIELD_SET
        entry = new_entry(**data) if fast else cls(**data)
        if (
            entry.interval_end < entry.interval_start
            or entry.gpus < 0
            or entry.version < 0
            or not 0 <= entry.utilization_bp <= 10_000
        ):
            raise ValueError(f"ledger entry {entry.entry_id} is not well-formed")
        return entry


_FIELDS = tuple(LedgerEntry.__dataclass_fields__)
_FIELD_SET = frozenset(_FIELDS)


def _fast_constructor() -> Callable[..., LedgerEntry]:
    """`LedgerEntry(**fields)` without the frozen `__init__`'s `object.__setattr__` per field.

    Sets each slot through its descriptor: same object, same equality and hash, about half the
    cost (the meter builds one entry per event, the writer decodes each again). Keyword-only and
    every field required: callers that rely on defaults use the class itself.
    """
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": LedgerEntry}
    body = []
    for i, name in enumerate(_FIELDS):
        scope[f"_set{i}"] = LedgerEntry.__dict__[name].__set__
        body.append(f"    _set{i}(entry, {name})\n")
    head = f"def new_entry(*, {', '.join(_FIELDS)}):\n    entry = _new(_cls)\n"
    exec(f"{head}{''.join(body)}    return entry\n", scope)  # from the dataclass's own field names
    return cast(Callable[..., LedgerEntry], scope["new_entry"])


new_entry = _fast_constructor()


def encode_entries(entries: list[LedgerEntry]) -> bytes:
    return orjson.dumps(entries)  # orjson serialises dataclasses natively, far faster than asdict


def encode_retired(job_id: str, at: int) -> bytes:
    """The meter's word that a job's entries are final (`{"retired": job, "at": clock}`): it let go
    of the job's state, so no revision of them can follow on the topic. Readers may let go of what
    they keep per entry of the job (its totals stay)."""
    return orjson.dumps({"retired": job_id, "at": at})


def retired_job(raw: bytes | None) -> str | None:
    """The job a `retired` record lets go of, or None for any other record (entries are arrays)."""
    if not raw or raw[:1] != b"{":
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    job = data.get("retired") if isinstance(data, dict) else None
    return job if isinstance(job, str) and job and type(data.get("at")) is int else None


def decode_entries(raw: bytes) -> list[LedgerEntry]:
    """Entries of one ledger-entry record; ValueError/TypeError when it is not one."""
    data = orjson.loads(raw)
    if not isinstance(data, list):
        raise ValueError("a ledger-entry record is a JSON array of entries")
    return [LedgerEntry.from_dict(item) for item in data]
