"""Posting: turn entry revisions into append-only ledger rows that sum exactly.

The ledger table is append-only. For each entry it holds one `revision` row per accepted version
(the entry's state, no amount) and the `usage` rows of that version, split at UTC midnights so
that daily totals are exact. When a higher version replaces a lower one, the lower one's usage
rows are reversed (`reversal`, negative amounts) in the same batch. Summing amounts over any
grouping therefore counts each GPU-second once.

Every usage row also carries its charge: the GPU-seconds priced by the policy in force (usage rows
are cut at policy changes as well as at midnights, so one row has one rate). A reversal is the
exact negative of the rows it reverses: it is priced by the same timeline, and the timeline never
changes behind charged usage (policies only take effect where nothing is charged yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from allmende.domain.charging import ChargedSpan, PolicyTimeline, flat_policy
from allmende.domain.squatting import FULL_BP
from allmende.schemas.ledger import UNATTRIBUTED, LedgerEntry

SECONDS_PER_DAY = 86_400


class PostingKind(IntEnum):
    REVISION = 0
    USAGE = 1
    REVERSAL = 2


@dataclass(frozen=True, slots=True)
class Posting:
    posting_id: str
    kind: PostingKind
    entry: LedgerEntry  # the version this row belongs to (reversals: the version reversed)
    day: int  # days since the Unix epoch (UTC)
    piece_start: int
    piece_end: int
    gpu_seconds: int  # signed
    rate: int = 0  # charge units per GPU-second under `policy_id`
    charge_units: int = 0  # signed, = gpu_seconds * rate
    policy_id: str = ""
    utilization_bp: int = FULL_BP  # of the entry: what its usage sample read
    idle_units: int = 0  # signed, = gpu_seconds * (10,000 - utilization_bp): idle GPU-seconds x 10^4


def idle_units(gpu_seconds: int, utilization_bp: int) -> int:
    """Idle GPU-seconds in units of 1/10,000: GPU-seconds x (1 - utilisation), exact for any piece
    because the utilisation is an integer in basis points (a float share would not sum exactly)."""
    return gpu_seconds * (FULL_BP - utilization_bp)


def pieces(start: int, end: int, size: int) -> list[tuple[int, int, int]]:
    """Split [start, end) at multiples of `size` seconds into (index, piece_start, piece_end)."""
    found = []
    cursor = start
    while cursor < end:
        index = cursor // size
        stop = min(end, (index + 1) * size)
        found.append((index, cursor, stop))
        cursor = stop
    return found


def day_pieces(start: int, end: int) -> list[tuple[int, int, int]]:
    """Split [start, end) at UTC midnights into (day, piece_start, piece_end)."""
    return pieces(start, end, SECONDS_PER_DAY)


_FLAT = PolicyTimeline([flat_policy()])


def priced_pieces(
    entry: LedgerEntry, timeline: PolicyTimeline, size: int = SECONDS_PER_DAY
) -> list[tuple[int, ChargedSpan]]:
    """The entry's GPU time cut at multiples of `size` and at policy changes, each piece priced."""
    # Until its JobSubmitted is known an entry has no class; it is re-posted attributed later.
    priority_class = entry.priority_class if entry.priority_class != UNATTRIBUTED else "standard"
    return [
        (index, span)
        for index, lo, hi in pieces(entry.interval_start, entry.interval_end, size)
        for span in timeline.charge(lo, hi, entry.gpus, entry.gpu_type, priority_class, entry.interactive)
    ]


def _usage_rows(entry: LedgerEntry, kind: PostingKind, timeline: PolicyTimeline) -> list[Posting]:
    if entry.gpus == 0:
        return []
    sign = -1 if kind is PostingKind.REVERSAL else 1
    return [
        Posting(
            posting_id=f"{entry.entry_id}:{entry.version}:{kind.name.lower()}:{span.start}",
            kind=kind,
            entry=entry,
            day=day,
            piece_start=span.start,
            piece_end=span.end,
            gpu_seconds=sign * span.gpu_seconds,
            rate=span.charge_units // span.gpu_seconds if span.gpu_seconds else 0,
            charge_units=sign * span.charge_units,
            policy_id=span.policy_id,
            utilization_bp=entry.utilization_bp,
            idle_units=sign * idle_units(span.gpu_seconds, entry.utilization_bp),
        )
        for day, span in priced_pieces(entry, timeline)
    ]


def newest_per_entry(entries: Iterable[LedgerEntry]) -> dict[str, LedgerEntry]:
    """Collapse a batch: only the highest version of each entry needs posting."""
    newest: dict[str, LedgerEntry] = {}
    for entry in entries:
        held = newest.get(entry.entry_id)
        if held is None or entry.revision_key() > held.revision_key():
            newest[entry.entry_id] = entry
    return newest


def post(
    incoming: Mapping[str, LedgerEntry],
    current: Mapping[str, LedgerEntry],
    timeline: PolicyTimeline = _FLAT,
) -> tuple[list[Posting], dict[str, LedgerEntry]]:
    """Rows to append for `incoming` given the `current` version of each entry.

    Returns the rows and the entries that became current. Stale or repeated versions post
    nothing: that is what makes redelivery harmless.
    """
    rows: list[Posting] = []
    accepted: dict[str, LedgerEntry] = {}
    for entry_id, entry in incoming.items():
        held = current.get(entry_id)
        if held is not None and held.revision_key() >= entry.revision_key():
            continue
        if held is not None:
            rows.extend(_usage_rows(held, PostingKind.REVERSAL, timeline))
        rows.append(
            Posting(
                posting_id=f"{entry.entry_id}:{entry.version}:revision",
                kind=PostingKind.REVISION,
                entry=entry,
                day=entry.interval_end // SECONDS_PER_DAY,
                piece_start=entry.interval_start,
                piece_end=entry.interval_end,
                gpu_seconds=0,
                # The entry as it was posted: a reversal read back from the ledger needs it whole.
                utilization_bp=entry.utilization_bp,
            )
        )
        rows.extend(_usage_rows(entry, PostingKind.USAGE, timeline))
        accepted[entry_id] = entry
    return rows, accepted
