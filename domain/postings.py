"""Posting: turn entry revisions into append-only ledger rows that sum exactly.

The ledger table is append-only. For each entry it holds one `revision` row per accepted version
(the entry's state, no amount) and the `usage` rows of that version, split at UTC midnights so
that daily totals are exact. When a higher version replaces a lower one, the lower one's usage
rows are reversed (`reversal`, negative amounts) in the same batch. Summing amounts over any
grouping therefore counts each GPU-second once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from schemas.ledger import LedgerEntry

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


def day_pieces(start: int, end: int) -> list[tuple[int, int, int]]:
    """Split [start, end) at UTC midnights into (day, piece_start, piece_end)."""
    pieces = []
    cursor = start
    while cursor < end:
        day = cursor // SECONDS_PER_DAY
        stop = min(end, (day + 1) * SECONDS_PER_DAY)
        pieces.append((day, cursor, stop))
        cursor = stop
    return pieces


def _usage_rows(entry: LedgerEntry, kind: PostingKind) -> list[Posting]:
    if entry.gpus == 0:
        return []
    sign = -1 if kind is PostingKind.REVERSAL else 1
    return [
        Posting(
            posting_id=f"{entry.entry_id}:{entry.version}:{kind.name.lower()}:{day}",
            kind=kind,
            entry=entry,
            day=day,
            piece_start=lo,
            piece_end=hi,
            gpu_seconds=sign * entry.gpus * (hi - lo),
        )
        for day, lo, hi in day_pieces(entry.interval_start, entry.interval_end)
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
    incoming: Mapping[str, LedgerEntry], current: Mapping[str, LedgerEntry]
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
            rows.extend(_usage_rows(held, PostingKind.REVERSAL))
        rows.append(
            Posting(
                posting_id=f"{entry.entry_id}:{entry.version}:revision",
                kind=PostingKind.REVISION,
                entry=entry,
                day=entry.interval_end // SECONDS_PER_DAY,
                piece_start=entry.interval_start,
                piece_end=entry.interval_end,
                gpu_seconds=0,
            )
        )
        rows.extend(_usage_rows(entry, PostingKind.USAGE))
        accepted[entry_id] = entry
    return rows, accepted
