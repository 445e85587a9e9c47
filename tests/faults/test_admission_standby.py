"""A hot standby for admission (issue 23): two instances, one leading, under a steady admission
load against a nearly spent budget. `kill -9` the leader: the other answers admissions within
5 s, every decision answered before the kill is still there, no budget goes below zero and no
job is admitted twice. `kill -STOP` the leader: the other takes over, and the paused one's writes
after it wakes are refused (its producer is fenced), never recorded.

Real processes (`allmende serve --role admission`), a real broker; the log is read afterwards
as every reader reads it (committed records only).
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from allmende.testing.standby import (
    SCHEDULER_TOKEN,
    Answer,
    FailoverClient,
    Instance,
    Load,
    apply_plan,
    first_answer_after,
    instances,
    job_request,
    recorded_decisions,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="the local Kafka broker needs Java"),
]
BUDGET_HOURS = 120  # about six seconds of the load's admissions: spent after the takeover
ANSWERED_AGAIN_WITHIN_S = 5.0


def _check_log(bootstrap: str, tag: str, answered: list[Answer]) -> None:
    """What every reader of the log sees: each job admitted at most once, the holds of the
    admitted jobs within the allocation, every decision answered still there."""
    decisions = recorded_decisions(bootstrap, tag)
    admits = Counter(d.job_id for d in decisions if d.verdict == "admit")
    assert admits and max(admits.values()) == 1, admits.most_common(3)
    allocation = max(d.available_before_units for d in decisions)
    assert sum(d.expected_units for d in decisions if d.verdict == "admit") <= allocation
    assert all(d.available_after_units >= 0 for d in decisions if d.verdict == "admit")
    assert any(r.code == "over-budget" for d in decisions for r in d.reasons), "the budget was never spent"
    recorded = {d.job_id: d for d in decisions}
    for answer in answered:
        decided = recorded.get(answer.job_id)
        assert decided is not None, (
            f"{answer.job_id} was answered {answer.body['verdict']} and is not in the log"
        )
        assert (decided.verdict, decided.attempt) == (answer.body["verdict"], answer.body["attempt"])


def _asked_of(instance: Instance, job_id: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {SCHEDULER_TOKEN}"}
    return httpx.get(f"{instance.url}/v1/admission/{job_id}", headers=headers, timeout=5)


@contextmanager
def _under_load(bootstrap: str, home: Path, prefix: str) -> Iterator[tuple[str, Instance, Instance, Load]]:
    """Two instances (a leads) on topics of their own, the plan applied, the load running."""
    tag = f"standby{uuid.uuid4().hex[:8]}"
    with instances(["a", "b"], bootstrap, tag, home) as (a, b):
        apply_plan(a.url, BUDGET_HOURS)
        load = Load(FailoverClient([a, b]), prefix=prefix)
        load.start()
        try:
            yield tag, a, b, load
        finally:
            load.stop()


def test_kill_9_of_the_leader(kafka_bootstrap: str, tmp_path: Path) -> None:
    with _under_load(kafka_bootstrap, tmp_path, "kill") as (tag, a, b, load):
        time.sleep(3.0)
        killed_at = time.monotonic()
        a.proc.send_signal(signal.SIGKILL)
        time.sleep(9.0)
        answers = load.stop()

        before = [x for x in answers if x.status == 200 and x.answered_at < killed_at]
        again = first_answer_after(answers, killed_at)
        assert before and all(x.instance == "a" for x in before)
        assert again is not None and again.instance == "b"
        gap = again.answered_at - killed_at
        print(f"kill -9: admissions answered again {gap:.2f} s after the kill")
        assert gap < ANSWERED_AGAIN_WITHIN_S
        assert b.role() == "leader"
        for answer in before:  # the new leader has them, as it was told them
            found = _asked_of(b, answer.job_id)
            assert found.status_code == 200, found.text
            assert (found.json()["verdict"], found.json()["attempt"]) == (
                answer.body["verdict"],
                answer.body["attempt"],
            )
        # Nothing answered differently from what is recorded, on either side of the kill.
        _check_log(kafka_bootstrap, tag, [x for x in answers if x.status == 200])


def test_kill_stop_of_the_leader(kafka_bootstrap: str, tmp_path: Path) -> None:
    with _under_load(kafka_bootstrap, tmp_path, "stop") as (tag, a, b, load):
        time.sleep(2.0)
        paused_at = time.monotonic()
        a.proc.send_signal(signal.SIGSTOP)
        b.wait_role("leader", 30)
        # A request reaches the paused leader; it is handled when the process wakes.
        zombie: list[httpx.Response] = []

        def ask_the_paused() -> None:
            headers = {"Authorization": f"Bearer {SCHEDULER_TOKEN}"}
            zombie.append(
                httpx.post(f"{a.url}/v1/admission", json=job_request("zombie-1"), headers=headers, timeout=30)
            )

        asking = threading.Thread(target=ask_the_paused)
        asking.start()
        time.sleep(1.0)
        a.proc.send_signal(signal.SIGCONT)
        asking.join(40)
        a.wait_role("standby", 30)
        time.sleep(2.0)
        answers = load.stop()

        again = first_answer_after(answers, paused_at)
        assert again is not None and again.instance == "b"
        gap = again.answered_at - paused_at
        print(f"kill -STOP: admissions answered again {gap:.2f} s after the pause")
        assert gap < ANSWERED_AGAIN_WITHIN_S
        # The woken leader's write was refused: answered 503, and not in the log.
        assert zombie and zombie[0].status_code == 503, zombie[0].text if zombie else "no answer"
        assert zombie[0].json()["code"] in ("not-recorded", "not-leader")
        assert _asked_of(b, "zombie-1").status_code == 404
        assert all(d.job_id != "zombie-1" for d in recorded_decisions(kafka_bootstrap, tag))
        assert all(x.instance == "b" for x in answers if x.status == 200 and x.asked_at > paused_at + 1.0)
        _check_log(kafka_bootstrap, tag, [x for x in answers if x.status == 200])
