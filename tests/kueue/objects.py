"""Kueue and batch objects on the real API server for the Kueue tests, and waiting on them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from allmende.core.supervisor import wait_until
from allmende.testing.kubernetes import KubeCluster, gpu_job_manifest

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
TIMEOUT = 30.0


def stamp(at: dt.datetime | int | None = None) -> str:
    """An RFC 3339 instant as the API server writes them (now, by default)."""
    if isinstance(at, int):
        at = dt.datetime.fromtimestamp(at, dt.UTC)
    return (at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c["status"] == "True"


def flavor(kube: KubeCluster, name: str) -> str:
    kube.apply(
        f"{KUEUE}/resourceflavors/{name}",
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": name}},
    )
    return name


def cluster_queue(
    kube: KubeCluster, name: str, flavor: str, checks: list[str] | None = None, gpus: int = 4, cpus: int = 8
) -> None:
    spec: dict[str, Any] = {
        "namespaceSelector": {},  # every namespace
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": str(cpus)},
                            {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
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
        {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec},
    )


def namespace_with_queue(
    kube: KubeCluster, namespace: str, cluster_queue: str, labels: dict[str, str] | None = None
) -> str:
    """A namespace (with `labels`) with a LocalQueue `team` of `cluster_queue`; the LocalQueue's name."""
    kube.apply(
        f"/api/v1/namespaces/{namespace}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels or {}}},
    )
    kube.apply(
        f"{KUEUE}/namespaces/{namespace}/localqueues/team",
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    return "team"


def gpu_job(
    kube: KubeCluster,
    namespace: str,
    queue: str,
    name: str,
    gpus: int = 2,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Job created (as the API server stored it: suspended by Kueue's webhook)."""
    job = gpu_job_manifest(namespace, queue, name, gpus, labels, annotations)
    return kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)


def job_path(job: dict[str, Any]) -> str:
    return f"/apis/batch/v1/namespaces/{job['metadata']['namespace']}/jobs/{job['metadata']['name']}"


def current(kube: KubeCluster, job: dict[str, Any]) -> dict[str, Any]:
    return kube.get(job_path(job))


def workload_of(kube: KubeCluster, job: dict[str, Any]) -> dict[str, Any] | None:
    namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
    for workload in kube.get(f"{KUEUE}/namespaces/{namespace}/workloads").get("items", []):
        if any(owner.get("uid") == uid for owner in workload["metadata"].get("ownerReferences", [])):
            return dict(workload)
    return None


def await_workload(
    kube: KubeCluster, job: dict[str, Any], condition: str | None = None, timeout: float = TIMEOUT
) -> dict[str, Any]:
    """The Job's Workload once there is one (and its `condition` is True)."""

    def found() -> dict[str, Any] | None:
        workload = workload_of(kube, job)
        return workload if workload is not None and (not condition or is_true(workload, condition)) else None

    workload = wait_until(found, timeout, f"the Job's Workload{f' {condition}' if condition else ''}")
    assert workload is not None
    return workload


def check_states(workload: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["state"] for check in workload.get("status", {}).get("admissionChecks", [])}


def check_message(workload: dict[str, Any], name: str) -> str:
    for check in workload.get("status", {}).get("admissionChecks", []):
        if check["name"] == name:
            return str(check.get("message", ""))
    return ""


# -- what the job controller and the kubelet would write (no kubelet here) -----------------------
def start(kube: KubeCluster, job: dict[str, Any], at: int) -> dict[str, Any]:
    """The Job's pod runs from `at` (UTC seconds): status.startTime and one active pod."""
    body = {"status": {"startTime": stamp(at), "active": 1}}
    return kube.request("PATCH", f"{job_path(job)}/status", json_body=body,
                        content_type="application/merge-patch+json")  # fmt: skip


def complete(kube: KubeCluster, job: dict[str, Any], at: int) -> dict[str, Any]:
    """The Job's pod succeeded at `at`: the conditions a job controller writes (SuccessCriteriaMet,
    then Complete) with completionTime."""
    when = stamp(at)
    reached = {"status": "True", "reason": "CompletionsReached", "lastTransitionTime": when,
               "lastProbeTime": when, "message": "Reached expected number of succeeded pods"}  # fmt: skip
    body = {"status": {
        "active": 0, "ready": 0, "succeeded": 1, "completionTime": when,
        "conditions": [{"type": "SuccessCriteriaMet", **reached}, {"type": "Complete", **reached}],
    }}  # fmt: skip
    return kube.request("PATCH", f"{job_path(job)}/status", json_body=body,
                        content_type="application/merge-patch+json")  # fmt: skip


def stop_pods(kube: KubeCluster, job: dict[str, Any], at: int) -> dict[str, Any]:
    """Kueue suspended the Job: its pods are gone at `at` (what the job controller writes: no active
    pod, no start time, the `Suspended` condition). Kueue releases the quota only then."""
    when = stamp(at)
    suspended = {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended",
                 "lastTransitionTime": when, "lastProbeTime": when}  # fmt: skip
    body = {"status": {"active": 0, "ready": 0, "startTime": None, "conditions": [suspended]}}
    return kube.request("PATCH", f"{job_path(job)}/status", json_body=body,
                        content_type="application/merge-patch+json")  # fmt: skip


def delete(kube: KubeCluster, job: dict[str, Any]) -> None:
    kube.request("DELETE", job_path(job), params={"propagationPolicy": "Background"})
