"""Kueue on the real stack (etcd, kube-apiserver, Kueue's manager): its webhook suspends a queued
Job, the Workload it makes is admitted on quota, and an AdmissionCheck of another controller
(Allmende's budget check, `allmende.io/budget`) holds admission until that controller says Ready.

No kubelet, no job controller: only what Kueue does to the Job and its Workload is checked.
"""

from __future__ import annotations

import time

import pytest

from allmende.core.supervisor import wait_until
from allmende.testing.kubernetes import FIELD_MANAGER, KubeCluster
from tests.kueue.objects import (
    KUEUE,
    TIMEOUT,
    await_workload,
    check_states,
    cluster_queue,
    condition,
    current,
    flavor,
    gpu_job,
    is_true,
    namespace_with_queue,
    stamp,
    workload_of,
)

BUDGET_CONTROLLER = "allmende.io/budget"
FLAVOR = "default-flavor"


@pytest.fixture(scope="module")
def default_flavor(kube: KubeCluster) -> str:
    return flavor(kube, FLAVOR)


def test_queued_job_is_suspended_then_admitted_on_quota(kube: KubeCluster, default_flavor: str) -> None:
    cluster_queue(kube, "plain", default_flavor)
    wait_until(
        lambda: is_true(kube.get(f"{KUEUE}/clusterqueues/plain"), "Active"), TIMEOUT, "ClusterQueue active"
    )
    queue = namespace_with_queue(kube, "team-plain", "plain")

    submitted = time.monotonic()
    job = gpu_job(kube, "team-plain", queue, "train-1")
    assert job["spec"]["suspend"] is True  # Kueue's mutating webhook, on creation

    workload = await_workload(kube, job)
    assert workload["spec"]["queueName"] == queue
    admitted = await_workload(kube, job, "Admitted")
    assert is_true(admitted, "QuotaReserved")
    assert admitted["status"]["admission"]["clusterQueue"] == "plain"
    wait_until(lambda: current(kube, job)["spec"]["suspend"] is False, TIMEOUT, "the Job unsuspended")
    print(f"\nJob created -> Workload admitted -> Job unsuspended: {time.monotonic() - submitted:.2f}s")


def test_admission_check_holds_the_workload_until_ready(kube: KubeCluster, default_flavor: str) -> None:
    kube.apply(
        f"{KUEUE}/admissionchecks/budget",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "budget"},
            "spec": {"controllerName": BUDGET_CONTROLLER},
        },
    )
    cluster_queue(kube, "budgeted", default_flavor, checks=["budget"])

    # Inactive until the check's controller marks the check Active.
    def inactive_reason() -> str | None:
        active = condition(kube.get(f"{KUEUE}/clusterqueues/budgeted"), "Active")
        return active["reason"] if active and active["status"] == "False" else None

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
                        "lastTransitionTime": stamp(),
                    }
                ]
            },
        },
        field_manager=FIELD_MANAGER,
    )
    wait_until(
        lambda: is_true(kube.get(f"{KUEUE}/clusterqueues/budgeted"), "Active"),
        TIMEOUT,
        "ClusterQueue active",
    )

    queue = namespace_with_queue(kube, "team-budgeted", "budgeted")
    job = gpu_job(kube, "team-budgeted", queue, "train-2")
    assert job["spec"]["suspend"] is True

    # Quota reserved, the check pending: not admitted, the Job stays suspended.
    reserved = await_workload(kube, job, "QuotaReserved")
    assert check_states(reserved) == {"budget": "Pending"}
    assert not is_true(reserved, "Admitted")
    time.sleep(1.0)
    held = workload_of(kube, job)
    assert held is not None and not is_true(held, "Admitted")
    assert current(kube, job)["spec"]["suspend"] is True

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
                        "lastTransitionTime": stamp(),
                    }
                ]
            },
        },
        field_manager=FIELD_MANAGER,
    )
    admitted = await_workload(kube, job, "Admitted")
    assert check_states(admitted) == {"budget": "Ready"}
    wait_until(lambda: current(kube, job)["spec"]["suspend"] is False, TIMEOUT, "the Job unsuspended")
    print(f"\ncheck Ready -> Job unsuspended: {time.monotonic() - ready_at:.2f}s")
