"""What the hooks learn about a job from `scontrol show job -d -o <id>` (and `show hostnames`).

slurmctld gives PrologSlurmctld/EpilogSlurmctld only a few SLURM_* variables: no QOS, TRES, GPUs
or times. `scontrol show job -d -o` has them, one line of `Key=value` pairs separated by spaces.
Values may contain spaces and even `Key=` text where the user chose them (job name, command,
work dir, comment), so the line is not split naively: the job name (known from the hook's
environment) is cut off first, the fields read are the first occurrence of their key (all of
them come before the first user-chosen free text after the name), and the admin comment is the
field right after the work dir, also known from the environment.

Times are asked for as Unix seconds (SLURM_TIME_FORMAT=%s); a local ISO time is understood too.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from dataclasses import dataclass

_KEY = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_:/().\-]*)=")
# States after which the job runs again: the run the epilog sees ended by requeue or preemption.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"})


def fields(line: str) -> list[tuple[str, str]]:
    """(key, value) pairs in order; a value runs to the next ` Key=`."""
    found = list(_KEY.finditer(line))
    out = []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        out.append((m.group(1), line[m.end() : end].strip()))
    return out


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    reason: str
    restarts: int
    batch: bool
    exit_code: str  # "exit:signal"
    account: str
    partition: str
    qos: str
    user: str
    submit_time: int | None
    start_time: int | None
    end_time: int | None
    time_limit_minutes: int | None  # None: UNLIMITED or unknown
    node_list: str
    gpus: int
    gpu_type: str | None
    admin_comment: str
    comment: str
    raw: str

    def admission_id(self, id_field: str = "admin_comment") -> str | None:
        """The `allmende:<id>` job_submit.lua stored in the admin comment (or the comment)."""
        text = self.comment if id_field == "comment" else self.admin_comment
        m = re.match(r"allmende:([A-Za-z0-9._:@/+-]+)", text or "")
        return m.group(1) if m else None


def parse_time(value: str | None) -> int | None:
    if not value or value in {"Unknown", "None", "N/A", "(null)"}:
        return None
    if value.isdigit():
        seconds = int(value)
        return seconds or None
    try:
        return int(dt.datetime.fromisoformat(value).timestamp())  # local time, as scontrol prints it
    except ValueError:
        return None


def parse_minutes(value: str | None) -> int | None:
    """`[days-]hours:minutes:seconds`, `minutes:seconds`, `minutes` -> whole minutes (rounded up)."""
    if not value or value in {"UNLIMITED", "INFINITE", "Partition_Limit", "NONE", "None"}:
        return None
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
    parts = [int(p) for p in value.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0, parts
    else:
        h, m, s = 0, parts[0], 0
    seconds = ((days * 24 + h) * 60 + m) * 60 + s
    return -(-seconds // 60)


def parse_gpus(tres: str, job_gres: str) -> tuple[int, str | None]:
    """GPUs and their type from `TRES=...,gres/gpu=2,gres/gpu:h100=2` (else `JOB_GRES=gpu:h100:2`)."""
    total, typed, gpu_type = 0, 0, None
    for item in tres.split(","):
        key, _, count = item.partition("=")
        if key == "gres/gpu":
            total = _count(count)
        elif key.startswith("gres/gpu:"):
            typed += _count(count)
            gpu_type = gpu_type or key.split(":", 1)[1]
    if total or typed:
        return total or typed, gpu_type
    for item in job_gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts and parts[0] == "gpu":
            if len(parts) >= 3:
                return _count(parts[-1]), parts[1]
            if len(parts) == 2:
                return (_count(parts[1]), None) if parts[1].isdigit() else (1, parts[1])
            return 1, None
    return 0, None


def _count(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


def parse_job(
    line: str, job_name: str | None = None, work_dir: str | None = None, comment: str | None = None
) -> SlurmJob:
    """One `scontrol show job -o` line; `job_name`, `work_dir` and `comment` (the hook's
    SLURM_JOB_NAME, SLURM_JOB_WORK_DIR, SLURM_JOB_COMMENT) make reading it unambiguous."""
    line = line.strip()
    m = re.match(r"JobId=(\d+) ", line)
    if not m:
        raise ValueError(f"not a `scontrol show job -o` line: {line[:200]!r}")
    rest = line
    if job_name is not None and line.startswith(f"{m.group(0)}JobName={job_name} "):
        rest = line[len(f"{m.group(0)}JobName={job_name}") :]  # the name may hold anything
    pairs = fields(rest)
    first: dict[str, str] = {}
    for key, value in pairs:
        first.setdefault(key, value)
    admin_comment = ""
    anchor = f" WorkDir={work_dir} AdminComment=" if work_dir is not None else None
    if anchor is not None and anchor in rest:
        after = rest[rest.index(anchor) + len(anchor) :]
        admin_comment = after.split(" ", 1)[0]
    elif work_dir is None:
        admin_comment = first.get("AdminComment", "")
    gpus, gpu_type = parse_gpus(first.get("TRES", ""), first.get("JOB_GRES", ""))
    user = first.get("UserId", "")
    return SlurmJob(
        job_id=m.group(1),
        state=first.get("JobState", ""),
        reason=first.get("Reason", ""),
        restarts=int(first.get("Restarts", "0") or 0),
        batch=first.get("BatchFlag", "1") != "0",
        exit_code=first.get("ExitCode", "0:0"),
        account=first.get("Account", ""),
        partition=first.get("Partition", ""),
        qos=first.get("QOS", ""),
        user=user.split("(", 1)[0],
        submit_time=parse_time(first.get("SubmitTime")),
        start_time=parse_time(first.get("StartTime")),
        end_time=parse_time(first.get("EndTime")),
        time_limit_minutes=parse_minutes(first.get("TimeLimit")),
        node_list=first.get("NodeList", "") if first.get("NodeList") != "(null)" else "",
        gpus=gpus,
        gpu_type=gpu_type,
        admin_comment=admin_comment,
        comment=comment if comment is not None else first.get("Comment", ""),
        raw=line,
    )


def _env() -> dict[str, str]:
    return {**os.environ, "SLURM_TIME_FORMAT": "%s"}


def show_job(job_id: str, scontrol: str = "scontrol", timeout: float = 15.0) -> SlurmJob:
    out = subprocess.run(
        [scontrol, "show", "job", "-d", "-o", job_id],
        capture_output=True, text=True, timeout=timeout, env=_env(), check=True,
    )  # fmt: skip
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("JobId=")), "")
    env = os.environ
    if env.get("SLURM_JOB_ID") != job_id:  # not the hook's own job: its variables do not apply
        return parse_job(line)
    return parse_job(
        line, env.get("SLURM_JOB_NAME"), env.get("SLURM_JOB_WORK_DIR"), env.get("SLURM_JOB_COMMENT")
    )


def hostnames(node_list: str, scontrol: str = "scontrol", timeout: float = 15.0) -> tuple[str, ...]:
    if not node_list:
        return ()
    try:
        out = subprocess.run(
            [scontrol, "show", "hostnames", node_list],
            capture_output=True, text=True, timeout=timeout, env=_env(), check=True,
        )  # fmt: skip
        return tuple(h for h in out.stdout.split() if h)
    except (OSError, subprocess.SubprocessError):
        return (node_list,) if re.fullmatch(r"[A-Za-z0-9._-]+", node_list) else ()


def accounted_end(
    job_id: str, started_at: int, sacct: str = "sacct", tries: int = 7, wait_s: float = 0.5
) -> int | None:
    """When the run that started at `started_at` ended, as slurmdbd recorded it (`sacct -D`):
    for a requeued run the epilog sees no end time of its own (scontrol shows the next run's
    expected times). None if slurmdbd does not have it within about 3 s, or recorded the run
    without its start (a run preempted within a second or so of starting can be: sacct then
    shows Start=None, Elapsed 0)."""
    import time

    for attempt in range(tries):
        try:
            out = subprocess.run(
                [sacct, "-D", "-X", "-n", "-P", "-j", job_id, "-o", "Start,End"],
                capture_output=True, text=True, timeout=10, env=_env(), check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.stdout.splitlines():
            start, _, end = line.partition("|")
            if parse_time(start) == started_at and (ended := parse_time(end)) is not None:
                return ended
        if attempt + 1 < tries:
            time.sleep(wait_s)
    return None
