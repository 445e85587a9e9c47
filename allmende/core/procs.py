"""Background processes of a local deployment (`allmende up/down`): pid files under run_dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def _pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.pid"


def running(run_dir: Path, name: str) -> int | None:
    try:
        pid = int(_pid_file(run_dir, name).read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start(run_dir: Path, name: str, args: list[str], env: dict[str, str] | None = None) -> int:
    """Start `python -m allmende <args>` detached, logging to run_dir/<name>.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if (pid := running(run_dir, name)) is not None:
        return pid
    with (run_dir / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "allmende", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    _pid_file(run_dir, name).write_text(str(proc.pid))
    return proc.pid


def stop(run_dir: Path, name: str, timeout: float = 20.0) -> bool:
    pid = running(run_dir, name)
    if pid is None:
        _pid_file(run_dir, name).unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running(run_dir, name) is not None:
        time.sleep(0.2)
    if running(run_dir, name) is not None:
        os.killpg(pid, signal.SIGKILL)
    _pid_file(run_dir, name).unlink(missing_ok=True)
    return True
