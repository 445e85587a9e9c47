"""Field behaviours: seeded, stable per job and per user, in the configured shares."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace as dataclass_replace

import pytest

from allmende.domain.simulation.behaviours import (
    NO_BEHAVIOURS,
    Behaviours,
    inflates,
    parks_placeholders,
    workload,
)
from allmende.domain.traces import TraceJob
from allmende.schemas.events import FinishStatus, PriorityClass

T0 = 1_700_000_000
P, S, N = PriorityClass.PREEMPTIBLE, PriorityClass.STANDARD, PriorityClass.NON_PREEMPTIBLE


def trace_job(i: int, user: str | None = None, gpus: int = 1, seconds: int = 3600) -> TraceJob:
    return TraceJob(
        job_id=f"t-{i}", project=f"proj{i % 5}", user=user or f"user{i}", cluster="c1", gpu_type="H100",
        gpus=gpus, submit_at=T0 + 60 * i, start_at=T0 + 60 * i, duration_s=seconds,
        status=FinishStatus.SUCCEEDED,
    )  # fmt: skip


ONE_JOB_PER_USER = [trace_job(i) for i in range(2000)]


def test_the_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    b = Behaviours(seed=3)
    assert workload(ONE_JOB_PER_USER, b) == workload(ONE_JOB_PER_USER, b)
    assert workload(ONE_JOB_PER_USER, b) != workload(ONE_JOB_PER_USER, Behaviours(seed=4))


def test_a_job_gets_the_same_behaviour_whatever_the_slice_or_order() -> None:
    b = Behaviours(seed=11)
    whole = {j.job_id: j for j in workload(ONE_JOB_PER_USER, b)}
    part = workload(list(reversed(ONE_JOB_PER_USER[500:900])), b)
    assert all(whole[j.job_id] == j for j in part)


@pytest.mark.parametrize(
    ("case", "behaviours", "expected_top_share"),
    [
        (
            "nobody inflates and nobody picks the top class",
            Behaviours(inflating_user_share=0.0, class_mix=((S, 1),)),
            0.0,
        ),
        (
            "a third of the users inflate",
            Behaviours(inflating_user_share=0.3, class_mix=((P, 1), (S, 1))),
            0.3,
        ),
        ("nobody inflates, a tenth pick the top class", Behaviours(inflating_user_share=0.0), 0.1),
        (
            "half inflate, the rest pick the top class a tenth of the time",
            Behaviours(inflating_user_share=0.5),
            0.55,
        ),
    ],
)
def test_the_share_of_top_class_jobs_follows_the_configuration(
    case: str, behaviours: Behaviours, expected_top_share: float
) -> None:
    jobs = [j for j in workload(ONE_JOB_PER_USER, behaviours) if not j.placeholder]
    share = sum(j.priority_class is N for j in jobs) / len(jobs)
    assert share == pytest.approx(expected_top_share, abs=0.04), case


def test_an_inflating_user_submits_every_job_at_the_top_class() -> None:
    b = Behaviours(seed=5, inflating_user_share=0.5)
    jobs = workload([trace_job(i, user=f"user{i % 20}") for i in range(400)], b)
    by_user: dict[str, set[PriorityClass]] = {}
    for j in jobs:
        if not j.placeholder:
            by_user.setdefault(j.user, set()).add(j.priority_class)
    assert {u for u, classes in by_user.items() if classes == {N}} >= {u for u in by_user if inflates(b, u)}
    assert any(inflates(b, u) for u in by_user) and not all(inflates(b, u) for u in by_user)


def test_users_who_park_placeholders_get_long_idle_top_class_jobs_from_their_first_submission() -> None:
    b = Behaviours(seed=1, placeholder_user_share=0.25, placeholders_per_user=2)
    trace = [trace_job(i, user=f"user{i % 40}") for i in range(400)]
    jobs = workload(trace, b)
    parked = [j for j in jobs if j.placeholder]
    parkers = {f"user{i}" for i in range(40) if parks_placeholders(b, f"user{i}")}
    assert 4 <= len(parkers) <= 16
    assert Counter(j.user for j in parked) == {u: 2 for u in parkers}
    first = {u: min(t.submit_at for t in trace if t.user == u) for u in parkers}
    for j in parked:
        n = int(j.job_id.rsplit("-", 1)[1])
        assert j.submit_at == first[j.user] + (n - 1) * b.placeholder_duration_s
        assert (j.priority_class, j.utilization, j.gpus) == (N, 0.01, b.placeholder_gpus)


def test_only_small_short_jobs_become_interactive_in_the_configured_share() -> None:
    b = Behaviours(seed=2, interactive_share=0.2, interactive_max_gpus=2, interactive_max_s=3600)
    trace = [trace_job(i, gpus=1 + i % 4, seconds=1800 + 1800 * (i % 2)) for i in range(4000)]
    jobs = [j for j in workload(trace, b) if not j.placeholder]
    interactive = [j for j in jobs if j.interactive]
    assert all(j.gpus <= 2 and j.duration_s <= 3600 for j in interactive)
    eligible = sum(1 for j in jobs if j.gpus <= 2 and j.duration_s <= 3600)
    assert len(interactive) / eligible == pytest.approx(0.2, abs=0.03)


def test_no_behaviours_leaves_the_trace_as_it_is_at_the_standard_class() -> None:
    jobs = workload(ONE_JOB_PER_USER[:50], NO_BEHAVIOURS)
    assert len(jobs) == 50
    assert {(j.priority_class, j.interactive, j.placeholder) for j in jobs} == {(S, False, False)}


def test_a_trace_cluster_can_be_mapped_to_a_plan_cluster() -> None:
    jobs = workload(ONE_JOB_PER_USER[:3], NO_BEHAVIOURS, cluster_for={"c1": "plan-cluster"})
    assert {j.cluster for j in jobs} == {"plan-cluster"}


PRICES = {"preemptible": 50, "standard": 100, "non-preemptible": 200}  # the plans' hundredths


@pytest.mark.parametrize(
    ("tolerance", "prices", "expected"),
    [
        (3.0, None, {P: 1.0, S: 1.0, N: 1.0}),  # priority is free: everybody who inflates does
        (3.0, dict.fromkeys(PRICES, 100), {P: 1.0, S: 1.0, N: 1.0}),  # flat prices: no reason not to
        (1.0, PRICES, {P: 0.0, S: 0.0, N: 1.0}),  # nobody pays more than their own class's price
        (3.0, PRICES, {P: 0.0, S: 0.5, N: 1.0}),  # tolerance in [1, 3): 2x for half, 4x for nobody
    ],
    ids=["free", "flat prices", "no tolerance", "the plans' prices"],
)
def test_an_inflating_user_keeps_the_top_class_only_while_it_costs_them_little(
    tolerance: float, prices: dict[str, int] | None, expected: dict[PriorityClass, float]
) -> None:
    b = Behaviours(seed=2, inflating_user_share=1.0, max_price_tolerance=tolerance)
    free = {
        j.job_id: j.priority_class
        for j in workload(ONE_JOB_PER_USER, dataclass_replace(b, inflating_user_share=0.0))
    }
    priced = workload(ONE_JOB_PER_USER, b, prices=prices)
    for drawn, share in expected.items():
        jobs = [j for j in priced if not j.placeholder and free[j.job_id] is drawn]
        top = sum(j.priority_class is N for j in jobs) / len(jobs)
        assert top == pytest.approx(share, abs=0.05), drawn
    # A job that does not go to the top class keeps the class it would have had anyway.
    assert all(j.priority_class in (N, free[j.job_id]) for j in priced if not j.placeholder)
