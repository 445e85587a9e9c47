"""A Kubernetes job and its Slurm twin in the same run cost the same: the Slurm job runs on the
local Slurm (hooks -> spool -> Kafka), the Kueue job through Allmende's AdmissionCheck controller on
the real API server and Kueue (tests/kueue), over the same length on the same GPUs of one project;
the ledger charges each exactly its run, GPU-second for GPU-second."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.integrations.kueue.config import Flavor, KueueConfig
from allmende.integrations.kueue.controller import Controller, admission_client, kubernetes_client
from allmende.integrations.spool import Spool
from allmende.testing.kubernetes import KubeCluster
from allmende.testing.slurm_harness import PLATFORM_CLUSTER, TOKEN, Platform, SlurmCluster, wait_for
from tests.kueue.objects import (
    KUEUE,
    KUEUE_API,
    MAX_EXEC_LABEL,
    await_workload,
    cluster_queue,
    complete,
    delete,
    flavor,
    gpu_job,
    is_true,
    namespace_with_queue,
    start,
)
from tests.slurm.test_slurm_admission import _job_id, _sacct_gpus

pytestmark = pytest.mark.slurm

CHECK = "allmende-twin"


@pytest.fixture
def controller(kube: KubeCluster, platform: Platform, tmp_path: Path) -> Iterator[Controller]:
    kube.apply(f"{KUEUE}/admissionchecks/{CHECK}", {
        "apiVersion": KUEUE_API, "kind": "AdmissionCheck", "metadata": {"name": CHECK},
        "spec": {"controllerName": "allmende.io/budget"},
    })  # fmt: skip
    flavor(kube, "h100")
    settings = platform.settings
    config = KueueConfig(
        api_url=platform.url, token=TOKEN, kubeconfig=kube.kubeconfig, cluster=PLATFORM_CLUSTER,
        flavors={"h100": Flavor(gpu_type="H100")}, kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        topic_prefix=settings.topic_prefix, spool_dir=tmp_path / "spool", resync_s=1.0,
    )  # fmt: skip
    running = Controller(config, kubernetes_client(config), admission_client(config), Spool(config.spool_dir))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(10)


def test_a_kueue_job_costs_what_its_slurm_twin_costs(
    slurm: SlurmCluster,
    platform: Platform,
    kube: KubeCluster,
    controller: Controller,
) -> None:
    slurm.cancel_all()
    slurm.configure(**platform.config())
    row = slurm.wait_done(
        _job_id(slurm.sbatch("-A", "rich", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 3"))
    )
    assert row["State"] == "COMPLETED", row
    slurm_id = row["AdminComment"].removeprefix("allmende:")
    elapsed, gpus = int(row["ElapsedRaw"]), _sacct_gpus(row)
    slurm_charged = wait_for(lambda: platform.gpu_seconds(slurm_id), 60, "the Slurm job charged")
    assert slurm_charged == elapsed * gpus

    cluster_queue(kube, "twin", "h100", checks=[CHECK], gpus=8)
    wait_for(lambda: is_true(kube.get(f"{KUEUE}/clusterqueues/twin"), "Active"), 30, "the twin queue active")
    namespace = namespace_with_queue(kube, "twin-rich", "twin", labels={"allmende.io/project": "rich"})
    job = gpu_job(kube, "twin-rich", namespace, "twin", gpus=gpus, labels={MAX_EXEC_LABEL: "300"})
    admitted = await_workload(kube, job, "Admitted")
    kueue_id = f"kueue-{admitted['metadata']['uid']}"
    decision = platform.admission.state.decisions[kueue_id]
    assert (decision.verdict, decision.project, decision.gpus, decision.cluster) == (
        "admit", "rich", gpus, PLATFORM_CLUSTER,
    )  # fmt: skip
    began = int(time.time()) - elapsed - 5
    start(kube, job, began)
    wait_for(lambda: kueue_id in platform.admission.state.jobs, 30, "the platform to see the Kueue run")
    complete(kube, job, began + elapsed)
    kueue_charged = wait_for(lambda: platform.gpu_seconds(kueue_id), 60, "the Kueue job charged")
    assert kueue_charged == slurm_charged == elapsed * gpus
    delete(kube, job)
