"""Allmende's AdmissionCheck controller on the real stack: etcd, kube-apiserver and Kueue (tests/kueue
conftest), the platform (API with its ledger writer, a meter worker) on the test broker and chDB,
and `allmende kueue controller` (integrations/kueue/controller.py) in a thread of this process.

The plan is the Slurm tests' (8 H100 GPUs in the platform's cluster `k8s-test`): rich has budget,
broke and spent are over budget, lab is inside its time-slice window all quarter (8 GPUs). Each test
has its own ClusterQueue (Kueue's quota: 16 GPUs, more than the platform's 8, unless it says
otherwise) and namespaces, labelled with their project. No kubelet: what the job controller and
the kubelet would write (a Job's start, its completion) the tests write (tests/kueue/objects.py).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from allmende.core.kafka_local import free_port
from allmende.core.metrics import KUEUE_ERRORS
from allmende.integrations.kueue.config import Flavor, KueueConfig
from allmende.integrations.kueue.controller import NOTE, Controller, admission_client, kubernetes_client
from allmende.integrations.kueue.lifecycle import RUN_STARTED
from allmende.integrations.kueue.workloads import ask_of
from allmende.integrations.slurm.local import current_quarter, plan_text
from allmende.integrations.spool import Spool
from allmende.testing.budget_harness import ADMIN, ok
from allmende.testing.kubernetes import KubeCluster
from allmende.testing.slurm_harness import TOKEN, Platform, running_platform, wait_for
from tests.kueue.objects import (
    KUEUE,
    KUEUE_API,
    MAX_EXEC_LABEL,
    await_workload,
    check_message,
    check_states,
    cluster_queue,
    complete,
    current,
    delete,
    flavor,
    gpu_job,
    is_true,
    namespace_with_queue,
    start,
    stop_pods,
    workload_of,
)

CLUSTER = "k8s-test"
CHECK = "allmende-budget"
FLAVOR = "h100"
HOUR = {MAX_EXEC_LABEL: "3600"}
PREEMPTIBLE = {"allmende.io/priority-class": "preemptible"}


@pytest.fixture(scope="module")
def platform(
    kafka_bootstrap: str, chdb_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """The API (real clock) with the quarter's plan for `k8s-test`, and a meter worker."""
    text = plan_text(dt.datetime.now(dt.UTC), "kueue-test", cluster=CLUSTER)
    tmp = tmp_path_factory.mktemp("kueue-platform")
    with running_platform(
        kafka_bootstrap, chdb_dsn, tmp, text, prefix="k", write_timeout_ms=3000
    ) as platform:
        yield platform


@pytest.fixture(scope="module")
def budget_check(kube: KubeCluster) -> str:
    """Allmende's AdmissionCheck and the GPU flavor (deploy/kubernetes/admission-check.yaml's)."""
    kube.apply(f"{KUEUE}/admissionchecks/{CHECK}", {
        "apiVersion": KUEUE_API, "kind": "AdmissionCheck", "metadata": {"name": CHECK},
        "spec": {"controllerName": "allmende.io/budget"},
    })  # fmt: skip
    flavor(kube, FLAVOR)
    return CHECK


@pytest.fixture
def controllers(
    kube: KubeCluster, platform: Platform, budget_check: str, tmp_path: Path
) -> Iterator[Callable[..., AbstractContextManager[Controller]]]:
    """Start a controller (in a thread; stopped on leaving): the same spool each time in a test;
    keyword arguments change its configuration."""
    settings = platform.settings
    config = KueueConfig(
        api_url=platform.url, token=TOKEN, kubeconfig=kube.kubeconfig, cluster=CLUSTER,
        flavors={FLAVOR: Flavor(gpu_type="H100")}, kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        topic_prefix=settings.topic_prefix, spool_dir=tmp_path / "spool", retry_after_s=1, resync_s=1.0,
        producer="allmende-kueue-test",
    )  # fmt: skip

    @contextmanager
    def running(**changes: Any) -> Iterator[Controller]:
        controller = built(config.model_copy(update=changes))
        thread = threading.Thread(target=controller.run, name="kueue-controller", daemon=True)
        thread.start()
        try:
            wait_for(lambda: CHECK in controller.checks, 15, "the controller to find its check")
            yield controller
        finally:
            controller.stop()
            thread.join(10)

    yield running


def built(config: KueueConfig) -> Controller:
    return Controller(config, kubernetes_client(config), admission_client(config), Spool(config.spool_dir))


def queue_for(kube: KubeCluster, name: str, projects: list[str], gpus: int = 16) -> dict[str, str]:
    """A ClusterQueue `name` with the check (active once a controller marked the check), and a
    namespace per project with a LocalQueue in it: project -> namespace."""
    cluster_queue(kube, name, FLAVOR, checks=[CHECK], gpus=gpus, cpus=64)
    wait_for(lambda: is_true(kube.get(f"{KUEUE}/clusterqueues/{name}"), "Active"), 30, f"{name} active")
    spaces = {}
    for project in projects:
        namespace = f"{name}-{project}"
        namespace_with_queue(kube, namespace, name, labels={"allmende.io/project": project})
        spaces[project] = namespace
    return spaces


def job_id(kube: KubeCluster, job: dict[str, Any]) -> str:
    return f"kueue-{await_workload(kube, job)['metadata']['uid']}"


def now_s() -> int:
    return int(time.time())


def suspended(kube: KubeCluster, job: dict[str, Any]) -> bool:
    return bool(current(kube, job)["spec"].get("suspend"))


def annotation(kube: KubeCluster, job: dict[str, Any], key: str) -> str | None:
    value = (current(kube, job)["metadata"].get("annotations") or {}).get(key)
    return None if value is None else str(value)


def in_state(kube: KubeCluster, job: dict[str, Any], state: str) -> dict[str, Any] | None:
    """The Job's Workload once our check is in `state`."""
    workload = workload_of(kube, job)
    return workload if workload is not None and check_states(workload).get(CHECK) == state else None


def inactive(kube: KubeCluster, job: dict[str, Any]) -> dict[str, Any] | None:
    """The Job's Workload once deactivated (`spec.active: false`)."""
    workload = workload_of(kube, job)
    return workload if workload is not None and workload.get("spec", {}).get("active") is False else None


def verdict(platform: Platform, job: str) -> str | None:
    decided = platform.admission.state.decisions.get(job)
    return None if decided is None else str(decided.verdict)


def opportunistic_blocker(
    kube: KubeCluster, platform: Platform, namespace: str
) -> tuple[dict[str, Any], str, int]:
    """An over-budget, preemptible Job on all 8 GPUs (the opportunistic lane), running: the Job,
    its job id, its start."""
    blocker = gpu_job(kube, namespace, "team", "blocker", gpus=8, labels=HOUR, annotations=PREEMPTIBLE)
    await_workload(kube, blocker, "Admitted")
    blocker_id = job_id(kube, blocker)
    assert platform.admission.state.decisions[blocker_id].lane == "opportunistic"
    began = now_s()
    start(kube, blocker, began)
    wait_for(lambda: running_in_platform(platform, blocker_id), 30, "the platform to see the blocker run")
    return blocker, blocker_id, began


def charged_until_preempted(platform: Platform, job: str, began: int, gpus: int) -> None:
    """The job's run charged exactly from its start to its preemption (as the platform has it)."""
    charged = wait_for(lambda: platform.gpu_seconds(job), 60, f"{job}'s run charged")
    seen = platform.admission.state.jobs[job]
    assert seen.preemptions and charged == (seen.preemptions[-1][0] - began) * gpus


def run_and_charge(
    kube: KubeCluster, platform: Platform, job: dict[str, Any], job_id: str, seconds: int, gpus: int
) -> None:
    """The Job runs `seconds` from now (as the kubelet would say) and is charged exactly that."""
    ran = now_s()
    start(kube, job, ran)
    wait_for(lambda: running_in_platform(platform, job_id), 30, f"the platform to see {job_id} run")
    complete(kube, job, ran + seconds)
    wait_for(lambda: platform.gpu_seconds(job_id) == seconds * gpus, 60, f"{job_id}'s run charged")


def let_go(kube: KubeCluster, platform: Platform, *jobs: dict[str, Any]) -> None:
    """Delete the Jobs (the controller running) and wait until the platform holds no GPU for any
    of their workloads' job ids: the next test finds the cluster free."""
    uids = [w["metadata"]["uid"] for j in jobs if (w := workload_of(kube, j)) is not None]
    for job in jobs:
        delete(kube, job)

    def free() -> bool:
        state = platform.admission.state
        ids = [j for j in list(state.decisions) if any(j.startswith(f"kueue-{uid}") for uid in uids)]
        return not any((seen := state.jobs.get(j)) is not None and seen.may_hold_gpus() for j in ids)

    wait_for(free, 30, "the platform to let go of the deleted Jobs")


def running_in_platform(platform: Platform, job: str) -> bool:
    seen = platform.admission.state.jobs.get(job)
    return seen is not None and seen.started and not seen.finished


# -- the tests ------------------------------------------------------------------------------------
def test_a_job_within_budget_is_admitted_unsuspended_and_metered_exactly(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    with controllers():
        spaces = queue_for(kube, "cq-admit", ["rich"])
        job = gpu_job(kube, spaces["rich"], "team", "train", gpus=2, labels=HOUR)
        assert job["spec"]["suspend"] is True
        admitted = await_workload(kube, job, "Admitted")
        assert check_states(admitted) == {CHECK: "Ready"}
        assert check_message(admitted, CHECK).startswith("allmende: admit: admitted in the budget lane")
        wait_for(lambda: not suspended(kube, job), 30, "the Job unsuspended")
        jid = f"kueue-{admitted['metadata']['uid']}"
        decision = platform.admission.state.decisions[jid]
        assert (decision.verdict, decision.project, decision.gpus, decision.gpu_type, decision.cluster) == (
            "admit", "rich", 2, "H100", CLUSTER,
        )  # fmt: skip
        assert decision.requested_seconds == 3600

        began = now_s() - 30
        start(kube, job, began)
        wait_for(
            lambda: annotation(kube, job, RUN_STARTED) == str(began), 30, "the run's start kept on the Job"
        )
        wait_for(lambda: running_in_platform(platform, jid), 30, "the platform to see the run")
        complete(kube, job, began + 17)
        wait_for(lambda: platform.gpu_seconds(jid) == 17 * 2, 60, "the ledger to charge the run")
    assert platform.admission.state.decisions[jid].attempt == 1


def test_an_over_budget_job_is_rejected_with_the_sentence_and_never_unsuspended(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    with controllers():
        spaces = queue_for(kube, "cq-reject", ["broke"])
        job = gpu_job(kube, spaces["broke"], "team", "big", gpus=2, labels=HOUR,
                      annotations={"allmende.io/priority-class": "non-preemptible"})  # fmt: skip
        # Kueue deactivates a workload whose check is Rejected (and resets the check as it evicts)
        workload = wait_for(lambda: inactive(kube, job), 30, "Kueue to deactivate the workload")
        why = [c.get("message", "") for c in workload.get("status", {}).get("conditions", [])]
        assert f"Admission check(s): {CHECK}, were rejected" in " ".join(why), why
        decision = platform.admission.state.decisions[f"kueue-{workload['metadata']['uid']}"]
        assert decision.verdict == "reject"
        sentence = " ".join(r.message for r in decision.reasons)
        assert "Over budget only preemptible jobs may run" in sentence
        # The researcher reads the sentence on the Job, and in the Workload's events (Kueue's).
        assert annotation(kube, job, NOTE) == f"allmende: reject: {sentence}"
        events = kube.get(f"/api/v1/namespaces/{spaces['broke']}/events")["items"]
        said = [e["message"] for e in events if e["involvedObject"]["name"] == workload["metadata"]["name"]]
        assert any(sentence in m for m in said), said
        time.sleep(1.5)
        assert suspended(kube, job) and not is_true(workload_of(kube, job) or {}, "Admitted")
        let_go(kube, platform, job)


def test_a_queued_job_is_retried_and_admitted_once_budget_frees_preempting_the_opportunistic_one(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    with controllers():
        spaces = queue_for(kube, "cq-queue", ["spent", "broke"])
        # Over budget and preemptible on all 8 GPUs: the opportunistic lane.
        blocker, blocker_id, began = opportunistic_blocker(kube, platform, spaces["spent"])

        # Over budget, preemptible, no idle GPUs: queued; Kueue's quota has room, the check says Retry.
        small = gpu_job(kube, spaces["broke"], "team", "small", gpus=4, labels=HOUR, annotations=PREEMPTIBLE)
        small_id = job_id(kube, small)
        wait_for(lambda: verdict(platform, small_id) == "queue", 30, "the queue answer")
        retried = wait_for(lambda: in_state(kube, small, "Retry"), 30, "the check set to Retry")
        assert "waits in the queue" in check_message(retried, CHECK)
        # Kueue requeues it after a second; asked again with a dry run: still queued, nothing recorded
        time.sleep(3)
        assert platform.admission.state.decisions[small_id].attempt == 1
        assert suspended(kube, small)

        period = current_quarter(dt.datetime.now(dt.UTC))
        grant = {"project": "broke", "allocation_id": "broke-kueue", "gpu_hours": 1000, "period": period,
                 "reason": "test: more GPU-hours for broke"}  # fmt: skip
        ok(httpx.post(f"{platform.url}/v1/admin/allocations", json=grant, headers=ADMIN, timeout=30))
        admitted = await_workload(kube, small, "Admitted", timeout=60)
        decision = platform.admission.state.decisions[small_id]
        assert (decision.verdict, decision.lane, decision.attempt) == ("admit", "budget", 2)
        assert [v.job_id for v in decision.preempt] == [blocker_id]
        assert check_states(admitted) == {CHECK: "Ready"}
        wait_for(lambda: not suspended(kube, small), 30, "the admitted Job unsuspended")

        # The blocker evicted through its check (Retry, with the reason), its Job suspended, its run charged.
        wait_for(lambda: suspended(kube, blocker), 30, "Kueue to suspend the preempted blocker")
        # (said on the Job until its pods stop and it asks again, as a new request)
        assert (annotation(kube, blocker, NOTE) or "").startswith(f"allmende: preempted for {small_id}")
        stop_pods(kube, blocker, now_s())
        wait_for(lambda: not running_in_platform(platform, blocker_id), 30, "the platform to see the run end")
        charged_until_preempted(platform, blocker_id, began, 8)
        run_and_charge(kube, platform, small, small_id, seconds=1, gpus=4)
        let_go(kube, platform, blocker, small)


def test_a_time_slice_window_evicts_an_opportunistic_workload_and_admits_the_windows(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    # Kueue's quota is the platform's 8 GPUs: lab's workload gets no quota while the blocker runs,
    # so its check is never reached; the controller's dry run at a resync finds the victims.
    with controllers():
        spaces = queue_for(kube, "cq-window", ["spent", "lab"], gpus=8)
        blocker, blocker_id, began = opportunistic_blocker(kube, platform, spaces["spent"])

        window = gpu_job(kube, spaces["lab"], "team", "window", gpus=8, labels=HOUR)
        window_id = job_id(kube, window)
        # The controller's dry run at a resync names the blocker; its check set to Retry, Kueue
        # suspends it; the job controller stops its pods; Kueue gives lab the quota; the check admits.
        wait_for(lambda: suspended(kube, blocker), 30, "Kueue to suspend the opportunistic blocker")
        assert (annotation(kube, blocker, NOTE) or "").startswith(f"allmende: preempted for {window_id}")
        stop_pods(kube, blocker, now_s())
        admitted = await_workload(kube, window, "Admitted", timeout=60)
        assert check_states(admitted) == {CHECK: "Ready"}
        decision = platform.admission.state.decisions[window_id]
        assert (decision.verdict, decision.lane) == ("admit", "time-slice")
        wait_for(lambda: not suspended(kube, window), 30, "the window's Job unsuspended")
        assert [v.job_id for v in decision.preempt] == [blocker_id]
        assert suspended(kube, blocker)  # asked again as a new request: queued behind lab's window
        wait_for(lambda: "0 idle" in (annotation(kube, blocker, NOTE) or ""), 30, "the blocker queued")
        charged_until_preempted(platform, blocker_id, began, 8)
        run_and_charge(kube, platform, window, window_id, seconds=2, gpus=8)
        let_go(kube, platform, blocker, window)


def test_a_controller_restarted_between_the_answer_and_the_status_decides_nothing_twice(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    with controllers():  # the check active (Kueue keeps the queue inactive until then)
        spaces = queue_for(kube, "cq-restart", ["rich"])
    job = gpu_job(kube, spaces["rich"], "team", "train", gpus=1, labels=HOUR)
    reserved = await_workload(kube, job, "QuotaReserved")
    assert check_states(reserved) == {CHECK: "Pending"}  # no controller yet
    # A controller asks and stops before writing the check (as a crash there would).
    first = built(KueueConfig(api_url=platform.url, token=TOKEN, kubeconfig=kube.kubeconfig, cluster=CLUSTER,
                              flavors={FLAVOR: Flavor(gpu_type="H100")}))  # fmt: skip
    namespace = kube.get(f"/api/v1/namespaces/{spaces['rich']}")
    answer = first.ask(ask_of(reserved, current(kube, job), namespace, first.config), dry_run=False)
    jid = f"kueue-{reserved['metadata']['uid']}"
    assert (answer["verdict"], answer["job_id"], answer["attempt"]) == ("admit", jid, 1)
    with controllers():  # the next controller asks again: the same answer, nothing decided twice
        admitted = await_workload(kube, job, "Admitted")
        assert check_states(admitted) == {CHECK: "Ready"}
    decided = platform.admission.state.decisions[jid]
    assert (decided.attempt, decided.occurred_at) == (1, answer["decided_at"])
    with controllers():  # and one more, with the check Ready: it does not ask at all
        time.sleep(2.5)
    assert platform.admission.state.decisions[jid].occurred_at == answer["decided_at"]
    ran = now_s()
    start(kube, job, ran)
    with controllers():
        wait_for(lambda: running_in_platform(platform, jid), 30, "the platform to see the run")
        complete(kube, job, ran + 1)
        wait_for(lambda: platform.gpu_seconds(jid) == 1, 60, "the run charged")


# -- faults ---------------------------------------------------------------------------------------
def errors(kind: str) -> float:
    return float(KUEUE_ERRORS.labels(kind=kind)._value.get())  # the process's own counter


def test_with_the_admission_api_away_the_check_stays_pending_and_nothing_is_decided(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]]
) -> None:
    with controllers():
        spaces = queue_for(kube, "cq-api-away", ["rich"])
    job = gpu_job(kube, spaces["rich"], "team", "train", gpus=1, labels=HOUR)
    before = errors("admission")
    with controllers(api_url=f"http://127.0.0.1:{free_port()}"):  # nobody listens there
        reserved = await_workload(kube, job, "QuotaReserved")
        wait_for(lambda: errors("admission") >= before + 2, 30, "the controller to try (and try again)")
        assert check_states(workload_of(kube, job) or {}) == {CHECK: "Pending"}
        assert suspended(kube, job)
    jid = f"kueue-{reserved['metadata']['uid']}"
    assert jid not in platform.admission.state.decisions
    with controllers():  # the API back: asked, admitted
        await_workload(kube, job, "Admitted")
        assert platform.admission.state.decisions[jid].verdict == "admit"
        let_go(kube, platform, job)


def test_with_kafka_away_the_runs_wait_in_the_spool_and_are_charged_exactly_after(
    kube: KubeCluster, platform: Platform, controllers: Callable[..., AbstractContextManager[Controller]],
    tmp_path: Path,
) -> None:  # fmt: skip
    with controllers():
        spaces = queue_for(kube, "cq-kafka-away", ["rich"])
        job = gpu_job(kube, spaces["rich"], "team", "train", gpus=2, labels=HOUR)
        jid = f"kueue-{await_workload(kube, job, 'Admitted')['metadata']['uid']}"
    began = now_s() - 20
    with controllers(kafka_bootstrap_servers=f"127.0.0.1:{free_port()}", send_timeout_s=1.0):  # no broker
        start(kube, job, began)
        complete(kube, job, began + 11)
        spool = Spool(tmp_path / "spool")
        wait_for(lambda: len(spool.pending()) >= 3, 30, "the run's events in the spool")
        time.sleep(2)
        assert platform.gpu_seconds(jid) is None and len(spool.pending()) >= 3
    with controllers():  # Kafka back: the spool is sent, the run charged once
        wait_for(lambda: platform.gpu_seconds(jid) == 11 * 2, 60, "the run charged")
        wait_for(lambda: not Spool(tmp_path / "spool").pending(), 30, "the spool emptied")
        time.sleep(1)
        assert platform.gpu_seconds(jid) == 22
        let_go(kube, platform, job)
