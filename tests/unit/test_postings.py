"""Posting entry revisions as append-only rows whose signed amounts always sum exactly."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.postings import Posting, PostingKind, day_pieces, newest_per_entry, post
from allmende.schemas.ledger import LedgerEntry
from tests.unit.builders import entry

DAY = 24 * 60 * 60
D = 19_700  # an arbitrary day number (2023-12-09); midnight at D * DAY
MIDNIGHT = D * DAY
PROPERTY = settings(max_examples=300, deadline=None, database=None)


def _is_utc_midnight(instant: int) -> bool:
    moment = datetime.fromtimestamp(instant, UTC)
    return (moment.hour, moment.minute, moment.second) == (0, 0, 0)


# -- day_pieces ---------------------------------------------------------------------------------

DAY_PIECES = [
    (
        "a span inside one day is a single piece",
        MIDNIGHT + 10,
        MIDNIGHT + 100,
        [(D, MIDNIGHT + 10, MIDNIGHT + 100)],
    ),
    (
        "a span ending exactly at midnight stays in the day before",
        MIDNIGHT - 100,
        MIDNIGHT,
        [(D - 1, MIDNIGHT - 100, MIDNIGHT)],
    ),
    (
        "a span starting exactly at midnight belongs to the new day",
        MIDNIGHT,
        MIDNIGHT + 5,
        [(D, MIDNIGHT, MIDNIGHT + 5)],
    ),
    (
        "a span crossing one midnight is cut exactly there",
        MIDNIGHT - 30,
        MIDNIGHT + 70,
        [(D - 1, MIDNIGHT - 30, MIDNIGHT), (D, MIDNIGHT, MIDNIGHT + 70)],
    ),
    (
        "a one-second span just before midnight is one piece",
        MIDNIGHT - 1,
        MIDNIGHT,
        [(D - 1, MIDNIGHT - 1, MIDNIGHT)],
    ),
    (
        "a span covering a whole day between two partial days is three pieces",
        MIDNIGHT - 1,
        MIDNIGHT + DAY + 1,
        [
            (D - 1, MIDNIGHT - 1, MIDNIGHT),
            (D, MIDNIGHT, MIDNIGHT + DAY),
            (D + 1, MIDNIGHT + DAY, MIDNIGHT + DAY + 1),
        ],
    ),
    (
        "a span of exactly one calendar day is one piece",
        MIDNIGHT,
        MIDNIGHT + DAY,
        [(D, MIDNIGHT, MIDNIGHT + DAY)],
    ),
    ("an empty span has no pieces", MIDNIGHT + 42, MIDNIGHT + 42, []),
]


@pytest.mark.parametrize(
    ("start", "end", "expected"), [c[1:] for c in DAY_PIECES], ids=[c[0] for c in DAY_PIECES]
)
def test_day_pieces_split_at_utc_midnight(start: int, end: int, expected: list[tuple[int, int, int]]) -> None:
    assert day_pieces(start, end) == expected


def test_the_chosen_day_really_starts_at_a_utc_midnight() -> None:
    assert _is_utc_midnight(MIDNIGHT)
    assert datetime.fromtimestamp(MIDNIGHT, UTC).date() == datetime(2023, 12, 9, tzinfo=UTC).date()


@PROPERTY
@given(start=st.integers(1_000_000_000, 2_000_000_000), length=st.integers(0, 10 * DAY))
def test_day_pieces_tile_the_span_and_only_cut_at_midnights(start: int, length: int) -> None:
    end = start + length
    pieces = day_pieces(start, end)
    assert sum(hi - lo for _, lo, hi in pieces) == length
    if length:
        assert pieces[0][1] == start and pieces[-1][2] == end
    for (_, _, hi), (_, lo, _) in pairwise(pieces):
        assert hi == lo and _is_utc_midnight(hi)
    for day, lo, hi in pieces:
        assert lo < hi
        assert datetime.fromtimestamp(lo, UTC).date() == datetime.fromtimestamp(hi - 1, UTC).date()
        assert day == (datetime.fromtimestamp(lo, UTC).date() - datetime(1970, 1, 1).date()).days
    days = [day for day, *_ in pieces]
    assert days == list(range(days[0], days[0] + len(days))) if days else length == 0


# -- post ---------------------------------------------------------------------------------------


def _signed_sum(rows: list[Posting]) -> int:
    return sum(row.gpu_seconds for row in rows)


def _kinds(rows: list[Posting]) -> list[PostingKind]:
    return [row.kind for row in rows]


def test_a_new_entry_posts_a_revision_row_and_one_usage_row_per_day() -> None:
    new = entry(version=3, start=MIDNIGHT - 600, end=MIDNIGHT + 300, gpus=4)
    rows, accepted = post({new.entry_id: new}, {})
    assert _kinds(rows) == [PostingKind.REVISION, PostingKind.USAGE, PostingKind.USAGE]
    revision, before, after = rows
    assert revision.gpu_seconds == 0 and revision.entry == new
    assert (before.day, before.piece_start, before.piece_end, before.gpu_seconds) == (
        D - 1, MIDNIGHT - 600, MIDNIGHT, 4 * 600)  # fmt: skip
    assert (after.day, after.piece_start, after.piece_end, after.gpu_seconds) == (
        D,
        MIDNIGHT,
        MIDNIGHT + 300,
        4 * 300,
    )
    assert all(row.entry == new for row in rows)
    assert _signed_sum(rows) == 4 * 900
    assert accepted == {new.entry_id: new}


def test_a_higher_version_reverses_the_old_rows_and_posts_the_new_ones() -> None:
    old = entry(version=2, start=MIDNIGHT - 100, end=MIDNIGHT + 100, gpus=2)
    new = entry(version=5, start=MIDNIGHT + 50, end=MIDNIGHT + 100, gpus=3)
    first, _ = post({old.entry_id: old}, {})
    rows, accepted = post({new.entry_id: new}, {old.entry_id: old})

    reversals = [r for r in rows if r.kind is PostingKind.REVERSAL]
    old_usage = [r for r in first if r.kind is PostingKind.USAGE]
    assert [(r.day, r.piece_start, r.piece_end, -r.gpu_seconds) for r in reversals] == [
        (r.day, r.piece_start, r.piece_end, r.gpu_seconds) for r in old_usage
    ]
    assert all(r.entry == old for r in reversals)
    assert Counter(_kinds(rows)) == {PostingKind.REVERSAL: 2, PostingKind.REVISION: 1, PostingKind.USAGE: 1}
    assert _signed_sum(rows) == 3 * 50 - 2 * 200
    assert _signed_sum(first + rows) == new.gpu_seconds == 150
    assert accepted == {new.entry_id: new}


def test_reversals_make_each_day_total_exact_after_an_entry_moves_across_midnight() -> None:
    old = entry(version=1, start=MIDNIGHT - 300, end=MIDNIGHT + 300, gpus=1)
    new = entry(version=2, start=MIDNIGHT + 100, end=MIDNIGHT + 300, gpus=1)
    first, _ = post({old.entry_id: old}, {})
    second, _ = post({new.entry_id: new}, {old.entry_id: old})
    per_day = Counter[int]()
    for row in first + second:
        per_day[row.day] += row.gpu_seconds
    assert per_day[D - 1] == 0
    assert per_day[D] == 200


STALE = [("the same version posts nothing", 4), ("a lower version posts nothing", 3)]


@pytest.mark.parametrize("version", [c[1] for c in STALE], ids=[c[0] for c in STALE])
def test_a_version_not_above_the_current_one_posts_nothing(version: int) -> None:
    held = entry(version=4, start=MIDNIGHT, end=MIDNIGHT + 10, gpus=1)
    incoming = entry(version=version, start=MIDNIGHT, end=MIDNIGHT + 99, gpus=7)
    rows, accepted = post({incoming.entry_id: incoming}, {held.entry_id: held})
    assert rows == []
    assert accepted == {}


ZERO = [
    ("an entry with zero GPUs posts only its revision row", 0, 500),
    ("an entry with an empty span posts only its revision row", 8, 0),
]


@pytest.mark.parametrize(("gpus", "length"), [c[1:] for c in ZERO], ids=[c[0] for c in ZERO])
def test_an_entry_worth_nothing_posts_only_a_revision(gpus: int, length: int) -> None:
    nothing = entry(version=1, start=MIDNIGHT - 100, end=MIDNIGHT - 100 + length, gpus=gpus)
    rows, accepted = post({nothing.entry_id: nothing}, {})
    assert _kinds(rows) == [PostingKind.REVISION]
    assert rows[0].gpu_seconds == 0
    assert accepted == {nothing.entry_id: nothing}


def test_replacing_a_zero_gpu_entry_reverses_nothing() -> None:
    idle = entry(version=1, start=MIDNIGHT, end=MIDNIGHT + 100, gpus=0)
    busy = entry(version=2, start=MIDNIGHT, end=MIDNIGHT + 100, gpus=2)
    rows, _ = post({busy.entry_id: busy}, {idle.entry_id: idle})
    assert _kinds(rows) == [PostingKind.REVISION, PostingKind.USAGE]
    assert _signed_sum(rows) == 200


def test_replacing_an_entry_by_a_zero_gpu_one_cancels_its_usage() -> None:
    busy = entry(version=1, start=MIDNIGHT, end=MIDNIGHT + 100, gpus=2)
    idle = entry(version=2, start=MIDNIGHT, end=MIDNIGHT + 100, gpus=0)
    first, _ = post({busy.entry_id: busy}, {})
    rows, _ = post({idle.entry_id: idle}, {busy.entry_id: busy})
    assert _kinds(rows) == [PostingKind.REVERSAL, PostingKind.REVISION]
    assert _signed_sum(first + rows) == 0


def test_a_batch_posts_each_entry_against_its_own_current_version() -> None:
    a_old = entry(entry_id="a", version=1, start=MIDNIGHT, end=MIDNIGHT + 10, gpus=1)
    a_new = entry(entry_id="a", version=2, start=MIDNIGHT, end=MIDNIGHT + 20, gpus=1)
    b_new = entry(entry_id="b", version=1, start=MIDNIGHT, end=MIDNIGHT + 30, gpus=2)
    c_stale = entry(entry_id="c", version=1, start=MIDNIGHT, end=MIDNIGHT + 40, gpus=3)
    c_held = entry(entry_id="c", version=9, start=MIDNIGHT, end=MIDNIGHT + 5, gpus=3)
    rows, accepted = post({"a": a_new, "b": b_new, "c": c_stale}, {"a": a_old, "c": c_held})
    assert accepted == {"a": a_new, "b": b_new}
    assert {row.entry.entry_id for row in rows} == {"a", "b"}
    assert _signed_sum(rows) == (20 - 10) * 1 + 30 * 2


def test_posting_ids_are_unique_within_a_batch_and_the_same_on_every_run() -> None:
    old = entry(version=1, start=MIDNIGHT - 2 * DAY, end=MIDNIGHT + 7, gpus=1)
    new = entry(version=2, start=MIDNIGHT - 2 * DAY + 1, end=MIDNIGHT + 7, gpus=1)
    runs = [post({new.entry_id: new}, {old.entry_id: old})[0] for _ in range(2)]
    ids = [row.posting_id for row in runs[0]]
    assert len(ids) == len(set(ids)) == 1 + 3 + 3
    assert ids == [row.posting_id for row in runs[1]]


def test_posting_ids_differ_between_entries_and_between_versions() -> None:
    a1 = entry(entry_id="a", version=1, start=MIDNIGHT, end=MIDNIGHT + 9, gpus=1)
    a2 = entry(entry_id="a", version=2, start=MIDNIGHT, end=MIDNIGHT + 9, gpus=1)
    b1 = entry(entry_id="b", version=1, start=MIDNIGHT, end=MIDNIGHT + 9, gpus=1)
    ids = [r.posting_id for e in (a1, a2, b1) for r in post({e.entry_id: e}, {})[0]]
    assert len(ids) == len(set(ids)) == 6


NEWEST = [
    ("a single version is kept", [("a", 1)], {"a": 1}),
    ("the highest version wins whatever the order", [("a", 3), ("a", 7), ("a", 5)], {"a": 7}),
    ("entries are collapsed independently", [("a", 1), ("b", 4), ("a", 2), ("b", 3)], {"a": 2, "b": 4}),
    ("nothing in, nothing out", [], {}),
]


@pytest.mark.parametrize(("versions", "expected"), [c[1:] for c in NEWEST], ids=[c[0] for c in NEWEST])
def test_newest_per_entry_keeps_the_highest_version(
    versions: list[tuple[str, int]], expected: dict[str, int]
) -> None:
    batch = [entry(entry_id=i, version=v, start=MIDNIGHT, end=MIDNIGHT + v, gpus=1) for i, v in versions]
    newest = newest_per_entry(batch)
    assert {i: e.version for i, e in newest.items()} == expected
    assert all(e.interval_end - e.interval_start == e.version for e in newest.values())


# -- properties ---------------------------------------------------------------------------------


@st.composite
def _revisions(draw: st.DrawFn) -> list[LedgerEntry]:
    """Versions of one entry in some delivery order; one content per version, with repeats."""
    versions = draw(st.lists(st.integers(0, 2**60), min_size=1, max_size=8, unique=True))
    content = {
        v: entry(
            version=v,
            start=(start := draw(st.integers(MIDNIGHT - 3 * DAY, MIDNIGHT + DAY))),
            end=start + draw(st.integers(0, 3 * DAY)),
            gpus=draw(st.integers(0, 16)),
        )
        for v in versions
    }
    order = draw(st.lists(st.sampled_from(versions), min_size=len(versions), max_size=3 * len(versions)))
    return [content[v] for v in order]


@PROPERTY
@given(deliveries=_revisions(), batch_size=st.integers(1, 4))
def test_any_sequence_of_versions_leaves_the_signed_sum_equal_to_the_newest(
    deliveries: list[LedgerEntry], batch_size: int
) -> None:
    current: dict[str, LedgerEntry] = {}
    rows: list[Posting] = []
    for at in range(0, len(deliveries), batch_size):
        batch_rows, accepted = post(newest_per_entry(deliveries[at : at + batch_size]), current)
        rows.extend(batch_rows)
        current.update(accepted)
    newest = max(deliveries, key=lambda e: e.version)
    assert current == {newest.entry_id: newest}
    assert _signed_sum(rows) == newest.gpu_seconds
    ids = [row.posting_id for row in rows]
    assert len(ids) == len(set(ids))
    per_day = Counter[int]()
    for row in rows:
        per_day[row.day] += row.gpu_seconds
    expected_per_day = Counter[int]()
    for day, lo, hi in day_pieces(newest.interval_start, newest.interval_end):
        expected_per_day[day] += newest.gpus * (hi - lo)
    assert {d: s for d, s in per_day.items() if s} == {d: s for d, s in expected_per_day.items() if s}


@PROPERTY
@given(deliveries=_revisions())
def test_posting_a_delivery_twice_changes_nothing(deliveries: list[LedgerEntry]) -> None:
    current: dict[str, LedgerEntry] = {}
    for delivered in deliveries:
        _, accepted = post({delivered.entry_id: delivered}, current)
        current.update(accepted)
        again, accepted_again = post({delivered.entry_id: delivered}, current)
        assert again == [] and accepted_again == {}
