"""A Kueue Workload as an admission request, the check status written back, and a Job's runs as
job events (integrations/kueue/workloads.py, lifecycle.py): pure functions of the objects."""

from __future__ import annotations

import copy
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from allmende.integrations.kueue.config import Flavor, KueueConfig
from allmende.integrations.kueue.lifecycle import RUN_STARTED, plan, plan_deleted
from allmende.integrations.kueue.workloads import (
    PREEMPTIONS,
    NotAskable,
    ask_of,
    check_patch,
    quantity,
    uid_of_job_id,
)
from allmende.schemas.events import FinishStatus, JobFinished, JobPreempted, JobStarted, JobSubmitted

UID = "0f6c11aa-1b2c-4d3e-8f90-123456789abc"
CONFIG = KueueConfig(
    cluster="k8s-a",
    flavors={"b200": Flavor(gpu_type="B200"), "h100-b": Flavor(gpu_type="H100", cluster="k8s-b")},
    priority_classes={"low": "preemptible", "high": "non-preemptible"},
)


def workload(**changes: Any) -> dict[str, Any]:
    """A Workload as Kueue v0.17 makes one for a batch/v1 Job of 2 pods x 4 GPUs."""
    w: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-1a2b3", "namespace": "nlp", "uid": UID,
            "labels": {"kueue.x-k8s.io/job-uid": "77aa"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "77aa"}],
        },
        "spec": {
            "queueName": "gpus",
            "podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "4"}}},
            ]}}}],
            "maximumExecutionTimeSeconds": 7200,
        },
    }  # fmt: skip
    for path, value in changes.items():
        node = w
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return w


def reserved(w: dict[str, Any], flavor: str, gpus: str) -> dict[str, Any]:
    w = copy.deepcopy(w)
    w["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": flavor, "cpu": "default"},
             "resourceUsage": {"nvidia.com/gpu": gpus, "cpu": "2"}},
        ]},
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-07T10:00:00Z"},
        ],
    }  # fmt: skip
    return w


def test_a_waiting_workload_is_its_pod_sets_and_the_namespace_its_project() -> None:
    ask = ask_of(workload(), None, None, CONFIG)
    assert (ask.job_id, ask.project, ask.user, ask.cluster) == (f"kueue-{UID}", "nlp", "nlp", "k8s-a")
    assert (ask.gpus, ask.gpu_type, ask.priority_class, ask.interactive) == (8, "H100", "standard", False)
    assert ask.requested_hours == 2 and ask.requested_seconds == 7200
    assert ask.body()["requested_hours"] == "2"
    assert uid_of_job_id(ask.job_id) == UID and uid_of_job_id(f"kueue-{UID}-2") == UID
    assert uid_of_job_id("slurm-a-12") is None
    # after two runs ended by preemption, the next admission is a new request
    assert ask_of(workload(), {"metadata": {"annotations": {PREEMPTIONS: "2"}}}, None, CONFIG).job_id == (
        f"kueue-{UID}-2"
    )


def test_reserved_quota_gives_the_gpus_and_the_flavor_its_type_and_cluster() -> None:
    ask = ask_of(reserved(workload(), "h100-b", "8"), None, None, CONFIG)
    assert (ask.gpus, ask.gpu_type, ask.cluster) == (8, "H100", "k8s-b")
    assert ask_of(reserved(workload(), "b200", "6"), None, None, CONFIG).gpu_type == "B200"
    assert ask_of(reserved(workload(), "b200", "6"), None, None, CONFIG).gpus == 6


def test_labels_then_annotations_of_workload_job_and_namespace() -> None:
    annotations = {"allmende.io/user": "ada", "allmende.io/interactive": "true"}
    job = {"metadata": {"labels": {"allmende.io/project": "vision"}, "annotations": annotations}}
    namespace = {"metadata": {"name": "nlp", "labels": {"allmende.io/project": "nlp-ns"}}}
    ask = ask_of(workload(), job, namespace, CONFIG)
    assert (ask.project, ask.user, ask.interactive) == ("vision", "ada", True)
    assert ask_of(workload(), None, namespace, CONFIG).project == "nlp-ns"
    labelled = workload(metadata__annotations={"allmende.io/project": "speech"})
    assert ask_of(labelled, job, namespace, CONFIG).project == "speech"  # the workload's own first


def test_priority_from_the_annotation_or_the_workload_priority_class() -> None:
    assert ask_of(workload(spec__priorityClassRef={"name": "low"}), None, None, CONFIG).priority_class == (
        "preemptible"
    )
    assert ask_of(workload(spec__priorityClassRef={"name": "other"}), None, None, CONFIG).priority_class == (
        "standard"
    )
    job = {"metadata": {"annotations": {"allmende.io/priority-class": "non-preemptible"}}}
    assert ask_of(workload(), job, None, CONFIG).priority_class == "non-preemptible"
    with pytest.raises(NotAskable, match="not preemptible, standard or non-preemptible"):
        ask_of(workload(), {"metadata": {"labels": {"allmende.io/priority-class": "urgent"}}}, None, CONFIG)


def test_hours_from_the_limit_the_annotation_the_deadline_or_the_default() -> None:
    bare = workload()
    del bare["spec"]["maximumExecutionTimeSeconds"]
    job = {"metadata": {"annotations": {"allmende.io/requested-hours": "1.5"}}, "spec": {}}
    assert ask_of(bare, job, None, CONFIG).requested_hours == Decimal("1.5")
    assert ask_of(bare, {"spec": {"activeDeadlineSeconds": 5400}}, None, CONFIG).requested_seconds == 5400
    with pytest.raises(NotAskable, match="no time limit"):
        ask_of(bare, None, None, CONFIG)
    assert ask_of(bare, None, None, CONFIG.model_copy(update={"default_hours": 4.0})).requested_hours == 4
    with pytest.raises(NotAskable, match="not a number of hours"):
        ask_of(bare, {"metadata": {"annotations": {"allmende.io/requested-hours": "soon"}}}, None, CONFIG)


def test_workloads_that_cannot_be_asked_about_say_why() -> None:
    no_gpus = workload()
    no_gpus["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1"}
    }
    with pytest.raises(NotAskable, match="asks for 0 GPUs"):
        ask_of(no_gpus, None, None, CONFIG)
    with pytest.raises(NotAskable, match="names no project"):
        ask_of(workload(), None, None, CONFIG.model_copy(update={"project_from_namespace": False}))
    with pytest.raises(NotAskable, match="not a whole number"):
        quantity("1.5")
    assert quantity("2000m") == 2 and quantity(3) == 3


def test_the_check_patch_sets_only_our_entry() -> None:
    now = dt.datetime(2026, 12, 7, 10, 0, 5, tzinfo=dt.UTC)
    body = check_patch(workload(), "allmende-budget", "Retry", "allmende: queue: over budget", now, 60)
    assert body["metadata"] == {"name": "job-train-1a2b3", "namespace": "nlp"}
    assert body["status"]["admissionChecks"] == [{
        "name": "allmende-budget", "state": "Retry", "message": "allmende: queue: over budget",
        "lastTransitionTime": "2026-12-07T10:00:05Z", "requeueAfterSeconds": 60,
    }]  # fmt: skip
    ready = check_patch(workload(), "allmende-budget", "Ready", "ok", now, 60)
    assert "requeueAfterSeconds" not in ready["status"]["admissionChecks"][0]


# -- lifecycle ------------------------------------------------------------------------------------
ASK = ask_of(reserved(workload(), "b200", "8"), None, None, CONFIG)
T0 = 1_796_000_000  # 2026-11-29


def stamp(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(started: int | None = None, suspend: bool = False, recorded: int | None = None,
        done: tuple[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {}
    if started is not None:
        status["startTime"] = stamp(started)
    if done is not None:
        kind, at = done
        status["conditions"] = [{"type": kind, "status": "True", "lastTransitionTime": stamp(at)}]
        if kind == "Complete":
            status["completionTime"] = stamp(at)
    annotations = {RUN_STARTED: str(recorded)} if recorded is not None else {}
    return {"metadata": {"name": "train", "uid": "77aa", "annotations": annotations},
            "spec": {"suspend": suspend}, "status": status}  # fmt: skip


def test_a_run_starts_and_completes_charging_end_minus_start() -> None:
    running = plan(ASK, UID, job(started=T0), None, T0 + 5, "kueue")
    assert [type(e) for e in running.events] == [JobSubmitted, JobStarted]
    assert running.annotations == {RUN_STARTED: str(T0)}
    submitted = running.events[0]
    assert isinstance(submitted, JobSubmitted)
    assert (submitted.project, submitted.gpu_type, submitted.gpus, submitted.requested_seconds) == (
        "nlp",
        "B200",
        8,
        7200,
    )
    done = plan(ASK, UID, job(started=T0, recorded=T0, done=("Complete", T0 + 600)), None, T0 + 700, "k")
    finished = done.events[-1]
    assert isinstance(finished, JobFinished)
    assert (finished.status, finished.started_at, finished.occurred_at) == (
        FinishStatus.SUCCEEDED,
        T0,
        T0 + 600,
    )
    assert [e.event_id for e in done.events] == [
        f"kueue-{UID}:submitted",
        f"kueue-{UID}:{T0}:started",
        f"kueue-{UID}:{T0}:finished",
    ]  # the same ids whenever they are planned: sent twice, one event
    assert done.annotations == {}


def test_an_evicted_run_ends_at_the_eviction_and_the_next_run_is_a_new_job() -> None:
    evicted = plan(ASK, UID, job(suspend=True, recorded=T0), T0 + 300, T0 + 400, "k")
    preempted = evicted.events[-1]
    assert isinstance(preempted, JobPreempted)
    assert (preempted.job_id, preempted.started_at, preempted.occurred_at) == (f"kueue-{UID}", T0, T0 + 300)
    assert evicted.annotations == {RUN_STARTED: None, PREEMPTIONS: "1"}
    # a controller that was away while the run ended and the next began closes the first at its
    # eviction, and the next run is the next job id's
    again = plan(ASK, UID, job(started=T0 + 900, recorded=T0), T0 + 300, T0 + 950, "k")
    kinds = [(type(e).__name__, e.job_id) for e in again.events]
    first, second = f"kueue-{UID}", f"kueue-{UID}-1"
    assert kinds == [("JobSubmitted", first), ("JobStarted", first), ("JobPreempted", first),
                     ("JobSubmitted", second), ("JobStarted", second)]  # fmt: skip
    assert again.events[2].occurred_at == T0 + 300 and again.events[4].occurred_at == T0 + 900
    assert again.annotations == {RUN_STARTED: str(T0 + 900), PREEMPTIONS: "1"}


def test_failed_never_started_and_deleted_jobs() -> None:
    failed = plan(ASK, UID, job(started=T0, done=("Failed", T0 + 60)), None, T0 + 70, "k").events[-1]
    assert isinstance(failed, JobFinished) and failed.status == FinishStatus.FAILED
    assert plan(ASK, UID, job(done=("Failed", T0)), None, T0, "k").events == []
    assert plan(ASK, UID, job(suspend=True), None, T0, "k").events == []
    cancelled = plan_deleted(ASK, job(started=T0, recorded=T0), T0 + 120, "k")[-1]
    assert isinstance(cancelled, JobFinished)
    assert (cancelled.status, cancelled.occurred_at) == (FinishStatus.CANCELLED, T0 + 120)
    assert plan_deleted(ASK, job(started=T0, done=("Complete", T0 + 5)), T0 + 120, "k") == []


def test_an_admitted_job_deleted_before_it_ran_is_closed_at_once() -> None:
    assert plan_deleted(ASK, job(), T0 + 50, "k") == []  # never admitted: nothing to release
    closed = plan_deleted(ASK, job(), T0 + 50, "k", admitted=True)
    assert [type(e) for e in closed] == [JobSubmitted, JobFinished]
    finished = closed[-1]
    assert isinstance(finished, JobFinished)
    assert (finished.status, finished.started_at, finished.occurred_at) == (
        FinishStatus.CANCELLED,
        T0 + 50,
        T0 + 50,
    )
