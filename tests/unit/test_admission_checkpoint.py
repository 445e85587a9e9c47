"""An admission checkpoint: restored and fed the rest of the streams (and the clock), the state is
the one fed all of it: the same dump, the same answers to every read a decision makes."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from allmende.core.checkpoints import encode_body
from allmende.domain.admission_state import AdmissionState
from allmende.domain.squatting import SquatRule
from allmende.schemas.admission_events import HostRecovered, HostUnhealthy
from allmende.schemas.events import JobSubmitted, JobUsageSample
from tests.unit.test_admission_state import DEADLINE, T, decided, finished, hold, preempted, released, started

R = 900  # retention
SQUAT = SquatRule.of(0.05, 300)


def _stream(seed: int, n: int = 400) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    jobs = [f"j{i}" for i in range(40)]
    ops: list[tuple[str, Any]] = []
    now = T
    for step in range(n):
        job, at = rng.choice(jobs), T + step * 20
        now = max(now, at + rng.randrange(0, DEADLINE))
        partition = hash(job) % 3
        roll = rng.randrange(12)
        if roll == 0:
            verdict = rng.choice(("admit", "admit", "queue", "reject"))
            lane = rng.choice(("budget", "opportunistic", "time-slice")) if verdict == "admit" else None
            ops.append(("apply", decided(job, at=at, gpus=rng.choice((1, 4, 8)),
                                         cluster=rng.choice(("c1", "c2"))).model_copy(
                update={"verdict": verdict, "lane": lane})))  # fmt: skip
        elif roll == 1:
            ops.append(("apply", hold(job, ("a", rng.randrange(1, 200)), ("b", rng.randrange(1, 200)))))
        elif roll == 2:
            ops.append(("apply", released(job)))
        elif roll == 3:
            ops.append(("observe", (started(job, at), partition)))
        elif roll == 4:
            ops.append(("observe", (preempted(job, at), partition)))
        elif roll == 5:
            ops.append(("observe", (finished(job, at), partition)))
        elif roll == 6:
            ops.append(("observe", (JobUsageSample(
                event_id=f"{job}:u{at}", occurred_at=at, producer="t", job_id=job, gpus_in_use=4,
                gpu_utilization=rng.choice((0.0, 0.9))), partition)))  # fmt: skip
        elif roll == 7:
            ops.append(("observe", (JobSubmitted(
                event_id=f"{job}:sub", occurred_at=at, producer="t", job_id=job, project="p", user="ada",
                cluster="c1", gpu_type="H100", gpus=2, priority_class="standard", requested_seconds=600,
            ), partition)))  # fmt: skip
        elif roll == 8:
            host = rng.choice(("h1", "h2"))
            common = {"event_id": f"host:{host}:{at}", "occurred_at": at, "actor": "sched", "cluster": "c1",
                      "host": host}  # fmt: skip
            report = HostUnhealthy(**common, reason="x") if rng.random() < 0.5 else HostRecovered(**common)
            ops.append(("apply", report))
        elif roll == 9:
            ops.append(("retire", now))
        elif roll == 10:
            ops.append(("releasable", now))
        else:
            ops.append(("load", now))
    return ops


def _feed(state: AdmissionState, ops: list[tuple[str, Any]]) -> list[object]:
    """Every op; what each read answered."""
    answers: list[object] = []
    for kind, arg in ops:
        if kind == "apply":
            answers.append(state.apply(arg))
        elif kind == "observe":
            answers.append(state.observe(*arg))
        elif kind == "retire":
            answers.append(state.retire(arg, DEADLINE))
        elif kind == "releasable":
            answers.append(state.releasable(arg, DEADLINE))
        else:
            answers.append(_reads(state, arg))
    return answers


def _reads(state: AdmissionState, now: int) -> tuple[object, ...]:
    loads = {c: state.load_on(c, now, DEADLINE) for c in ("c1", "c2")}
    return (
        {
            c: (load.used_gpus, load.squatting_gpus, sorted(j.job_id for j in load.jobs))
            for c, load in loads.items()
        },
        state.held({"j1": 50, "j2": 500}),
        state.unhealthy_hosts("c1"),
    )


@pytest.mark.parametrize("seed", range(16))
def test_a_checkpoint_taken_anywhere_and_the_rest_give_the_state_of_the_whole(seed: int) -> None:
    ops = _stream(seed)
    cut = random.Random(seed + 1000).randrange(len(ops))
    whole = AdmissionState(retention_s=R, squat=SQUAT)
    answers = _feed(whole, ops)

    before = AdmissionState(retention_s=R, squat=SQUAT)
    _feed(before, ops[:cut])
    stored = encode_body(before.dump())  # what the checkpoint file holds
    restored = AdmissionState.restore(orjson.loads(stored), retention_s=R, squat=SQUAT)
    assert restored.dump() == before.dump()
    assert _feed(restored, ops[cut:]) == answers[cut:]
    assert restored.dump() == whole.dump()


def test_a_checkpoint_with_a_float_where_an_integer_belongs_or_a_broken_heap_is_refused() -> None:
    state = AdmissionState(retention_s=R)
    for event in (decided("a", at=T), decided("b", at=T + 5)):
        state.apply(event)
    data = state.dump()
    data["start_deadlines"] = list(reversed(data["start_deadlines"]))
    with pytest.raises(ValueError, match="heap order"):
        AdmissionState.restore(data, retention_s=R)
    data = state.dump()
    data["retire_at"][0][0] = 1.5
    with pytest.raises(ValueError, match="integer"):
        AdmissionState.restore(data, retention_s=R)
