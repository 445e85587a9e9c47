"""The AdmissionCheck controller: Kueue asks, the platform's admission answers.

    allmende kueue controller [--config FILE] [--once]

1. Every AdmissionCheck whose `spec.controllerName` is ours (`controller_name`) is marked
   `Active=True` (until then Kueue keeps the ClusterQueues that name it inactive).
2. A Workload with quota reserved and one of our checks `Pending` is asked about
   (`POST /v1/admission`, the request from integrations/kueue/workloads.py, job id
   `kueue-<workload uid>`) and its check set by server-side apply (field manager FIELD_MANAGER):
   admit -> `Ready` (Kueue admits it and unsuspends the Job), queue -> `Retry` with
   `requeueAfterSeconds` = `retry_after_s` (Kueue releases the quota and requeues it), reject ->
   `Rejected` (Kueue deactivates it). The message is the API's sentence. A workload asked about
   before that was queued is asked with `?dry_run=true` first (records nothing), for real only when
   that answer is not `queue`, as the Slurm agent does. The API answers the same job id the same
   final answer: a controller restarted between the answer and the status write decides nothing twice.
3. Preemption: the victims an admit names that are Kueue workloads (`kueue-<uid>`) get our check
   `Retry` with the reason (Kueue evicts an admitted workload on `Retry`), in the planner's order.
   A workload that waits for quota Kueue cannot give (the quota is held by opportunistic workloads:
   the time-slice window or interactive lane the platform would preempt for) is asked with a dry
   run at each resync; an admit naming victims has them evicted, and Kueue then reserves its quota.
4. Lifecycle: each managed Job's runs become job events (integrations/kueue/lifecycle.py), put in
   the durable spool (integrations/spool.py) and sent to Kafka by a flusher thread (acks=all).

Watches on Workloads and Jobs (the official `kubernetes` client) queue a workload's key; one
worker reconciles; every `resync_s` every workload is queued again (what a watch missed, the
pending workloads' dry runs). What it holds in memory is bounded by what is live: the workloads
and jobs the API server holds, and, per workload, the events already spooled.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson
import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from allmende.core.metrics import (
    KUEUE,
    KUEUE_CHECKS_SET,
    KUEUE_DECIDE_SECONDS,
    KUEUE_ERRORS,
    KUEUE_JOB_EVENTS,
    register,
)
from allmende.integrations.kueue.config import KueueConfig
from allmende.integrations.kueue.lifecycle import RUN_STARTED, Plan, evicted_at, plan, plan_deleted
from allmende.integrations.kueue.workloads import (
    CHECK_STATE,
    Ask,
    NotAskable,
    Obj,
    ask_of,
    check_message,
    check_patch,
    check_state,
    is_true,
    job_id_of,
    kueue_job_id,
    owner_job,
    preemptions,
    uid_of_job_id,
)
from allmende.integrations.spool import Spool
from allmende.schemas.events import encode_event

log = structlog.get_logger("allmende.kueue")

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
FIELD_MANAGER = "allmende-kueue"
MANAGED = "kueue.x-k8s.io/queue-name"  # the label of a Job Kueue manages
NOTE = "allmende.io/admission"  # the Job's annotation: the latest verdict or preemption, with its reason
NOTE_MAX = 4096


class AdmissionUnavailable(RuntimeError):
    """The admission API did not answer (away, starting, a standby): ask again later."""


@dataclass
class Controller:
    config: KueueConfig
    api: k8s.ApiClient
    admission: httpx.Client
    spool: Spool
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    checks: set[str] = field(default_factory=set)  # names of our AdmissionChecks
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # "ns/name" -> Workload
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # Job uid -> Job
    namespaces: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    queued: set[str] = field(default_factory=set)  # job ids whose last real answer was queue
    evicting: set[str] = field(default_factory=set)  # victims whose check we set to Retry
    admitted: set[str] = field(default_factory=set)  # job ids whose check we set Ready
    sent: dict[str, set[str]] = field(default_factory=dict)  # workload uid -> event ids spooled
    asks: dict[str, Ask] = field(default_factory=dict)  # workload uid -> its request (attribution)
    owners: dict[str, str] = field(default_factory=dict)  # Job uid -> its Workload's uid
    _pending: set[str] = field(default_factory=set)
    _gone: list[tuple[Callable[[Obj], None], dict[str, Any]]] = field(default_factory=list)  # deletions
    _wake: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _spooled: threading.Event = field(default_factory=threading.Event)
    _notes: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="kueue-notes")
    )

    def __post_init__(self) -> None:
        self.custom = k8s.CustomObjectsApi(self.api)
        self.batch = k8s.BatchV1Api(self.api)
        self.core = k8s.CoreV1Api(self.api)
        self.topic = self.config.job_events_topic()  # (builds the platform's Settings: once, not per event)
        register(KUEUE)

    # -- the checks ------------------------------------------------------------------------------
    def activate_checks(self) -> set[str]:
        """Our AdmissionChecks, each marked Active=True (server-side apply on its status)."""
        found: Any = self.custom.list_cluster_custom_object(GROUP, VERSION, "admissionchecks")
        names = set()
        for check in found.get("items", []):
            if (check.get("spec") or {}).get("controllerName") != self.config.controller_name:
                continue
            name = check["metadata"]["name"]
            names.add(name)
            if not is_true(check, "Active"):
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "AdmissionCheck", "metadata": {"name": name},
                    "status": {"conditions": [{
                        "type": "Active", "status": "True", "reason": "Active",
                        "message": f"allmende asks {self.config.api_url}",
                        "lastTransitionTime": _stamp(self.now()),
                    }]},
                }  # fmt: skip
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, "admissionchecks", name, body,
                    field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml",
                )  # fmt: skip
                log.info("kueue_check_activated", check=name)
        self.checks = names
        return names

    def our_check(self, workload: Obj) -> tuple[str, Obj] | None:
        for name in self.checks:
            if (state := check_state(workload, name)) is not None:
                return name, state
        return None

    def set_check(self, workload: Obj, check: str, state: str, message: str, **timing: float) -> None:
        body = check_patch(workload, check, state, message, self.now(), self.config.retry_after_s)
        meta = workload["metadata"]
        started = time.perf_counter()
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], "workloads", meta["name"], body,
            field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        KUEUE_CHECKS_SET.labels(state=state).inc()
        written_ms = round(1000 * (time.perf_counter() - started), 1)
        name = f"{meta['namespace']}/{meta['name']}"
        log.info(
            "kueue_check_set", workload=name, state=state, message=message, write_ms=written_ms, **timing
        )

    def note(self, workload: Obj, message: str) -> None:
        """The latest word on the workload, on its Job (NOTE): Kueue resets a check's message when
        it evicts, and `kubectl describe job` is where a researcher looks."""
        job = self.job_of(workload)
        if job is None or _annotations(job).get(NOTE) == message[:NOTE_MAX]:
            return
        meta = job["metadata"]
        body = {"metadata": {"annotations": {NOTE: message[:NOTE_MAX]}}}
        # Written by a thread of its own, in order: the next workload's answer does not wait for it
        # (the Job's watch brings the annotation back into the cache).
        self._notes.submit(
            self._safely, self.batch.patch_namespaced_job, meta["name"], meta["namespace"], body
        )

    # -- asking ----------------------------------------------------------------------------------
    def ask(self, ask: Ask, dry_run: bool) -> dict[str, Any]:
        try:
            answer = self.admission.post("/v1/admission", params={"dry_run": str(dry_run).lower()},
                                         content=orjson.dumps(ask.body()))  # fmt: skip
        except httpx.HTTPError as exc:
            raise AdmissionUnavailable(f"the admission API: {exc!r}") from exc
        if answer.status_code == 503 or answer.status_code >= 500:
            raise AdmissionUnavailable(
                f"the admission API answered {answer.status_code}: {answer.text[:300]}"
            )
        if answer.status_code != 200:  # 4xx: this request is wrong; the workload is told why
            detail = _detail(answer)
            if answer.status_code == 409:  # decided before with other parameters (another flavor): not final
                return {"verdict": "queue", "sentence": f"the admission API: {detail}"}
            return {"verdict": "reject", "sentence": f"the admission API refused the request: {detail}"}
        body: dict[str, Any] = answer.json()
        return body

    def decide(self, workload: Obj, check: str, ask: Ask) -> None:
        """Ask about a workload whose check is pending; set the check."""
        if ask.job_id in self.queued:
            answer = self.ask(ask, dry_run=True)
            if answer["verdict"] == "queue":
                self.set_check(workload, check, "Retry", check_message(answer))
                return
        started = time.perf_counter()
        answer = self.ask(ask, dry_run=False)
        asked_ms = round(1000 * (time.perf_counter() - started), 1)
        if answer["verdict"] == "queue":
            self.queued.add(ask.job_id)
        else:
            self.queued.discard(ask.job_id)
        if answer["verdict"] == "admit" and self.config.preempt:
            self.preempt(answer.get("preempt") or [], ask.job_id)
        self.set_check(
            workload, check, CHECK_STATE[answer["verdict"]], check_message(answer), ask_ms=asked_ms
        )
        self.note(workload, check_message(answer))

    def preempt(self, victims: list[Mapping[str, Any]], for_job: str) -> None:
        """Evict the victims that are Kueue workloads, in the planner's order (Retry on our check)."""
        by_uid = {w["metadata"]["uid"]: w for w in list(self.workloads.values())}
        for victim in victims:
            uid = uid_of_job_id(str(victim["job_id"]))
            target = by_uid.get(uid) if uid else None
            if target is None or victim["job_id"] in self.evicting:
                continue  # another scheduler's job, gone already, or already asked to leave
            ours = self.our_check(target)
            if ours is None or not is_true(target, "Admitted") or is_true(target, "Evicted"):
                continue
            reason = f"allmende: preempted for {for_job}: {victim.get('reason', victim.get('code', ''))}"
            self.set_check(target, ours[0], "Retry", reason)
            self.note(target, reason)
            self.evicting.add(str(victim["job_id"]))
            log.info("kueue_preempted", victim=victim["job_id"], for_job=for_job, code=victim.get("code"))

    # -- one workload ----------------------------------------------------------------------------
    def namespace(self, name: str) -> dict[str, Any] | None:
        cached = self.namespaces.get(name)
        if cached is not None and time.monotonic() - cached[0] < self.config.resync_s:
            return cached[1]
        try:
            ns = self.api.sanitize_for_serialization(self.core.read_namespace(name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self.namespaces[name] = (time.monotonic(), ns)
        return ns

    def job_of(self, workload: Obj) -> dict[str, Any] | None:
        owner = owner_job(workload)
        return self.jobs.get(owner[1]) if owner else None

    def reconcile(self, key: str, resync: bool = False) -> None:
        workload = self.workloads.get(key)
        if workload is None:
            return
        uid = workload["metadata"]["uid"]
        namespace = self.namespace(workload["metadata"]["namespace"])
        job = self.job_of(workload)
        ours = self.our_check(workload)
        try:
            ask = ask_of(workload, job, namespace, self.config)
        except NotAskable as exc:
            if ours is not None and ours[1].get("state") == "Pending" and is_true(workload, "QuotaReserved"):
                self.set_check(workload, ours[0], "Rejected", f"allmende: reject: {exc}")
            return
        if is_true(workload, "QuotaReserved") or uid not in self.asks:
            self.asks[uid] = ask  # the reserved flavor and GPUs: a run's attribution after its eviction
        if job is not None:
            # The Job's life first: a run just ended by preemption makes this a new request.
            self.owners[job["metadata"]["uid"]] = uid
            if ours is not None and ours[1].get("state") == "Pending" and RUN_STARTED in _annotations(job):
                # Asked again with a run on record: Kueue evicted it (its checks reset on eviction),
                # whether or not the Job's suspension has reached us yet.
                job = {**job, "spec": {**(job.get("spec") or {}), "suspend": True}}
            kept = replace(self.asks[uid], job_id=ask.job_id)
            now = int(self.now().timestamp())
            job = self.spool_events(
                uid, plan(kept, uid, job, evicted_at(workload), now, self.config.producer), job
            )
            ask = replace(ask, job_id=job_id_of(workload, job))
        if ours is None or is_true(workload, "Finished"):
            return
        state = ours[1].get("state")
        if state == "Pending" and is_true(workload, "QuotaReserved") and not is_true(workload, "Evicted"):
            # (an evicted workload keeps its quota a moment, its checks reset: not a new reservation)
            started = time.perf_counter()
            self.decide(workload, ours[0], ask)
            KUEUE_DECIDE_SECONDS.observe(time.perf_counter() - started)
        elif resync and self.config.preempt and _waiting_for_quota(workload):
            self.make_room(workload, ask)
        if state == "Ready":
            self.evicting.discard(ask.job_id)

    def make_room(self, workload: Obj, ask: Ask) -> None:
        """A workload without quota (so without a check to answer): if the platform would admit it
        by preempting (a time-slice window, the interactive lane), it is admitted for real, so that
        its hold keeps the victims' next asks from taking the GPUs back before Kueue gives it the
        quota (its check then gets the same answer), and the victims are evicted."""
        dry = self.ask(ask, dry_run=True)
        if dry["verdict"] != "admit" or not dry.get("preempt"):
            return  # not admissible, or admissible without anyone leaving: Kueue's quota is the limit
        answer = self.ask(ask, dry_run=False)
        if answer["verdict"] == "admit":
            self.admitted.add(ask.job_id)
            self.preempt(answer.get("preempt") or [], ask.job_id)
            self.note(workload, check_message(answer))

    def spool_events(self, uid: str, planned: Plan, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """Put the planned events not yet spooled, then mark the Job (its annotations); the Job as
        it is now."""
        sent = self.sent.setdefault(uid, set())
        new = [e for e in planned.events if e.event_id not in sent]
        for event in new:
            self.spool.put(self.topic, event.job_id, encode_event(event))
            sent.add(event.event_id)
            KUEUE_JOB_EVENTS.inc()
        if new:
            self._spooled.set()
        if job is None:
            return None
        annotations = _annotations(job)
        changes = {k: v for k, v in planned.annotations.items() if annotations.get(k) != v}
        if changes:
            meta = job["metadata"]
            patched = self.batch.patch_namespaced_job(
                meta["name"], meta["namespace"], {"metadata": {"annotations": changes}}
            )
            job = self.api.sanitize_for_serialization(patched)
            self.jobs[meta["uid"]] = job
        return job

    def job_deleted(self, job: Obj) -> None:
        """A Job deleted while it ran: its run is cancelled now (whether or not its Workload is
        still there: Kueue deletes it too)."""
        uid = self.owners.pop(job["metadata"]["uid"], None)
        ask = self.asks.get(uid) if uid else None
        if uid is None or ask is None:
            return
        ask = replace(ask, job_id=kueue_job_id(uid, preemptions(job)))
        # admitted by this controller, or (a restart since) by the Job's note
        admitted = ask.job_id in self.admitted or _annotations(job).get(NOTE, "").startswith(
            "allmende: admit:"
        )
        events = plan_deleted(ask, job, int(self.now().timestamp()), self.config.producer, admitted)
        self.spool_events(uid, Plan(events, {}), None)
        if not any(w["metadata"]["uid"] == uid for w in list(self.workloads.values())):
            self._drop(uid)

    def forget(self, workload: Obj) -> None:
        """A workload deleted: nothing of it is kept, unless its Job is still there (to close a run
        on the Job's deletion)."""
        uid = workload["metadata"]["uid"]
        owner = owner_job(workload)
        if owner is None or owner[1] not in self.jobs:
            self._drop(uid)

    def _drop(self, uid: str) -> None:
        for table in (self.sent, self.asks):
            table.pop(uid, None)
        for job_id in [j for j in self.queued | self.evicting | self.admitted if uid_of_job_id(j) == uid]:
            for kept in (self.queued, self.evicting, self.admitted):
                kept.discard(job_id)

    # -- the loops -------------------------------------------------------------------------------
    def enqueue(self, key: str) -> None:
        with self._wake:
            self._pending.add(key)
            self._wake.notify()

    def on_workload(self, kind: str, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if kind == "DELETED":
            self.workloads.pop(key, None)
            self._hand_over(self.forget, obj)
            return
        self.workloads[key] = obj
        self.enqueue(key)

    def on_job(self, kind: str, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self.jobs.pop(uid, None)
            self._hand_over(self.job_deleted, obj)
            return
        self.jobs[uid] = obj
        for key, workload in list(self.workloads.items()):
            if (owner := owner_job(workload)) and owner[1] == uid:
                self.enqueue(key)

    def _hand_over(self, step: Callable[[Obj], None], obj: dict[str, Any]) -> None:
        """A deletion, for the worker: it alone touches what was spooled and asked."""
        with self._wake:
            self._gone.append((step, obj))
            self._wake.notify()

    def work(self) -> None:
        """Reconcile queued workloads until stopped; every resync_s, all of them (with dry runs)."""
        next_resync = time.monotonic() + self.config.resync_s
        while not self._stop.is_set():
            with self._wake:
                timeout = max(0.0, next_resync - time.monotonic())
                if not self._pending and not self._gone:
                    self._wake.wait(timeout)
                keys, self._pending = self._pending, set()
                gone, self._gone = self._gone, []
            for step, obj in gone:
                self._safely(step, obj)
            resync = time.monotonic() >= next_resync
            if resync:
                next_resync = time.monotonic() + self.config.resync_s
                keys |= set(list(self.workloads))
                self._refresh_checks()
            for key in sorted(keys, key=self._urgency):
                self._reconcile_safely(key, resync)

    def _urgency(self, key: str) -> tuple[int, str]:
        """Checks waiting for an answer first (Kueue holds their quota meanwhile), then the rest."""
        workload = self.workloads.get(key)
        ours = self.our_check(workload) if workload is not None else None
        waiting = (
            ours is not None
            and ours[1].get("state") == "Pending"
            and is_true(workload or {}, "QuotaReserved")
        )
        return (0 if waiting else 1, key)

    def _reconcile_safely(self, key: str, resync: bool) -> None:
        if not self._safely(self.reconcile, key, resync):
            self._retry_later(key)

    def _safely(self, call: Callable[..., object], *args: Any) -> bool:
        """Run one step of the worker; False (logged, counted) if it failed."""
        try:
            call(*args)
            return True
        except AdmissionUnavailable as exc:
            KUEUE_ERRORS.labels(kind="admission").inc()
            log.warning("kueue_admission_unavailable", step=call.__name__, args=str(args[:1]), error=str(exc))
        except ApiException as exc:
            KUEUE_ERRORS.labels(kind="kubernetes").inc()
            if exc.status != 409:  # a conflict: the newer object is on its way through the watch
                log.warning("kueue_api_error", step=call.__name__, status=exc.status, reason=exc.reason)
        except Exception:
            KUEUE_ERRORS.labels(kind="controller").inc()
            log.exception("kueue_step_failed", step=call.__name__)
        return False

    def _retry_later(self, key: str, after_s: float = 1.0) -> None:
        timer = threading.Timer(after_s, self.enqueue, (key,))
        timer.daemon = True
        timer.start()

    def _refresh_checks(self) -> None:
        try:
            self.activate_checks()
        except ApiException as exc:
            KUEUE_ERRORS.labels(kind="kubernetes").inc()
            log.warning("kueue_checks_unreadable", status=exc.status, reason=exc.reason)

    def flusher(self) -> None:
        """Send what the spool holds; what Kafka did not take stays for the next round."""
        while not self._stop.is_set():
            self._spooled.wait(5.0)  # a restart's leftovers, or what a failed round left, go too
            self._spooled.clear()
            sent, left = self.spool.flush(self.config.bootstrap, self.config.send_timeout_s)
            if left:
                KUEUE_ERRORS.labels(kind="kafka").inc()
                log.warning("kueue_spool_left", sent=sent, left=left, error=self.spool.last_error)
                self._stop.wait(1.0)
                self._spooled.set()

    def informer(self, list_call: Callable[..., Any], on_event: Callable[[str, dict[str, Any]], None],
                 **kwargs: Any) -> None:  # fmt: skip
        """List, then watch from the list's version; relist when the watch breaks or expires."""
        while not self._stop.is_set():
            try:
                listed = list_call(**kwargs)
                listed = listed if isinstance(listed, dict) else self.api.sanitize_for_serialization(listed)
                for item in listed.get("items", []):
                    on_event("ADDED", item)
                version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    list_call, resource_version=version, timeout_seconds=300, **kwargs
                )
                for change in stream:
                    if self._stop.is_set():
                        return
                    obj = change["object"]
                    obj = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)
                    if change["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(change["type"], obj)
            except ApiException as exc:
                if exc.status != 410:  # 410: the version expired: list again
                    KUEUE_ERRORS.labels(kind="kubernetes").inc()
                    log.warning("kueue_watch_failed", status=exc.status, reason=exc.reason)
                    self._stop.wait(1.0)
            except Exception as exc:  # the API server away: list again shortly
                KUEUE_ERRORS.labels(kind="kubernetes").inc()
                log.warning("kueue_watch_failed", error=repr(exc))
                self._stop.wait(1.0)

    def run(self, once: bool = False) -> None:
        self.activate_checks()
        if once:
            self._list_once()
            for key in sorted(self.workloads):
                self._reconcile_safely(key, resync=True)
            self.spool.flush(self.config.bootstrap, self.config.send_timeout_s)
            return
        threads = [
            threading.Thread(target=self.informer, name="kueue-jobs", daemon=True,
                             args=(self.batch.list_job_for_all_namespaces, self.on_job),
                             kwargs={"label_selector": MANAGED}),
            threading.Thread(target=self.informer, name="kueue-workloads", daemon=True,
                             args=(self._list_workloads, self.on_workload)),
            threading.Thread(target=self.flusher, name="kueue-flusher", daemon=True),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        log.info("kueue_controller_started", checks=sorted(self.checks), api=self.config.api_url)
        try:
            self.work()
        finally:
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self._notes.shutdown(wait=False)
        with self._wake:
            self._wake.notify_all()

    def _list_workloads(self, **kwargs: Any) -> Any:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, "workloads", **kwargs)

    def _list_once(self) -> None:
        jobs = self.api.sanitize_for_serialization(
            self.batch.list_job_for_all_namespaces(label_selector=MANAGED)
        )
        for job in jobs.get("items", []):
            self.on_job("ADDED", job)
        for workload in self._list_workloads().get("items", []):
            self.on_workload("ADDED", workload)


def _detail(answer: httpx.Response) -> str:
    """The API's reason for a 4xx (FastAPI's `detail`, a string or {"detail", "code"})."""
    try:
        detail = answer.json().get("detail", answer.text)
    except ValueError:
        return answer.text[:300] or answer.reason_phrase
    return str(detail.get("detail", detail)) if isinstance(detail, dict) else str(detail)


def _annotations(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _waiting_for_quota(workload: Obj) -> bool:
    """In its queue, not yet given quota, and active."""
    spec = workload.get("spec") or {}
    return (
        spec.get("active", True)
        and not is_true(workload, "QuotaReserved")
        and not is_true(workload, "Finished")
    )


def _stamp(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubernetes_client(config: KueueConfig) -> k8s.ApiClient:
    """From `kubeconfig` when set (or $KUBECONFIG), else the in-cluster service account."""
    if config.kubeconfig is not None:
        return k8s_config.new_client_from_config(config_file=str(config.kubeconfig))
    try:
        k8s_config.load_incluster_config()
        return k8s.ApiClient()
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()


def admission_client(config: KueueConfig) -> httpx.Client:
    headers = {"Content-Type": "application/json"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    return httpx.Client(base_url=config.api_url, headers=headers, timeout=config.timeout_s)


def controller(config: KueueConfig) -> Controller:
    return Controller(config, kubernetes_client(config), admission_client(config), Spool(config.spool_dir))
