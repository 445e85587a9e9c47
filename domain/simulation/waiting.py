"""One cluster's queue, in the policy's order, grouped by what each job waits for.

A pass asks queued jobs in the policy's order, skipping those the policy promised the same answer
to until enough GPUs are free (`Queue.wait_for_free_gpus`). With thousands queued, walking the
whole queue at every pass to skip them dominated long runs; here the jobs are kept in sorted
groups per promise, and a pass takes, job after job, the first one of the groups whose promise
the cluster can meet now.
"""

from __future__ import annotations

from collections.abc import Callable

from sortedcontainers import SortedList

Entry = tuple[tuple[int, ...], int, str]  # (policy key, submitted at, job id): the queue order
Promise = tuple[int, bool]  # (free GPUs it waits for, whether reclaimable GPUs count as free)
NO_PROMISE: Promise = (0, False)  # ask at every pass
_UNSET = object()


class WaitingQueue:
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._promises: dict[str, Promise] = {}
        self._groups: dict[Promise, SortedList] = {}
        self._version: object = _UNSET

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def add(self, job_id: str, entry: Entry) -> None:
        """Queue a job (again) without a promise."""
        self.remove(job_id)
        self._entries[job_id] = entry
        self._file(job_id, NO_PROMISE)

    def remove(self, job_id: str) -> None:
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            self._groups[self._promises.pop(job_id)].remove(entry)

    def promise(self, job_id: str, wait_for_free_gpus: int, reclaimable_counts: bool) -> None:
        if job_id not in self._entries:
            return
        promise = (wait_for_free_gpus, reclaimable_counts) if wait_for_free_gpus > 0 else NO_PROMISE
        if self._promises[job_id] != promise:
            self._groups[self._promises[job_id]].remove(self._entries[job_id])
            self._file(job_id, promise)

    def _file(self, job_id: str, promise: Promise) -> None:
        self._promises[job_id] = promise
        group = self._groups.get(promise)
        if group is None:
            group = self._groups[promise] = SortedList()
        group.add(self._entries[job_id])

    def rekey(self, version: object, entry_of: Callable[[str], Entry]) -> None:
        """Keys from the policy again, unless its `version` promised they stand (None: always)."""
        if version is not None and version == self._version:
            return
        self._version = version
        members: dict[Promise, list[Entry]] = {}
        for job_id, promise in self._promises.items():
            entry = self._entries[job_id] = entry_of(job_id)
            members.setdefault(promise, []).append(entry)
        # Loaded whole (sorted once), not added one by one: thousands of jobs at every new order.
        self._groups = {promise: SortedList(entries) for promise, entries in members.items()}

    def next_after(self, after: Entry | None, free: int, reclaimable: int) -> Entry | None:
        """The first job after `after` in queue order whose promise the cluster meets now (with
        `free` GPUs free and `reclaimable` held by squatters), or None. Asked again after every
        decision, so a pass never walks jobs the GPUs it just gave away no longer let in."""
        found: Entry | None = None
        for (wait, reclaim_counts), group in self._groups.items():
            if not group or wait > free + (reclaimable if reclaim_counts else 0):
                continue
            if after is None:
                first = group[0]
            else:
                first = next(group.irange(minimum=after, inclusive=(False, True)), None)
            if first is not None and (found is None or first < found):
                found = first
        return found
