"""How a group commit fills record batches: in order, as few as fit, and never one caller's
records across two batches unless they are more than a batch holds."""

from __future__ import annotations

import asyncio

from aiokafka.producer.message_accumulator import BatchBuilder

from allmende.services.group_commit import Group, fill_batches

BATCH_BYTES = 4096


def builder() -> BatchBuilder:
    return BatchBuilder(BATCH_BYTES, 0)


def group_of(sizes: list[list[int]]) -> Group:
    loop = asyncio.new_event_loop()
    try:
        return [
            ([(f"{n}".encode(), bytes(size)) for size in records], loop.create_future())
            for n, records in enumerate(sizes)
        ]
    finally:
        loop.close()


def test_callers_fill_batches_in_order_and_none_straddles_two() -> None:
    group = group_of([[700, 300]] * 12)  # a decision and its hold, about four to a batch
    batches = fill_batches(builder, group)
    assert 3 <= len(batches) <= 4
    assert [f for _, callers in batches for f in callers] == [f for _, f in group]  # each once, in order
    assert all(batch.record_count() == 2 * len(callers) for batch, callers in batches)


def test_a_caller_that_does_not_fit_after_others_starts_the_next_batch() -> None:
    group = group_of([[1500], [1500], [900, 900]])  # the third fits only half behind the first two
    batches = fill_batches(builder, group)
    assert [len(callers) for _, callers in batches] == [2, 1]
    assert [batch.record_count() for batch, _ in batches] == [2, 2]


def test_a_caller_larger_than_a_batch_is_split_and_hears_of_every_part() -> None:
    group = group_of([[500], [1500] * 6, [500]])
    batches = fill_batches(builder, group)
    big = group[1][1]
    assert sum(batch.record_count() for batch, _ in batches) == 8
    assert sum(big in callers for _, callers in batches) >= 3  # it spans several batches
    assert batches[0][1] == [group[0][1]] and batches[-1][1][-1] is group[2][1]
