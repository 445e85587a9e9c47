"""Usage that cannot have happened (domain/usage_checks.py): each check on its own, and what passes."""

from __future__ import annotations

import pytest

from allmende.domain.admin_state import AdminState
from allmende.domain.usage_checks import (
    FUTURE_INSTANT,
    GPU_TYPE,
    OVER_CAPACITY,
    UNKNOWN_CLUSTER,
    UNKNOWN_PROJECT,
    ImpossibleUsage,
    PlanView,
    check_event,
)
from allmende.schemas.events import (
    JobEvent,
    JobFinished,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    PriorityClass,
)
from tests.unit.admin_builders import cluster, node

NOW = 1_800_000_000
SKEW = 300
PLAN_EVENTS = [
    node("org", kind="organisation"),
    node("vision", parent="org"),
    cluster("small", gpu_type="H100", gpus=88),
    cluster("large", gpu_type="B200", gpus=1024),
]
PLAN = PlanView.of(AdminState.of(PLAN_EVENTS))
COMMON = {"producer": "test", "job_id": "j1"}


def submitted(**change: object) -> JobSubmitted:
    fields = {
        "event_id": "j1:submitted", "occurred_at": NOW - 100, "project": "vision", "user": "ana",
        "cluster": "small", "gpu_type": "H100", "gpus": 8, "priority_class": PriorityClass.STANDARD,
        "requested_seconds": 3600, **COMMON,
    }  # fmt: skip
    fields.update(change)
    return JobSubmitted(**fields)  # type: ignore[arg-type]


def code_of(event: JobEvent, now: int = NOW, plan: PlanView = PLAN) -> str | None:
    try:
        check_event(event, plan, now, SKEW)
    except ImpossibleUsage as exc:
        assert str(exc)  # a sentence for the dead letter
        return exc.code
    return None


def test_a_submission_the_plan_fits_passes() -> None:
    assert code_of(submitted()) is None
    assert code_of(submitted(gpus=88)) is None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"project": "ghost"}, UNKNOWN_PROJECT),
        ({"project": "org"}, UNKNOWN_PROJECT),  # a node, but not a project
        ({"cluster": "nowhere"}, UNKNOWN_CLUSTER),
        ({"gpu_type": "H900"}, GPU_TYPE),
        ({"gpus": 89}, OVER_CAPACITY),
        ({"occurred_at": NOW + SKEW + 1}, FUTURE_INSTANT),
    ],
)
def test_a_submission_the_plan_does_not_fit_is_refused_with_its_code(
    change: dict[str, object], code: str
) -> None:
    assert code_of(submitted(**change)) == code


def test_gpus_started_or_in_use_are_checked_against_the_largest_cluster_ever_declared() -> None:
    # The job's own cluster is the ledger's to check (the alerter's sweep, then a dispute): here
    # only the event counts, so the answer is the same whatever order the job's events come in.
    sample = JobUsageSample(event_id="s", occurred_at=NOW, gpus_in_use=89, gpu_utilization=1.0, **COMMON)
    assert code_of(sample) is None  # more than "small" has, but "large" has room
    started = JobStarted(event_id="s", occurred_at=NOW, gpus=1025, **COMMON)
    assert code_of(started) == OVER_CAPACITY
    shrunk = PlanView.of(
        AdminState.of(
            [*PLAN_EVENTS, cluster("large", gpu_type="B200", gpus=512, at=NOW - 10, event_id="shrink")]
        )
    )
    assert shrunk.clusters["large"].gpus == 1024  # what it once held stays possible
    assert code_of(JobStarted(event_id="s", occurred_at=NOW, gpus=1024, **COMMON), plan=shrunk) is None


def test_instants_up_to_the_skew_pass_and_a_replay_of_the_past_is_unaffected() -> None:
    assert code_of(JobStarted(event_id="s", occurred_at=NOW + SKEW, gpus=8, **COMMON)) is None
    assert code_of(JobStarted(event_id="s", occurred_at=1_600_000_000, gpus=8, **COMMON)) is None
    late_start = JobFinished(
        event_id="f", occurred_at=NOW + SKEW + 10, status="succeeded", started_at=NOW, **COMMON
    )
    assert code_of(late_start) == FUTURE_INSTANT


def test_a_plan_without_clusters_fits_no_usage() -> None:
    empty = PlanView.of(AdminState())
    with pytest.raises(ImpossibleUsage) as refused:
        check_event(JobStarted(event_id="s", occurred_at=NOW, gpus=1, **COMMON), empty, NOW, SKEW)
    assert refused.value.code == OVER_CAPACITY
