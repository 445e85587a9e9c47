"""Child processes, all started and stopped here: `allmende up/down`, the demos, the simulator's
runs, the test harnesses and the benchmarks.

Two kinds:
- `Child`: a process the program that started it waits on and stops (a test's meter worker, a
  simulated run's ledger writer, a benchmark's server), its output in a log file of its own.
- Detached processes (`start_detached`, `running`, `stop_detached`, `inspect`): they outlive the
  command that started them (`allmende up`, the local Kafka broker, the Slurm demo with --keep), in
  a session of their own, found again through a pid file. The pid file identifies the process for
  sure: besides the pid it records when the process started (/proc/<pid>/stat field 22, clock
  ticks after boot) and the boot's id, compared on every read. So a process counts as running only
  if it is the one recorded: not a dead pid, not a zombie (where PID 1 does not reap orphans, a
  process killed after its parent exited stays one), not another process that was given the same
  pid later. Only the recorded process is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, what: str, every: float = 0.25) -> T:
    """`check()`'s first truthy answer; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def python_module(module: str, *args: str) -> list[str]:
    """`python -m module args` with this interpreter (the environment the package is installed in)."""
    return [sys.executable, "-m", module, *args]


class Child:
    """A child process with its output in `log_path`; stopped by whoever started it."""

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        cwd: Path | None = None,
        session: bool = False,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, env=dict(env) if env is not None else None, cwd=cwd, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=session, preexec_fn=preexec_fn,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def died(self) -> bool:
        return self.proc.poll() is not None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `ready()`; RuntimeError with the log's tail if the process exits first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.died():
                raise RuntimeError(f"{what} exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout:.0f}s ({self.log_path})")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Send `sig` and wait; SIGKILL after `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _stat_after_comm(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first); None if
    there is no such process. The name is in parentheses and may itself hold ')' and spaces."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def proc_available() -> bool:
    """Whether this system has Linux's /proc, where a process's start time can be read."""
    return Path("/proc/self/stat").exists()


def alive(pid: int) -> bool:
    """Some process has this pid and is not a zombie (whichever process it is: see `inspect`)."""
    if not proc_available():  # not Linux: existence only
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    fields = _stat_after_comm(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def process_start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (/proc/<pid>/stat field 22): with the
    boot it identifies one process for good, where the pid alone is reused."""
    fields = _stat_after_comm(pid)
    try:
        return int(fields[19]) if fields is not None else None  # field 22 is the 20th after the name
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's random id: start ticks are only comparable within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_uptime(pid: int) -> float | None:
    """Seconds since the process started (None without /proc or once it is gone)."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    try:
        since_boot = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, since_boot - ticks / os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class PidRecord:
    """What a pid file holds: the pid and, where /proc tells it, the process's start time (ticks
    after boot) and the boot's id. A process is the one recorded only if all three match."""

    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None

    @classmethod
    def of(cls, pid: int) -> PidRecord:
        """The identity of the live process `pid` (its start time, this boot)."""
        return cls(pid, process_start_ticks(pid), boot_id())

    def render(self) -> str:
        """The file's text: the pid on the first line (`kill $(head -1 FILE)` works), then
        `start_ticks=` and `boot_id=` lines."""
        lines = [str(self.pid)]
        if self.start_ticks is not None:
            lines.append(f"start_ticks={self.start_ticks}")
        if self.boot_id is not None:
            lines.append(f"boot_id={self.boot_id}")
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> PidRecord | None:
        """The record in a pid file's text; None if its first line is not a pid. An older file
        holds only the pid."""
        first, *rest = text.strip().splitlines() or [""]
        try:
            pid = int(first.strip())
        except ValueError:
            return None
        if pid <= 0:
            return None
        fields = dict(line.strip().partition("=")[::2] for line in rest if "=" in line)
        try:
            ticks = int(fields["start_ticks"]) if "start_ticks" in fields else None
        except ValueError:
            return None
        return cls(pid, ticks, fields.get("boot_id") or None)


def write_pid_file(pid_file: Path, pid: int) -> PidRecord:
    """Record the live process `pid` in `pid_file` (written whole, then renamed into place)."""
    record = PidRecord.of(pid)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    partial = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    partial.write_text(record.render())
    partial.replace(pid_file)
    return record


def read_pid_file(pid_file: Path) -> PidRecord | None:
    try:
        return PidRecord.parse(pid_file.read_text())
    except OSError:
        return None


# What a pid file says about its process. Only "running" is the process recorded, alive.
ProcessStateName = Literal["running", "stopped", "dead", "zombie", "reused", "unverified"]
STATE_MEANING: dict[str, str] = {
    "running": "the recorded process is alive",
    "stopped": "no pid file (never started, or stopped), or none that can be read",
    "dead": "no process has the recorded pid",
    "zombie": "the recorded process has exited; its parent has not reaped it",
    "reused": "the pid now belongs to another process (it started at another time or boot)",
    "unverified": "the pid file records no start time (an older file): not trusted",
}


@dataclass(frozen=True)
class ProcessState:
    state: ProcessStateName
    pid: int | None = None
    uptime_s: float | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"


def inspect(pid_file: Path) -> ProcessState:
    """What `pid_file` says about its process: only "running" if the process alive under that pid
    is the one recorded (same start time, same boot), not a zombie, not a later process that was
    given the same pid. Without /proc (not Linux) a live pid is all that can be checked."""
    record = read_pid_file(pid_file)
    if record is None:
        return ProcessState("stopped")
    pid = record.pid
    if not proc_available():
        return ProcessState("running", pid) if alive(pid) else ProcessState("dead", pid)
    fields = _stat_after_comm(pid)
    if fields is None:
        return ProcessState("dead", pid)
    if fields[0] in ("Z", "X"):
        return ProcessState("zombie", pid)
    if record.start_ticks is None:
        return ProcessState("unverified", pid)
    now = PidRecord.of(pid)
    if now.start_ticks is None:  # it exited just now
        return ProcessState("dead", pid)
    other_boot = record.boot_id is not None and now.boot_id is not None and record.boot_id != now.boot_id
    if now.start_ticks != record.start_ticks or other_boot:
        return ProcessState("reused", pid)
    return ProcessState("running", pid, process_uptime(pid))


def running(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is the one recorded, alive (`inspect`)."""
    state = inspect(pid_file)
    return state.pid if state.running else None


def start_detached(
    pid_file: Path, log_path: Path, argv: list[str], env: Mapping[str, str] | None = None
) -> int:
    """`argv` in a session of its own, appending to `log_path`, its pid in `pid_file`; a process
    already running under that pid file is kept (idempotent)."""
    if (pid := running(pid_file)) is not None:
        return pid
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    write_pid_file(pid_file, proc.pid)
    return proc.pid


def stop_detached(pid_file: Path, timeout: float = 30.0) -> bool:
    """TERM the process group of the process recorded in `pid_file` (KILL after `timeout`); True if
    it ran. A pid that now names another process is left alone; the pid file goes either way."""
    pid = running(pid_file)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while running(pid_file) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if running(pid_file) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reaped, if it was ours
    pid_file.unlink(missing_ok=True)
    return pid is not None


def command_pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.pid"


def command_log_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.log"


def start_command(run_dir: Path, name: str, args: list[str], env: Mapping[str, str] | None = None) -> int:
    """`python -m allmende <args>` detached (`allmende up`): run_dir/<name>.pid and <name>.log."""
    argv = python_module("allmende", *args)
    return start_detached(command_pid_file(run_dir, name), command_log_file(run_dir, name), argv, env)


def stop_command(run_dir: Path, name: str, timeout: float = 20.0) -> bool:
    return stop_detached(command_pid_file(run_dir, name), timeout)
