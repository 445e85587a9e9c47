"""What a Kueue Workload is to the platform, and what the controller writes back: pure functions
of the objects as the API server returns them (dicts), tested directly.

One function (`ask_of`) gives both the admission request and the lifecycle events' attribution, so
a workload is charged as it was admitted. The job id is `kueue-<workload uid>`: a Workload is one
request (Kueue makes a new one, with a new uid, when a Job's pod template changes), and the same
id asked twice gets the same answer. A run ended by preemption makes the next admission a new
request (`kueue-<uid>-<n>` after n such runs, counted on the Job: PREEMPTIONS), else a preempted
workload would be answered its old admit when Kueue requeues it, and run again on the GPUs it was
preempted to free.

Where each field comes from, first found wins (labels, then annotations; the Workload, then its
Job, then its namespace; Kueue copies only some of a Job's labels to its Workload):
- project: `project_key`, else the namespace's name (`project_from_namespace`)
- user: `user_key`, else the namespace's name
- GPUs: the quota Kueue reserved (`status.admission.podSetAssignments[].resourceUsage` of the
  GPU resources), else the pod sets' requests times their counts (a workload still waiting for quota)
- GPU type and cluster: the ResourceFlavor of the GPU resource (`flavors`), else the defaults
- hours: `spec.maximumExecutionTimeSeconds` (Kueue's `kueue.x-k8s.io/max-exec-time-seconds`),
  `hours_key`, the Job's `activeDeadlineSeconds`, `default_hours`; none: the workload is rejected
- priority class: `priority_key`, else the Workload's priority class (`priority_classes`), else the default
- interactive: `interactive_key` = "true"
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from allmende.integrations.kueue.config import KueueConfig
from allmende.schemas.events import MAX_GPUS

Obj = Mapping[str, Any]
KUEUE_API = "kueue.x-k8s.io/v1beta2"
MAX_HOURS = Decimal(366 * 24)
MESSAGE_MAX = 32_768  # Kueue's limit on a check's message
_IDENTIFIER = re.compile(r"^[A-Za-z0-9._:@/+-]{1,200}$")


class NotAskable(ValueError):
    """The workload cannot be asked about as it is (the reason, for the workload's check)."""


@dataclass(frozen=True)
class Ask:
    """One workload as an admission request (the fields of `POST /v1/admission`)."""

    job_id: str
    project: str
    user: str
    cluster: str
    gpu_type: str
    gpus: int
    priority_class: str
    interactive: bool
    requested_hours: Decimal

    def body(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "project": self.project, "user": self.user, "cluster": self.cluster,
            "gpu_type": self.gpu_type, "gpus": self.gpus, "priority_class": self.priority_class,
            "interactive": self.interactive, "requested_hours": str(self.requested_hours),
        }  # fmt: skip

    @property
    def requested_seconds(self) -> int:
        return math.ceil(self.requested_hours * 3600)


PREEMPTIONS = "allmende.io/preemptions"  # the Job's annotation: its runs ended by preemption
_JOB_ID = re.compile(r"^kueue-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?:-(\d+))?$")


def preemptions(job: Obj | None) -> int:
    value = str(((job or {}).get("metadata") or {}).get("annotations", {}).get(PREEMPTIONS) or "0")
    return int(value) if value.isdigit() else 0


def kueue_job_id(workload_uid: str, preempted_runs: int) -> str:
    """`kueue-<workload uid>`, and `-<n>` after n runs ended by preemption."""
    return f"kueue-{workload_uid}" + (f"-{preempted_runs}" if preempted_runs else "")


def job_id_of(workload: Obj, job: Obj | None = None) -> str:
    return kueue_job_id(workload["metadata"]["uid"], preemptions(job))


def uid_of_job_id(job_id: str) -> str | None:
    """The Workload uid behind one of this controller's job ids; None for other schedulers' jobs."""
    found = _JOB_ID.match(job_id)
    return found.group(1) if found else None


# -- reading --------------------------------------------------------------------------------------
def condition(obj: Obj, kind: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c  # type: ignore[no-any-return]
    return None


def is_true(obj: Obj, kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c.get("status") == "True"


def check_state(workload: Obj, check: str) -> Obj | None:
    """The workload's state of the AdmissionCheck named `check` (None: the workload has no such check)."""
    for state in (workload.get("status") or {}).get("admissionChecks") or ():
        if state.get("name") == check:
            return state  # type: ignore[no-any-return]
    return None


def instant(stamp: str | None) -> int | None:
    """An RFC 3339 timestamp of the API server as UTC seconds."""
    if not stamp:
        return None
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


def quantity(value: Any) -> int:
    """A whole-number resource quantity ("4", 4, "4000m"); GPUs are never fractional."""
    text = str(value).strip()
    try:
        number = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation:
        raise NotAskable(f"the quantity {text!r} is not a number of GPUs") from None
    if number != number.to_integral_value() or number < 0:
        raise NotAskable(f"the quantity {text!r} is not a whole number of GPUs")
    return int(number)


def _lookup(key: str, sources: Sequence[Obj | None]) -> str | None:
    for obj in sources:
        if obj is None:
            continue
        meta = obj.get("metadata") or {}
        for part in ("labels", "annotations"):
            value = (meta.get(part) or {}).get(key)
            if value not in (None, ""):
                return str(value)
    return None


def _pod_gpus(template: Obj, resources: Sequence[str]) -> int:
    """GPUs one pod asks for: its containers' requests (limits where there is no request)."""
    spec = template.get("spec") or {}
    total = 0
    for container in spec.get("containers") or ():
        res = container.get("resources") or {}
        for name in resources:
            value = (res.get("requests") or {}).get(name, (res.get("limits") or {}).get(name))
            if value is not None:
                total += quantity(value)
    return total


def gpus_and_flavor(workload: Obj, config: KueueConfig) -> tuple[int, str | None]:
    """GPUs of the whole workload and the flavor they were reserved in (None before quota)."""
    resources = config.gpu_resources
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments")
    if assignments:
        gpus, flavor = 0, None
        for a in assignments:
            for name in resources:
                if name in (a.get("resourceUsage") or {}):
                    gpus += quantity(a["resourceUsage"][name])
                    flavor = flavor or (a.get("flavors") or {}).get(name)
        return gpus, flavor
    gpus = 0
    for pod_set in (workload.get("spec") or {}).get("podSets") or ():
        gpus += int(pod_set.get("count", 1)) * _pod_gpus(pod_set.get("template") or {}, resources)
    return gpus, None


def _hours(workload: Obj, job: Obj | None, sources: Sequence[Obj | None], config: KueueConfig) -> Decimal:
    limit = (workload.get("spec") or {}).get("maximumExecutionTimeSeconds")
    if limit:
        return Decimal(int(limit)) / 3600
    if (annotated := _lookup(config.hours_key, sources)) is not None:
        try:
            hours = Decimal(annotated)
        except InvalidOperation:
            raise NotAskable(f"{config.hours_key}={annotated!r} is not a number of hours") from None
        if not 0 < hours <= MAX_HOURS:
            raise NotAskable(f"{config.hours_key}={annotated!r} is not between 0 and {MAX_HOURS} hours")
        return hours
    deadline = ((job or {}).get("spec") or {}).get("activeDeadlineSeconds")
    if deadline:
        return Decimal(int(deadline)) / 3600
    if config.default_hours is not None:
        return Decimal(str(config.default_hours))
    raise NotAskable(
        "the workload has no time limit: set the Job's label kueue.x-k8s.io/max-exec-time-seconds,"
        f" its activeDeadlineSeconds or the annotation {config.hours_key} (hours)"
    )


def ask_of(workload: Obj, job: Obj | None, namespace: Obj | None, config: KueueConfig) -> Ask:
    """The admission request for a workload (NotAskable: why it cannot be asked about)."""
    sources = (workload, job, namespace)
    ns = str(workload["metadata"].get("namespace", ""))
    project = _lookup(config.project_key, sources) or (ns if config.project_from_namespace else None)
    if not project:
        raise NotAskable(f"the workload names no project: label it (or its namespace) {config.project_key}")
    user = _lookup(config.user_key, sources) or ns
    gpus, flavor = gpus_and_flavor(workload, config)
    if not 1 <= gpus <= MAX_GPUS:
        raise NotAskable(
            f"the workload asks for {gpus} GPUs ({', '.join(config.gpu_resources)}): not a GPU job"
            if gpus == 0
            else f"the workload asks for {gpus:,} GPUs, more than any cluster ({MAX_GPUS:,})"
        )
    mapped = config.flavors.get(flavor) if flavor else None
    cluster = (mapped.cluster if mapped else None) or config.cluster
    gpu_type = mapped.gpu_type if mapped else config.default_gpu_type
    priority = _lookup(config.priority_key, sources)
    if priority is None:
        ref = ((workload.get("spec") or {}).get("priorityClassRef") or {}).get("name")
        priority = config.priority_classes.get(ref, config.default_priority_class) if ref else None
    priority = priority or config.default_priority_class
    if priority not in ("preemptible", "standard", "non-preemptible"):
        raise NotAskable(f"{config.priority_key}={priority!r}: not preemptible, standard or non-preemptible")
    for name, value in (("project", project), ("user", user), ("cluster", cluster), ("GPU type", gpu_type)):
        if not _IDENTIFIER.match(value):
            raise NotAskable(f"the {name} {value!r} is not an identifier (letters, digits, ._:@/+-)")
    return Ask(
        job_id=job_id_of(workload, job), project=project, user=user, cluster=cluster, gpu_type=gpu_type,
        gpus=gpus, priority_class=priority,
        interactive=(_lookup(config.interactive_key, sources) or "").lower() == "true",
        requested_hours=_hours(workload, job, sources, config),
    )  # fmt: skip


def owner_job(workload: Obj) -> tuple[str, str] | None:
    """(name, uid) of the batch/v1 Job that owns the workload, if one does."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref["name"]), str(ref["uid"])
    return None


# -- writing --------------------------------------------------------------------------------------
def check_patch(
    workload: Obj, check: str, state: str, message: str, now: dt.datetime, requeue_after_s: int | None = None
) -> dict[str, Any]:
    """A server-side apply body setting one check's state on the workload's status (only that
    entry: the list is a map keyed by name, each entry owned by whoever applied it)."""
    entry: dict[str, Any] = {
        "name": check,
        "state": state,
        "message": message[:MESSAGE_MAX],
        "lastTransitionTime": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if state == "Retry" and requeue_after_s is not None:
        entry["requeueAfterSeconds"] = requeue_after_s
    meta = workload["metadata"]
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": {"admissionChecks": [entry]},
    }


CHECK_STATE = {"admit": "Ready", "queue": "Retry", "reject": "Rejected"}


def check_message(answer: Mapping[str, Any]) -> str:
    """What the workload's check says: the verdict and the API's sentence for the researcher."""
    return f"allmende: {answer['verdict']}: {answer.get('sentence', '')}".strip()
