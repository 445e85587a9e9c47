"""PrologSlurmctld / EpilogSlurmctld: a Slurm job's lifecycle as Allmende job events.

    python -m allmende.integrations.slurm.lifecycle prolog|epilog   # run by hooks/allmende_slurmctld.sh
    python -m allmende.integrations.slurm.lifecycle flush           # send what the spool still holds

Prolog (the job got its nodes): `JobSubmitted` (attribution: project, user, cluster, GPU type,
GPUs, priority class, interactive, time limit) and `JobStarted` (GPUs, hosts) at Slurm's
StartTime. Epilog (the run ended): `JobFinished` (succeeded / failed / cancelled) at Slurm's
EndTime, or `JobPreempted` when the run ended by a requeue or preemption, which the epilog tells
by SLURM_JOB_RESTART_COUNT having grown past the run the prolog saw (and by the job state). Both
carry the run's `started_at`. So the ledger charges exactly (EndTime - StartTime) x GPUs, which is
what `sacct` shows as Elapsed x AllocTRES gres/gpu.

The platform's job id is the admission id job_submit.lua stored in the job's admin comment
(`allmende:<id>`), else `slurm-<ClusterName>-<Slurm job id>`. Event ids are deterministic per
Slurm job and run: `slurm:<ClusterName>:<job>:submitted`, `slurm:<ClusterName>:<job>:<run>:started`,
`...:<run>:finished`, `...:<run>:preempted` (run = the restart count of that run), so a hook run
twice, or an event sent twice, changes nothing.

Events go to the durable spool first (integrations/spool.py), then to
`<topic_prefix>.job-events` keyed by job id (acks=all). The hook never fails the job: whatever
goes wrong is logged to the hook log and the hook exits 0 (a failing PrologSlurmctld would
requeue or hold the job).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from allmende.integrations.slurm.config import ConfigError, SlurmConfig, load_config
from allmende.integrations.slurm.log import LineLog
from allmende.integrations.slurm.scontrol import REQUEUED_STATES, SlurmJob, accounted_end, hostnames, show_job
from allmende.integrations.spool import Spool
from allmende.schemas.events import (
    FinishStatus,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    PriorityClass,
    encode_event,
)

MAX_REQUESTED_SECONDS = 366 * 86_400
SUCCEEDED_STATES = {"COMPLETED"}
CANCELLED_STATES = {"CANCELLED"}


# -- the run record: what the prolog saw, for the epilog -----------------------------------------


def _run_file(cfg: SlurmConfig, cluster: str, job_id: str) -> Path:
    return cfg.spool_dir / "runs" / f"{cluster}-{job_id}.json"


def _save_run(cfg: SlurmConfig, cluster: str, job_id: str, record: Mapping[str, Any]) -> None:
    path = _run_file(cfg, cluster, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _load_run(cfg: SlurmConfig, cluster: str, job_id: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_run_file(cfg, cluster, job_id).read_text())
        return data
    except (OSError, ValueError):
        return None


def _drop_run(cfg: SlurmConfig, cluster: str, job_id: str) -> None:
    with contextlib.suppress(OSError):
        _run_file(cfg, cluster, job_id).unlink()


# -- events --------------------------------------------------------------------------------------


def platform_job_id(job: SlurmJob, cfg: SlurmConfig, cluster: str) -> str:
    return job.admission_id(cfg.id_field) or f"slurm-{cluster}-{job.job_id}"


def requested_seconds(job: SlurmJob, cfg: SlurmConfig) -> int:
    seconds = job.time_limit_minutes * 60 if job.time_limit_minutes else math.ceil(cfg.default_hours * 3600)
    return min(max(seconds, 1), MAX_REQUESTED_SECONDS)


def prolog_events(
    job: SlurmJob, cfg: SlurmConfig, env: Mapping[str, str], now: int, hosts: Sequence[str]
) -> tuple[list[BaseModel], dict[str, Any]]:
    """JobSubmitted and JobStarted of the run starting now, and the record the epilog reads."""
    cluster_name = env.get("SLURM_CLUSTER_NAME") or "slurm"
    run = int(env.get("SLURM_JOB_RESTART_COUNT") or job.restarts)
    pid = platform_job_id(job, cfg, cluster_name)
    cluster = cfg.cluster_of(job.partition or env.get("SLURM_JOB_PARTITION", ""))
    started_at = job.start_time or now
    qos = job.qos or None
    common = {"producer": cfg.producer, "job_id": pid}
    prefix = f"slurm:{cluster_name}:{job.job_id}"
    submitted = JobSubmitted(
        event_id=f"{prefix}:submitted",
        occurred_at=min(job.submit_time or started_at, started_at),
        project=cfg.project_of(job.account or env.get("SLURM_JOB_ACCOUNT", "")),
        user=job.user or env.get("SLURM_JOB_USER", "unknown"),
        cluster=cluster,
        gpu_type=cfg.gpu_type_of(job.gpu_type, cluster),
        gpus=job.gpus,
        priority_class=PriorityClass(cfg.priority_class_of(qos)),
        interactive=(not job.batch) or (qos in cfg.interactive_qos),
        requested_seconds=requested_seconds(job, cfg),
        **common,
    )
    started = JobStarted(
        event_id=f"{prefix}:{run}:started",
        occurred_at=started_at,
        gpus=job.gpus,
        hosts=tuple(hosts),
        **common,
    )
    record = {"run": run, "started_at": started_at, "gpus": job.gpus, "job_id": pid}
    return [submitted, started], record


def _describe(event: BaseModel) -> str:
    text = f"{event.type}@{event.occurred_at}"  # type: ignore[attr-defined]
    if isinstance(event, JobFinished):
        text += f" {event.status.value}"
    return text


def finish_status(job: SlurmJob, env: Mapping[str, str]) -> FinishStatus:
    state = job.state.split()[0] if job.state else ""
    if state in SUCCEEDED_STATES:
        return FinishStatus.SUCCEEDED
    if state in CANCELLED_STATES:
        return FinishStatus.CANCELLED
    if state and state not in {"COMPLETING", "RUNNING", "CONFIGURING"}:
        return FinishStatus.FAILED  # FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE
    # Still COMPLETING (as it is in EpilogSlurmctld): the exit code tells ("exit:signal").
    # scontrol has the signal of a cancelled job (0:15) where SLURM_JOB_EXIT_CODE2 says 0:0.
    codes = [c for c in (job.exit_code, env.get("SLURM_JOB_EXIT_CODE2")) if c and c != "0:0"]
    exit_status, _, signal = (codes[0] if codes else "0:0").partition(":")
    if job.reason in {"TimeLimit", "NonZeroExitCode", "OutOfMemory", "NodeDown", "Deadline"}:
        return FinishStatus.FAILED
    if exit_status == "0" and signal in {"", "0"}:
        return FinishStatus.SUCCEEDED
    if exit_status == "0" and signal in {"9", "15"}:
        return FinishStatus.CANCELLED
    return FinishStatus.FAILED


def epilog_events(
    job: SlurmJob, cfg: SlurmConfig, env: Mapping[str, str], now: int, record: Mapping[str, Any] | None
) -> tuple[list[BaseModel], bool]:
    """JobFinished or JobPreempted for the run that just ended; and whether the job is done."""
    cluster_name = env.get("SLURM_CLUSTER_NAME") or "slurm"
    env_run = int(env.get("SLURM_JOB_RESTART_COUNT") or job.restarts)
    state = job.state.split()[0] if job.state else ""
    if record is not None:
        run = int(record["run"])
        requeued = env_run > run or state in REQUEUED_STATES
        pid = str(record.get("job_id") or platform_job_id(job, cfg, cluster_name))
        started_at = int(record.get("started_at") or 0) or job.start_time
    else:
        requeued = state in REQUEUED_STATES
        run = max(env_run - 1, 0) if requeued else env_run
        pid = platform_job_id(job, cfg, cluster_name)
        started_at = job.start_time
    # A requeued job shows the next run's estimated times: the clock (then sacct, if it has it).
    ended_at = job.end_time if not requeued and job.end_time and job.end_time <= now + 1 else now
    if started_at is not None and started_at > ended_at:
        ended_at = started_at
    common = {"producer": cfg.producer, "job_id": pid, "started_at": started_at}
    prefix = f"slurm:{cluster_name}:{job.job_id}:{run}"
    events: list[BaseModel] = []
    if requeued or state == "PREEMPTED":
        # Slurm does not tell the epilog why: preempted, requeued by an admin, or a node failure
        reason = f"requeued by Slurm (preempted, scontrol requeue or node failure; restart {env_run})"
        if state == "PREEMPTED":
            reason = "preempted"
        elif job.reason and job.reason not in {"None", "(null)", "BeginTime"}:
            reason = f"{reason}: {job.reason}"
        events.append(
            JobPreempted(
                event_id=f"{prefix}:preempted",
                occurred_at=ended_at,
                reason=f"slurm: {reason}"[:500],
                **common,
            )
        )
        if not requeued:  # preempted and cancelled for good (PreemptMode=CANCEL)
            events.append(
                JobFinished(
                    event_id=f"{prefix}:finished",
                    occurred_at=ended_at,
                    status=FinishStatus.CANCELLED,
                    **common,
                )
            )
        return events, not requeued
    events.append(
        JobFinished(
            event_id=f"{prefix}:finished", occurred_at=ended_at, status=finish_status(job, env), **common
        )
    )
    return events, True


# -- running as a hook ---------------------------------------------------------------------------


def _with_accounted_end(event: BaseModel, job_id: str, cfg: SlurmConfig) -> BaseModel:
    """A preempted run's end as slurmdbd recorded it (what sacct -D shows), where it has it."""
    if not isinstance(event, JobPreempted) or event.started_at is None:
        return event
    ended = accounted_end(job_id, event.started_at, cfg.sacct)
    if ended is None or ended < event.started_at:
        return event
    return event.model_copy(update={"occurred_at": ended})


def run_hook(kind: str, cfg: SlurmConfig, log: LineLog, env: Mapping[str, str] = os.environ) -> int:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        log(f"{kind}: no SLURM_JOB_ID; nothing to do")
        return 0
    cluster_name = env.get("SLURM_CLUSTER_NAME") or "slurm"
    spool = Spool(cfg.spool_dir)
    now = int(time.time())
    job = show_job(job_id, cfg.scontrol)
    events: list[BaseModel]
    if kind == "prolog":
        if job.gpus < 1:
            log(f"prolog: job {job_id}: no GPUs; not metered")
            return 0
        events, started = prolog_events(job, cfg, env, now, hostnames(job.node_list, cfg.scontrol))
        _save_run(cfg, cluster_name, job_id, started)
    else:
        seen = _load_run(cfg, cluster_name, job_id)
        if seen is None and job.gpus < 1:
            log(f"epilog: job {job_id}: no GPUs; not metered")
            return 0
        events, _done = epilog_events(job, cfg, env, now, seen)
        events = [_with_accounted_end(e, job_id, cfg) for e in events]
        _drop_run(cfg, cluster_name, job_id)
    topic = cfg.job_events_topic()
    for event in events:
        spool.put(topic, event.job_id, encode_event(event))  # type: ignore[attr-defined]
    sent, left = spool.flush(cfg.bootstrap, cfg.send_timeout_s)
    summary = ", ".join(_describe(e) for e in events)

    log(
        f"{kind}: job {job_id} (state {job.state}, restarts {job.restarts}, env run "
        f"{env.get('SLURM_JOB_RESTART_COUNT')}) as {events[0].job_id}: {summary}; "  # type: ignore[attr-defined]
        f"sent {sent}, left in spool {left}" + (f" ({spool.last_error})" if left else "")
    )
    return 0


def flush(cfg: SlurmConfig, log: LineLog) -> tuple[int, int]:
    """Send what the spool holds: (sent, left)."""
    spool = Spool(cfg.spool_dir)
    sent, left = spool.flush(cfg.bootstrap, cfg.send_timeout_s)
    log(f"flush: sent {sent}, left in spool {left}" + (f" ({spool.last_error})" if left else ""))
    return sent, left


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allmende.integrations.slurm.lifecycle", description=__doc__
    )
    parser.add_argument("kind", choices=["prolog", "epilog", "flush"])
    parser.add_argument("--config", help="the JSON config (default: $ALLMENDE_SLURM_CONFIG, ...)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        LineLog(None, with_pid=True)(f"{args.kind}: {exc}")
        _syslog(f"allmende slurm {args.kind}: {exc}")
        return 0 if args.kind != "flush" else 2
    log = LineLog(cfg.hook_log, with_pid=True)
    if args.kind == "flush":
        sent, left = flush(cfg, log)
        sys.stdout.write(f"sent {sent}, left in spool {left} ({cfg.spool_dir})\n")
        return 0 if left == 0 else 1
    try:
        return run_hook(args.kind, cfg, log)
    except ValidationError as exc:
        log(f"{args.kind}: job {os.environ.get('SLURM_JOB_ID')}: an event would break the contract: {exc}")
    except Exception:
        log(f"{args.kind}: job {os.environ.get('SLURM_JOB_ID')}: failed:\n{traceback.format_exc()}")
    return 0


def _syslog(message: str) -> None:
    """Where a hook without a config can still be heard (slurmctld discards its output)."""
    try:
        import syslog

        syslog.syslog(syslog.LOG_ERR, message)
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())
