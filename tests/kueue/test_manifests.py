"""The site's manifests (deploy/kubernetes/) against the real API server and Kueue's webhooks:
every object valid (`kubectl apply --dry-run=server`), and the controller's ServiceAccount allowed
every call the controller makes, nothing it does not need."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from allmende.testing.kubernetes import KubeCluster

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SERVICE_ACCOUNT = "system:serviceaccount:allmende-system:allmende-kueue"


def kubectl(kube: KubeCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = ["kubectl", "--kubeconfig", str(kube.kubeconfig), *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)


def test_every_manifest_is_valid_on_the_server(kube: KubeCluster) -> None:
    # The namespaces first, for real: a server-side dry run of an object needs its namespace to exist.
    for namespace in ("allmende-system", "nlp"):
        kubectl(kube, "create", "namespace", namespace)
    applied = kubectl(kube, "apply", "--dry-run=server", "-f", str(DEPLOY))
    assert applied.returncode == 0, applied.stderr
    kinds = {line.split()[0].split("/")[0] for line in applied.stdout.splitlines()}
    expected = {
        "namespace", "serviceaccount", "clusterrole.rbac.authorization.k8s.io",
        "clusterrolebinding.rbac.authorization.k8s.io", "admissioncheck.kueue.x-k8s.io", "configmap",
        "secret", "persistentvolumeclaim", "deployment.apps", "resourceflavor.kueue.x-k8s.io",
        "clusterqueue.kueue.x-k8s.io", "localqueue.kueue.x-k8s.io",
    }  # fmt: skip
    assert expected <= kinds, applied.stdout
    # Kueue's own webhooks judge its objects in a dry run too: a ClusterQueue it refuses is refused.
    broken = DEPLOY / "cluster-queue.example.yaml"
    text = broken.read_text().replace("nominalQuota: 256", "nominalQuota: -1")
    refused = kubectl(kube, "apply", "--dry-run=server", "-f", "-", stdin=text)
    assert refused.returncode != 0 and "nominalQuota" in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("list", "workloads.kueue.x-k8s.io", True),
        ("watch", "workloads.kueue.x-k8s.io", True),
        ("patch", "workloads.kueue.x-k8s.io/status", True),
        ("patch", "workloads.kueue.x-k8s.io", False),  # the spec is Kueue's and the user's
        ("list", "admissionchecks.kueue.x-k8s.io", True),
        ("patch", "admissionchecks.kueue.x-k8s.io/status", True),
        ("list", "jobs.batch", True),
        ("watch", "jobs.batch", True),
        ("patch", "jobs.batch", True),  # the run annotations
        ("delete", "jobs.batch", False),
        ("get", "namespaces", True),
        ("list", "secrets", False),
    ],
)
def test_the_controllers_service_account_may_do_what_it_does_and_no_more(
    kube: KubeCluster, verb: str, resource: str, allowed: bool
) -> None:
    kubectl(kube, "create", "namespace", "allmende-system")
    made = kubectl(kube, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    assert made.returncode == 0, made.stderr
    subresource: list[str] = []
    if "/" in resource:
        resource, sub = resource.split("/")
        subresource = [f"--subresource={sub}"]
    answer = kubectl(
        kube, "auth", "can-i", verb, resource, *subresource, "--all-namespaces", f"--as={SERVICE_ACCOUNT}"
    )
    assert answer.stdout.strip() == ("yes" if allowed else "no"), (answer.stdout, answer.stderr)
