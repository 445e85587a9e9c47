"""Child processes, all started and stopped here: `allmende up/down`, the demos, the simulator's
runs, the test harnesses and the benchmarks.

Two kinds:
- `Child`: a process the program that started it waits on and stops (a test's meter worker, a
  simulated run's ledger writer, a benchmark's server), its output in a log file of its own.
- Detached processes (`start_detached`, `running`, `stop_detached`): they outlive the command that
  started them (`allmende up`, the local Kafka broker, the Slurm demo with --keep), in a session of
  their own, found again through a pid file. A zombie counts as gone: where PID 1 does not reap
  orphans, a process killed after its parent exited stays a zombie, and must not pass for alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

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


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:  # no /proc (not Linux): existence only
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def running(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def start_detached(
    pid_file: Path, log_path: Path, argv: list[str], env: Mapping[str, str] | None = None
) -> int:
    """`argv` in a session of its own, appending to `log_path`, its pid in `pid_file`; a process
    already running under that pid file is kept (idempotent)."""
    if (pid := running(pid_file)) is not None:
        return pid
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    pid_file.write_text(str(proc.pid))
    return proc.pid


def stop_detached(pid_file: Path, timeout: float = 30.0) -> bool:
    """TERM the process group of the pid in `pid_file` (KILL after `timeout`); True if it ran."""
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


def start_command(run_dir: Path, name: str, args: list[str], env: Mapping[str, str] | None = None) -> int:
    """`python -m allmende <args>` detached (`allmende up`): run_dir/<name>.pid and <name>.log."""
    return start_detached(
        run_dir / f"{name}.pid", run_dir / f"{name}.log", python_module("allmende", *args), env
    )


def stop_command(run_dir: Path, name: str, timeout: float = 20.0) -> bool:
    return stop_detached(run_dir / f"{name}.pid", timeout)
