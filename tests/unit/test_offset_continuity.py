"""The meter's guard against records its consumer skipped (streams/offset_continuity.py)."""

from __future__ import annotations

from allmende.streams.offset_continuity import RESEEK_AFTER_S, OffsetContinuity


def test_records_in_order_are_all_metered() -> None:
    guard: OffsetContinuity[str] = OffsetContinuity()
    kept, gaps = guard.admit([("p0", 5), ("p1", 0), ("p0", 6), ("p1", 1), ("p0", 7)])
    assert kept == [True] * 5 and gaps == {}
    assert guard.expected == {"p0": 8, "p1": 2}


def test_a_jump_past_skipped_records_is_held_back_and_sought_to_the_first_missing() -> None:
    guard: OffsetContinuity[str] = OffsetContinuity()
    guard.admit([("p0", 160), ("p1", 10)])
    kept, gaps = guard.admit([("p0", 161), ("p0", 447), ("p1", 11), ("p0", 448), ("p0", 162)])
    # 447 is past 162..446: neither it nor anything after it on p0 is metered before the seek
    assert kept == [True, False, True, False, False]
    assert gaps == {"p0": 162}
    assert guard.expected == {"p0": 162, "p1": 12}
    # after the seek the partition's records come again from 162, in order
    kept, gaps = guard.admit([("p0", 162), ("p0", 163)])
    assert kept == [True, True] and gaps == {}


def test_a_redelivery_from_an_earlier_offset_is_metered_again() -> None:
    guard: OffsetContinuity[str] = OffsetContinuity()
    guard.admit([("p0", 100), ("p0", 101)])
    kept, gaps = guard.admit([("p0", 90), ("p0", 91)])  # a rebalance sought back to the commit
    assert kept == [True, True] and gaps == {}
    assert guard.expected["p0"] == 92


def test_a_new_assignment_starts_each_partition_where_its_first_record_is() -> None:
    guard: OffsetContinuity[str] = OffsetContinuity()
    guard.admit([("p0", 100)])
    guard.forget()  # the partition went to another worker, which committed up to 500
    kept, gaps = guard.admit([("p0", 500)])
    assert kept == [True] and gaps == {}


def test_a_gap_is_sought_once_while_the_records_fetched_before_the_seek_still_arrive() -> None:
    guard: OffsetContinuity[str] = OffsetContinuity()
    guard.admit([("p0", 160)])
    _, gaps = guard.admit([("p0", 447)])
    assert guard.to_seek(gaps, now=100.0) == {"p0": 161}
    _, again = guard.admit([("p0", 448)])  # fetched before the seek
    assert again == {"p0": 161} and guard.to_seek(again, now=102.0) == {}
    assert guard.to_seek(again, now=100.0 + RESEEK_AFTER_S) == {"p0": 161}  # nothing came: again
    guard.seek_failed("p0")
    assert guard.to_seek(again, now=106.0) == {"p0": 161}  # a failed seek is tried at once
    guard.forget()
    assert guard.sought == {} and guard.expected == {}
