"""What Allmende's AdmissionCheck adds to Kueue's admission (issue 30): the time from a workload's
quota reserved to its admission, with the check and without it, in the same run.

  Kubernetes  etcd, kube-apiserver and Kueue built by `make kubernetes` (allmende.testing.kubernetes)
  platform    the API process (`python -m allmende serve`, embedded chDB) on a local broker, with
              bench/admission.py's plan: one huge cluster `bench`, budgets no run can use up
  controller  `allmende kueue controller` as a process of its own (ALLMENDE_KUEUE_* settings)

Two ClusterQueues with the same quota (far more than the run asks for): `checked` names Allmende's
AdmissionCheck, `plain` names none. Jobs of 1-8 GPUs go to each in turn at --rate per second.
A watch on every Workload timestamps (on arrival, this process's monotonic clock) when each was
first seen with QuotaReserved and when first seen Admitted: without a check Kueue sets both in one
write (0 ms apart, the floor); with the check the controller sees the reservation, asks the
admission API (recorded in Kafka before it answers) and writes Ready, then Kueue admits.

Target (the issue): the p99 the check adds at most 100 ms. Printed; nothing asserted.

    .venv/bin/python bench/kueue_admission.py [--jobs 200] [--rate 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from admission import (
    PROJECTS,
    SCHEDULER_TOKEN,
    apply_plan,
    delete_topics,
    plan_yaml,
    platform_env,
    quarter,
    wait_http,
)
from rich.console import Console
from rich.progress import Progress

from allmende.core.kafka_local import LocalBroker, free_port
from allmende.core.supervisor import Child, python_module
from allmende.testing.kubernetes import KubeCluster, gpu_job_manifest, running_kubernetes

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
API = "kueue.x-k8s.io/v1beta2"
CHECK, FLAVOR, QUEUES = "allmende-budget", "h100", ("checked", "plain")
GPUS = (1, 2, 4, 8)
TARGET_MS = 100.0
HOUR = {"kueue.x-k8s.io/max-exec-time-seconds": "3600"}


def kube_objects(kube: KubeCluster) -> None:
    """The flavor, Allmende's AdmissionCheck, the two ClusterQueues and a namespace with a
    LocalQueue for each (the namespace labelled with a bench project)."""
    kube.apply(
        f"{KUEUE}/resourceflavors/{FLAVOR}",
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
    )
    kube.apply(
        f"{KUEUE}/admissionchecks/{CHECK}",
        {
            "apiVersion": API,
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {"controllerName": "allmende.io/budget"},
        },
    )
    for queue in QUEUES:
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "100000"},
                                {"name": "nvidia.com/gpu", "nominalQuota": "100000"},
                            ],
                        }
                    ],
                }
            ],
        }
        if queue == "checked":
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
        kube.apply(
            f"{KUEUE}/clusterqueues/{queue}",
            {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": queue}, "spec": spec},
        )
        kube.apply(
            f"/api/v1/namespaces/{queue}",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": queue, "labels": {"allmende.io/project": PROJECTS[0]}},
            },
        )
        kube.apply(
            f"{KUEUE}/namespaces/{queue}/localqueues/team",
            {
                "apiVersion": API,
                "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": queue},
                "spec": {"clusterQueue": queue},
            },
        )


class Stamps:
    """First sight of each workload's QuotaReserved and Admitted, from a watch."""

    def __init__(self) -> None:
        self.reserved: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.ready: dict[str, float] = {}  # our check first seen Ready
        self.queue: dict[str, str] = {}
        self.stop = threading.Event()

    def watch(self, kube: KubeCluster, version: str) -> None:
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "false"}
        with kube.http.stream("GET", f"{KUEUE}/workloads", params=params, timeout=None) as stream:
            for line in stream.iter_lines():
                seen = time.perf_counter()
                if self.stop.is_set():
                    return
                if not line:
                    continue
                obj = json.loads(line)["object"]
                uid = obj["metadata"]["uid"]
                self.queue.setdefault(uid, obj["metadata"]["namespace"])
                conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
                if conditions.get("QuotaReserved") == "True":
                    self.reserved.setdefault(uid, seen)
                if conditions.get("Admitted") == "True":
                    self.admitted.setdefault(uid, seen)
                checks = {c["name"]: c["state"] for c in obj.get("status", {}).get("admissionChecks") or []}
                if checks.get(CHECK) == "Ready":
                    self.ready.setdefault(uid, seen)

    def split_ms(self) -> tuple[list[float], list[float]]:
        """With the check: reserved -> Ready (the controller and the admission API), Ready ->
        admitted (Kueue)."""
        both = [u for u in self.admitted if u in self.ready and u in self.reserved]
        ours = sorted(1000 * (self.ready[u] - self.reserved[u]) for u in both)
        kueue = sorted(1000 * (self.admitted[u] - self.ready[u]) for u in both)
        return ours, kueue

    def latencies_ms(self, queue: str) -> list[float]:
        return sorted(
            1000 * (self.admitted[u] - self.reserved[u])
            for u, q in self.queue.items()
            if q == queue and u in self.admitted and u in self.reserved
        )


def controller_timings(log: Path) -> dict[str, list[float]]:
    """The admission API's answer (`ask_ms`) and the check's write (`write_ms`) of each check the
    controller set, from its log lines (`kueue_check_set`)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return {
        f"admission API {name}" if name == "ask" else f"status {name}": sorted(
            float(x) for x in re.findall(rf'{name}_ms["=: ]+([0-9.]+)', text)
        )
        for name in ("ask", "write")
    }


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200, help="jobs per queue")
    parser.add_argument("--rate", type=float, default=4.0, help="jobs per second (both queues together)")
    args = parser.parse_args()
    say = Console(highlight=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-kueue-"))
    tag = f"kq{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        broker = LocalBroker(tmp / "kafka", port=free_port(), controller_port=free_port())
        bootstrap = broker.start()
        stack.callback(broker.stop)
        stack.callback(delete_topics, bootstrap, tag)
        port = free_port()
        api = Child(
            python_module("allmende", "serve", "--port", str(port)),
            tmp / "api.log",
            platform_env(bootstrap, tmp, tag, state_dir=str(tmp / "api-state"), log_level="WARNING"),
            session=True,
        )
        stack.callback(api.stop)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", api, tmp / "api.log")
        apply_plan(url, plan_yaml(quarter(dt.datetime.now(dt.UTC))))

        kube = stack.enter_context(running_kubernetes(tmp / "kube"))
        kube_objects(kube)
        controller_env = {
            "ALLMENDE_KUEUE_API_URL": url,
            "ALLMENDE_KUEUE_TOKEN": SCHEDULER_TOKEN,
            "ALLMENDE_KUEUE_KUBECONFIG": str(kube.kubeconfig),
            "ALLMENDE_KUEUE_CLUSTER": "bench",
            "ALLMENDE_KUEUE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "ALLMENDE_KUEUE_TOPIC_PREFIX": tag,
            "ALLMENDE_KUEUE_SPOOL_DIR": str(tmp / "spool"),
            "ALLMENDE_KUEUE_METRICS_PORT": "0",
            "ALLMENDE_LOG_LEVEL": "INFO",
        }
        controller = Child(
            python_module("allmende", "kueue", "controller"),
            tmp / "controller.log",
            {**platform_env(bootstrap, tmp, tag), **controller_env},
            session=True,
        )
        stack.callback(controller.stop)
        for queue in QUEUES:  # the checked queue is active once the controller marks its check
            deadline = time.monotonic() + 60
            while not any(
                c["type"] == "Active" and c["status"] == "True"
                for c in kube.get(f"{KUEUE}/clusterqueues/{queue}").get("status", {}).get("conditions", [])
            ):
                if time.monotonic() > deadline:
                    say.print(f"ClusterQueue {queue} never became active (see {tmp / 'controller.log'})")
                    return 1
                time.sleep(0.2)

        stamps = Stamps()
        version = kube.get(f"{KUEUE}/workloads")["metadata"]["resourceVersion"]
        watcher = threading.Thread(target=stamps.watch, args=(kube, version), daemon=True)
        watcher.start()
        total = 2 * args.jobs
        with Progress(console=say, transient=True) as progress:
            task = progress.add_task("jobs", total=total)
            t0 = time.perf_counter()
            for n in range(total):
                due = t0 + n / args.rate
                time.sleep(max(0.0, due - time.perf_counter()))
                queue = QUEUES[n % 2]
                job = gpu_job_manifest(queue, "team", f"j{n}", GPUS[(n // 2) % 4], labels=HOUR)
                kube.create(f"/apis/batch/v1/namespaces/{queue}/jobs", job)
                progress.update(task, completed=n + 1)
            deadline = time.monotonic() + 120
            while len(stamps.admitted) < total and time.monotonic() < deadline:
                time.sleep(0.2)
        stamps.stop.set()

    say.print(f"{total:,} jobs at {args.rate:g}/s, half to each queue; admitted {len(stamps.admitted):,}")
    rows = {q: stamps.latencies_ms(q) for q in QUEUES}
    say.print(f"{'queue':<10} {'admitted':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for queue, values in rows.items():
        say.print(
            f"{queue:<10} {len(values):>8} {percentile(values, 0.5):>8.1f} {percentile(values, 0.99):>8.1f} "
            f"{(max(values) if values else float('nan')):>8.1f}"
        )
    added = percentile(rows["checked"], 0.99) - percentile(rows["plain"], 0.99)
    added_p50 = percentile(rows["checked"], 0.5) - percentile(rows["plain"], 0.5)
    met = added <= TARGET_MS
    say.print(
        f"added by the check: p50 {added_p50:.1f} ms, p99 {added:.1f} ms "
        f"(target at most {TARGET_MS:.0f} ms: {'met' if met else 'NOT met'}); "
        f"mean {statistics.fmean(rows['checked'] or [float('nan')]):.1f} ms"
    )
    ours, kueue = stamps.split_ms()
    say.print(
        f"  of which reserved -> check Ready (controller + admission API): p50 {percentile(ours, 0.5):.1f} "
        f"p99 {percentile(ours, 0.99):.1f} ms; Ready -> admitted (Kueue): p50 {percentile(kueue, 0.5):.1f} "
        f"p99 {percentile(kueue, 0.99):.1f} ms"
    )
    timings = controller_timings(tmp / "controller.log")
    say.print(
        "  the controller's calls (its log): "
        + "; ".join(
            f"{name} p50 {percentile(v, 0.5):.1f} p99 {percentile(v, 0.99):.1f} ms"
            for name, v in timings.items()
        )
    )
    say.print(f"logs: {tmp}")
    return 0 if len(stamps.admitted) == total else 1


if __name__ == "__main__":
    sys.exit(main())
