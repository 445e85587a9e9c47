"""Events recorded once the log takes them: one send per key however many ask, a failure kept for
the next ask, and no ask left waiting on a send that has finished."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest

from allmende.services.pending_records import NotRecorded, PendingRecords


class Log:
    """The admission log as the records see it: each send is acknowledged when the test says."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.answers: list[asyncio.Future[None]] = []

    def submit(self, events: Sequence[str]) -> asyncio.Future[None]:
        self.sent.append(list(events))
        answer = asyncio.get_running_loop().create_future()
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen by someone
        self.answers.append(answer)
        return answer

    async def sends(self, count: int) -> None:
        while len(self.answers) < count:
            await asyncio.sleep(0)


def pending_on(log: Log, **events: list[str]) -> PendingRecords[str]:
    pending: PendingRecords[str] = PendingRecords(log.submit)
    for key, batch in events.items():
        pending.add(key, batch)
    return pending


async def acknowledged_ask(log: Log, pending: PendingRecords[str]) -> asyncio.Future[None]:
    """An ask for "job" whose send the log has just acknowledged; the ask has not resumed yet."""
    ask = asyncio.ensure_future(pending.recorded("job"))
    await log.sends(len(log.answers) + 1)
    log.answers[-1].set_result(None)
    return ask


def run(scenario: Coroutine[Any, Any, None]) -> None:
    """Run it; a hang fails after 5 s, even one that spins without yielding to the event loop."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the scenario hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        asyncio.run(scenario)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def scenario(test: Callable[[Log], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A test run as one scenario on a fresh log, under `run`'s watch for hangs."""

    def test_case() -> None:
        run(test(Log()))

    test_case.__name__, test_case.__doc__ = test.__name__, test.__doc__
    return test_case


@scenario
async def test_concurrent_asks_share_one_send_and_return_once_it_is_acknowledged(log: Log) -> None:
    pending = pending_on(log, job=["decision", "hold"])
    asks = [asyncio.ensure_future(pending.recorded("job")) for _ in range(5)]
    await log.sends(1)
    await asyncio.sleep(0)
    assert not any(a.done() for a in asks) and "job" in pending
    log.answers[0].set_result(None)
    await asyncio.gather(*asks)
    assert log.sent == [["decision", "hold"]] and "job" not in pending and len(pending) == 0


@scenario
async def test_a_send_the_log_refused_fails_every_ask_and_the_next_ask_sends_again(log: Log) -> None:
    pending = pending_on(log, job=["decision"])
    asks = [asyncio.ensure_future(pending.recorded("job")) for _ in range(3)]
    await log.sends(1)
    log.answers[0].set_exception(ConnectionError("broker away"))
    outcomes = await asyncio.gather(*asks, return_exceptions=True)
    assert all(isinstance(o, NotRecorded) and isinstance(o.__cause__, ConnectionError) for o in outcomes)
    assert "job" in pending  # kept: the state has it
    again = asyncio.ensure_future(pending.recorded("job"))
    await log.sends(2)
    log.answers[1].set_result(None)
    await again
    assert log.sent == [["decision"], ["decision"]] and "job" not in pending


@scenario
async def test_asks_that_come_just_as_a_send_finishes_do_not_wait_forever(log: Log) -> None:
    pending = pending_on(log, job=["decision"])
    first = await acknowledged_ask(log, pending)
    # The periodic retry and other asks land in the turns right after the acknowledgement.
    late = []
    for _ in range(5):
        late.append(asyncio.ensure_future(pending.retry_all()))
        late.append(asyncio.ensure_future(pending.recorded("job")))
        await asyncio.sleep(0)
    await asyncio.gather(first, *late)
    assert log.sent == [["decision"]]


@scenario
async def test_a_caller_that_goes_away_does_not_stop_the_send(log: Log) -> None:
    pending = pending_on(log, job=["decision"])
    gone, stays = (asyncio.ensure_future(pending.recorded("job")) for _ in range(2))
    await log.sends(1)
    gone.cancel()
    await asyncio.sleep(0)
    log.answers[0].set_result(None)
    await stays
    assert gone.cancelled() and "job" not in pending


@scenario
async def test_retry_all_sends_every_key_and_counts_what_the_log_did_not_take(log: Log) -> None:
    pending = pending_on(log, a=["a"], b=["b"], c=["c"])
    retry = asyncio.ensure_future(pending.retry_all())
    await log.sends(3)
    for answer, ok in zip(log.answers, (True, False, True), strict=True):
        answer.set_result(None) if ok else answer.set_exception(TimeoutError())
    assert await retry == 1 and "b" in pending and sorted(e for s in log.sent for e in s) == ["a", "b", "c"]


def test_one_batch_per_key_at_a_time() -> None:
    pending = pending_on(Log(), job=["decision"])
    with pytest.raises(ValueError, match="pending already"):
        pending.add("job", ["another"])


def test_a_log_that_takes_nothing_fails_the_ask_and_keeps_the_events() -> None:
    def stopped(events: Sequence[str]) -> asyncio.Future[None]:
        raise RuntimeError("the group commit has not started")

    async def scenario() -> None:
        pending: PendingRecords[str] = PendingRecords(stopped)
        pending.add("job", ["decision"])
        with pytest.raises(NotRecorded, match="not started"):
            await pending.recorded("job")
        assert "job" in pending and await pending.retry_all() == 1

    run(scenario())


@scenario
async def test_an_ask_waits_for_its_own_events_not_for_those_decided_after_them(log: Log) -> None:
    pending = pending_on(log, job=["queued, attempt 1"])
    first = await acknowledged_ask(log, pending)
    await asyncio.sleep(0)  # recorded; the ask has not resumed yet
    pending.add("job", ["attempt 2"])  # the job asked again meanwhile
    await first
    assert log.sent == [["queued, attempt 1"]] and "job" in pending
