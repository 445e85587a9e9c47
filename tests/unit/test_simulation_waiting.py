"""The simulator's waiting queue: the policy's order, and only jobs whose promise is met."""

from __future__ import annotations

from allmende.domain.simulation.waiting import Entry, WaitingQueue


def entry(job_id: str, rank: int, submitted: int = 0) -> Entry:
    return ((rank,), submitted, job_id)


def taken(queue: WaitingQueue, free: int, reclaimable: int = 0) -> list[str]:
    found, last = [], None
    while (last := queue.next_after(last, free, reclaimable)) is not None:
        found.append(last[2])
    return found


def queue_of(*entries: Entry) -> WaitingQueue:
    queue = WaitingQueue()
    for e in entries:
        queue.add(e[2], e)
    return queue


def test_jobs_come_in_the_policys_order_then_submission_then_id() -> None:
    queue = queue_of(entry("c", 1, 5), entry("a", 2, 0), entry("b", 1, 5), entry("d", 0, 9))
    assert taken(queue, free=0) == ["d", "b", "c", "a"]  # no promise: every job is asked


def test_a_promised_job_is_skipped_until_the_cluster_meets_its_promise() -> None:
    queue = queue_of(entry("big", 0), entry("small", 1), entry("plain", 2))
    queue.promise("big", 8, reclaimable_counts=False)
    queue.promise("small", 2, reclaimable_counts=True)
    assert taken(queue, free=1) == ["plain"]
    assert taken(queue, free=1, reclaimable=1) == ["small", "plain"]  # squatters' GPUs count for it
    assert taken(queue, free=7, reclaimable=4) == ["small", "plain"]  # not for the other
    assert taken(queue, free=8) == ["big", "small", "plain"]


def test_removed_and_requeued_jobs_and_new_keys() -> None:
    queue = queue_of(entry("a", 0), entry("b", 1))
    queue.promise("a", 4, reclaimable_counts=False)
    queue.remove("b")
    assert "b" not in queue and len(queue) == 1 and taken(queue, free=0) == []
    queue.add("a", entry("a", 0))  # queued again (preempted): without its promise
    assert taken(queue, free=0) == ["a"]
    queue.add("b", entry("b", 1))
    queue.rekey(1, lambda job_id: entry(job_id, {"a": 5, "b": 0}[job_id]))
    assert taken(queue, free=0) == ["b", "a"]
    queue.rekey(1, lambda job_id: entry(job_id, {"a": 0, "b": 5}[job_id]))  # same version: kept
    assert taken(queue, free=0) == ["b", "a"]
