"""The preemption writer: the job events' `JobPreempted` -> ClickHouse `job_preemptions`.

The admission service keeps the preemptions of live jobs only (it lets ended ones go); this
writer keeps every one, so a project's preemptions page reads them from the store. Exactly once
in effect as the other writers (offsets beside the rows, consumer `<writer_group>-preemptions`).
Only preemptions are parsed (a byte search first: most job events are readings); a record that is
not a valid job event is the meter's to dead-letter, and is passed by here.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.schemas.events import ContractError, JobPreempted, parse_job_event
from allmende.streams.offsets_beside_data import OffsetsBesideData


def preemptions_of(records: Sequence[Any]) -> list[JobPreempted]:
    found = []
    for record in records:
        value = record.value
        if not value or b"JobPreempted" not in value:
            continue
        try:
            event = parse_job_event(value)
        except ContractError:
            continue
        if isinstance(event, JobPreempted):
            found.append(event)
    return found


class PreemptionWriter(OffsetsBesideData):
    thread_name = "preemption-writer"

    def __init__(self, settings: Settings, store: LedgerStore) -> None:
        name = f"{settings.writer_group}-preemptions"
        super().__init__(
            settings, store, settings.job_events_topic, name, lambda: nullcontext(self.write_batch)
        )

    def write_batch(self, records: Sequence[Any]) -> int:
        found = preemptions_of(records)
        if found:
            self.store.append_preemptions(found)
        self._save_offsets(records, wrote=bool(found))
        return len(found)
