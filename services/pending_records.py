"""Events applied to the admission state but not yet acknowledged by its log, per job.

A decision is answered only once the admission log holds it: what was answered can be replayed.
If the log does not take the events (Kafka away), they stay here. Asking for the job again, or
`retry_all`, sends them again under the same event ids, so a second copy in the log is harmless.
Concurrent asks for one job share one send. A send finishes its bookkeeping before it counts as
done, so no ask can find a finished send still pending and wait on it forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")


class NotRecorded(RuntimeError):
    """The log did not take the events; `__cause__` says why."""


class PendingRecords(Generic[E]):
    def __init__(self, publish: Callable[[Sequence[E]], Awaitable[None]]) -> None:
        self._publish = publish
        self._events: dict[str, list[E]] = {}
        self._sending: dict[str, asyncio.Task[None]] = {}

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
        """Return once nothing of `key` is pending, sending its events if no one is; raise
        `NotRecorded` if the log did not take them (they stay pending)."""
        while (events := self._events.get(key)) is not None:
            sending = self._sending.get(key)
            if sending is None:
                sending = asyncio.ensure_future(self._send(key, events))
                self._sending[key] = sending
            try:
                # Shielded: a caller that goes away (a dropped connection) must not stop the send.
                await asyncio.shield(sending)
            except asyncio.CancelledError:
                if not sending.cancelled():
                    raise  # this caller was cancelled; the send goes on
                raise NotRecorded("the send was cancelled (the service is stopping)") from None
            except Exception as exc:
                raise NotRecorded(str(exc)) from exc

    async def retry_all(self) -> int:
        """Send everything pending (whether or not anyone asks); how many keys are left."""
        # All at once: they share group commits, and a broker that times out costs one timeout.
        await asyncio.gather(*(self.recorded(key) for key in list(self._events)), return_exceptions=True)
        return len(self._events)

    async def _send(self, key: str, events: list[E]) -> None:
        try:
            await self._publish(events)
        finally:
            self._sending.pop(key, None)  # failed or not: the next ask may send again
        if self._events.get(key) is events:
            del self._events[key]
