"""Events applied to the admission state but not yet acknowledged by its log, per job.

A decision is answered only once the admission log holds it: what was answered can be replayed.
If the log does not take the events (Kafka away), they stay here. Asking for the job again, or
`retry_all`, sends them again under the same event ids, so a second copy in the log is harmless.
Concurrent asks for one job share one send. Sends are queued at once (`submit`), not in a task
of their own, so the requests decided in one turn of the event loop share a group commit.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")


class NotRecorded(RuntimeError):
    """The log did not take the events; `__cause__` says why."""


class PendingRecords(Generic[E]):
    def __init__(self, submit: Callable[[Sequence[E]], asyncio.Future[None]]) -> None:
        """`submit` queues events for the log; its future is done once they are acknowledged."""
        self._submit = submit
        self._events: dict[str, list[E]] = {}
        self._sending: dict[str, asyncio.Future[None]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._events

    def __len__(self) -> int:
        return len(self._events)

    def add(self, key: str, events: list[E]) -> None:
        """Events of `key` that are in the state, to be recorded. One batch per key at a time: a
        key with events pending is answered from them, not decided again."""
        if key in self._events:
            raise ValueError(f"{key} has events pending already")
        self._events[key] = events

    async def recorded(self, key: str) -> None:
        """Return once the events of `key` pending now are recorded, sending them if no one is
        (events added later are not waited for); raise `NotRecorded` if the log did not take
        them (they stay pending)."""
        events = self._events.get(key)
        while events is not None and self._events.get(key) is events:
            sending = self._sending.get(key)
            if sending is None:
                try:
                    sending = self._submit(events)
                except Exception as exc:  # not even queued (the log is stopped)
                    raise NotRecorded(str(exc)) from exc
                self._sending[key] = sending
                sending.add_done_callback(functools.partial(self._settle, key, events))
            elif sending.done():
                # Finished, but its callback has not run yet: settle now, then look again (a
                # failed send is sent again: this is a new ask). Never wait on a finished send.
                self._settle(key, events, sending)
                continue
            try:
                # Shielded: a caller that goes away (a dropped connection) must not stop the send.
                await asyncio.shield(sending)
            except asyncio.CancelledError:
                if not sending.cancelled():
                    raise  # this caller was cancelled; the send goes on
                raise NotRecorded("the send was cancelled (the service is stopping)") from None
            except Exception as exc:
                raise NotRecorded(str(exc)) from exc
            self._settle(key, events, sending)

    async def retry_all(self) -> int:
        """Send everything pending (whether or not anyone asks); how many keys the log did not
        take (keys added meanwhile, in flight as usual, do not count)."""
        # All at once: they share group commits, and a broker that times out costs one timeout.
        outcomes = await asyncio.gather(
            *(self.recorded(key) for key in list(self._events)), return_exceptions=True
        )
        return sum(isinstance(outcome, NotRecorded) for outcome in outcomes)

    def _settle(self, key: str, events: list[E], sent: asyncio.Future[None]) -> None:
        """Bookkeeping of a finished send; idempotent (its callback and an ask may both call it)."""
        if self._sending.get(key) is sent:
            del self._sending[key]
        if not sent.cancelled() and sent.exception() is None and self._events.get(key) is events:
            del self._events[key]
