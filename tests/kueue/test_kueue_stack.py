"""Kueue on the real stack (etcd, kube-apiserver, Kueue's manager): its webhook suspends a queued
Job, the Workload it makes is admitted on quota, and an AdmissionCheck of another controller
(Allmende's budget check, `allmende.io/budget`) holds admission until that controller says Ready.

No kubelet, no job controller: only what Kueue does to the Job and its Workload is checked.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from allmende.core.supervisor import wait_until
from allmende.testing.kubernetes import FIELD_MANAGER, KubeCluster

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FLAVOR = "default-flavor"
BUDGET_CONTROLLER = "allmende.io/budget"
TIMEOUT = 30.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == kind:
            return dict(condition)
    return None


def _is_true(obj: dict[str, Any], kind: str) -> bool:
    condition = _condition(obj, kind)
    return condition is not None and condition["status"] == "True"


@pytest.fixture(scope="module")
def flavor(kube: KubeCluster) -> str:
    kube.apply(
        f"{KUEUE}/resourceflavors/{FLAVOR}",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
    )
    return FLAVOR


def _cluster_queue(kube: KubeCluster, name: str, flavor: str, checks: list[str] | None = None) -> None:
    spec: dict[str, Any] = {
        "namespaceSelector": {},  # every namespace
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": "8"},
                            {"name": "nvidia.com/gpu", "nominalQuota": "4"},
                        ],
                    }
                ],
            }
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check} for check in checks]}
    kube.apply(
        f"{KUEUE}/clusterqueues/{name}",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def _namespace_with_queue(kube: KubeCluster, namespace: str, cluster_queue: str) -> str:
    """A namespace with a LocalQueue `team` of `cluster_queue`; the LocalQueue's name."""
    kube.apply(
        f"/api/v1/namespaces/{namespace}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    kube.apply(
        f"{KUEUE}/namespaces/{namespace}/localqueues/team",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    return "team"


def _gpu_job(kube: KubeCluster, namespace: str, queue: str, name: str, gpus: int = 2) -> dict[str, Any]:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example/train:1",
                            "resources": {
                                "requests": {"cpu": "2", "nvidia.com/gpu": str(gpus)},
                                "limits": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                }
            },
        },
    }
    return kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)


def _workload_of(kube: KubeCluster, job: dict[str, Any]) -> dict[str, Any] | None:
    namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
    for workload in kube.get(f"{KUEUE}/namespaces/{namespace}/workloads").get("items", []):
        if any(owner.get("uid") == uid for owner in workload["metadata"].get("ownerReferences", [])):
            return dict(workload)
    return None


def _await_workload(kube: KubeCluster, job: dict[str, Any], condition: str | None = None) -> dict[str, Any]:
    """The Job's Workload once there is one (and its `condition` is True)."""

    def found() -> dict[str, Any] | None:
        workload = _workload_of(kube, job)
        return workload if workload is not None and (not condition or _is_true(workload, condition)) else None

    workload = wait_until(found, TIMEOUT, f"the Job's Workload{f' {condition}' if condition else ''}")
    assert workload is not None
    return workload


def _job(kube: KubeCluster, job: dict[str, Any]) -> dict[str, Any]:
    return kube.get(
        f"/apis/batch/v1/namespaces/{job['metadata']['namespace']}/jobs/{job['metadata']['name']}"
    )


def _check_states(workload: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["state"] for check in workload.get("status", {}).get("admissionChecks", [])}


def test_queued_job_is_suspended_then_admitted_on_quota(kube: KubeCluster, flavor: str) -> None:
    _cluster_queue(kube, "plain", flavor)
    wait_until(
        lambda: _is_true(kube.get(f"{KUEUE}/clusterqueues/plain"), "Active"), TIMEOUT, "ClusterQueue active"
    )
    queue = _namespace_with_queue(kube, "team-plain", "plain")

    submitted = time.monotonic()
    job = _gpu_job(kube, "team-plain", queue, "train-1")
    assert job["spec"]["suspend"] is True  # Kueue's mutating webhook, on creation

    workload = _await_workload(kube, job)
    assert workload["spec"]["queueName"] == queue
    admitted = _await_workload(kube, job, "Admitted")
    assert _is_true(admitted, "QuotaReserved")
    assert admitted["status"]["admission"]["clusterQueue"] == "plain"
    wait_until(lambda: _job(kube, job)["spec"]["suspend"] is False, TIMEOUT, "the Job unsuspended")
    print(f"\nJob created -> Workload admitted -> Job unsuspended: {time.monotonic() - submitted:.2f}s")


def test_admission_check_holds_the_workload_until_ready(kube: KubeCluster, flavor: str) -> None:
    kube.apply(
        f"{KUEUE}/admissionchecks/budget",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "budget"},
            "spec": {"controllerName": BUDGET_CONTROLLER},
        },
    )
    _cluster_queue(kube, "budgeted", flavor, checks=["budget"])

    # Inactive until the check's controller marks the check Active.
    def inactive_reason() -> str | None:
        condition = _condition(kube.get(f"{KUEUE}/clusterqueues/budgeted"), "Active")
        return condition["reason"] if condition and condition["status"] == "False" else None

    assert wait_until(inactive_reason, TIMEOUT, "ClusterQueue inactive") == "AdmissionCheckInactive"
    time.sleep(1.0)
    assert inactive_reason() == "AdmissionCheckInactive"
    kube.apply(
        f"{KUEUE}/admissionchecks/budget/status",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "budget"},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "the budget controller is running",
                        "lastTransitionTime": _now(),
                    }
                ]
            },
        },
        field_manager=FIELD_MANAGER,
    )
    wait_until(
        lambda: _is_true(kube.get(f"{KUEUE}/clusterqueues/budgeted"), "Active"),
        TIMEOUT,
        "ClusterQueue active",
    )

    queue = _namespace_with_queue(kube, "team-budgeted", "budgeted")
    job = _gpu_job(kube, "team-budgeted", queue, "train-2")
    assert job["spec"]["suspend"] is True

    # Quota reserved, the check pending: not admitted, the Job stays suspended.
    reserved = _await_workload(kube, job, "QuotaReserved")
    assert _check_states(reserved) == {"budget": "Pending"}
    assert not _is_true(reserved, "Admitted")
    time.sleep(1.0)
    held = _workload_of(kube, job)
    assert held is not None and not _is_true(held, "Admitted")
    assert _job(kube, job)["spec"]["suspend"] is True

    # The budget controller says Ready (server-side apply on the Workload's status).
    name, namespace = held["metadata"]["name"], held["metadata"]["namespace"]
    ready_at = time.monotonic()
    kube.apply(
        f"{KUEUE}/namespaces/{namespace}/workloads/{name}/status",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "admissionChecks": [
                    {
                        "name": "budget",
                        "state": "Ready",
                        "message": "within the project's GPU-hour budget",
                        "lastTransitionTime": _now(),
                    }
                ]
            },
        },
        field_manager=FIELD_MANAGER,
    )
    admitted = _await_workload(kube, job, "Admitted")
    assert _check_states(admitted) == {"budget": "Ready"}
    wait_until(lambda: _job(kube, job)["spec"]["suspend"] is False, TIMEOUT, "the Job unsuspended")
    print(f"\ncheck Ready -> Job unsuspended: {time.monotonic() - ready_at:.2f}s")
