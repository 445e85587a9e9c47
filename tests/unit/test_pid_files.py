"""Pid files that identify their process (allmende.core.supervisor): a pid counts as the component
only while the process recorded (pid, start time, boot) is alive; a dead pid, a zombie, a pid
given to another process later, or an older file without a start time is not trusted, and such a
process is never signalled."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.core import supervisor
from allmende.core.supervisor import PidRecord, inspect, running, start_detached, stop_detached, wait_until

pytestmark = pytest.mark.skipif(not supervisor.proc_available(), reason="start times need Linux's /proc")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process (not a zombie while the test runs)."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _state(path: Path) -> str:
    return inspect(path).state


def test_a_record_round_trips_and_keeps_the_pid_on_the_first_line(tmp_path: Path) -> None:
    record = supervisor.write_pid_file(tmp_path / "x.pid", os.getpid())
    text = (tmp_path / "x.pid").read_text()
    assert text.splitlines()[0] == str(os.getpid())
    assert record.start_ticks is not None and record.start_ticks >= 0 and record.boot_id
    assert PidRecord.parse(text) == record
    assert supervisor.read_pid_file(tmp_path / "x.pid") == record
    assert not list(tmp_path.glob(".x.pid.*")), "the partial file was renamed into place"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1234\n", PidRecord(1234)),
        ("1234", PidRecord(1234)),
        ("1234\nstart_ticks=99\nboot_id=abc\n", PidRecord(1234, 99, "abc")),
        ("1234\nboot_id=abc\nstart_ticks=99\nsomething=else\n", PidRecord(1234, 99, "abc")),
        ("", None),
        ("not a pid\n", None),
        ("0\n", None),
        ("-5\n", None),
        ("1234\nstart_ticks=soon\n", None),
    ],
)
def test_parsing_pid_files(text: str, expected: PidRecord | None) -> None:
    assert PidRecord.parse(text) == expected


def test_the_start_time_is_read_past_a_command_name_with_parentheses_and_spaces(tmp_path: Path) -> None:
    # /proc/<pid>/stat puts the name in parentheses; a name may hold ") (" itself.
    odd = tmp_path / "a) (b c"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    proc = subprocess.Popen([str(odd), "300"])
    try:
        wait_until(lambda: "(a) (b c)" in Path(f"/proc/{proc.pid}/stat").read_text(), 10, "the name")
        ticks = supervisor.process_start_ticks(proc.pid)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[-1].split()
        assert ticks == int(fields[19])
        supervisor.write_pid_file(tmp_path / "odd.pid", proc.pid)
        assert inspect(tmp_path / "odd.pid").running
    finally:
        proc.kill()
        proc.wait()


def test_the_recorded_live_process_is_running_with_its_uptime(tmp_path: Path) -> None:
    pid_file = tmp_path / "self.pid"
    supervisor.write_pid_file(pid_file, os.getpid())
    state = inspect(pid_file)
    assert state.state == "running" and state.pid == os.getpid() and running(pid_file) == os.getpid()
    assert state.uptime_s is not None and 0 <= state.uptime_s < 86_400 * 365


def test_no_file_and_an_unreadable_file_are_no_process(tmp_path: Path) -> None:
    assert _state(tmp_path / "missing.pid") == "stopped"
    (tmp_path / "junk.pid").write_text("garbage\n")
    assert _state(tmp_path / "junk.pid") == "stopped"
    assert running(tmp_path / "junk.pid") is None


def test_a_pid_given_to_another_process_is_not_the_component(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # What pid reuse looks like: the file names a live pid, but that process started at another time.
    real = PidRecord.of(sleeper.pid)
    assert real.start_ticks is not None
    pid_file = tmp_path / "worker.pid"
    pid_file.write_text(PidRecord(sleeper.pid, real.start_ticks - 1, real.boot_id).render())
    assert _state(pid_file) == "reused" and running(pid_file) is None
    # ... or at the same tick count of an earlier boot.
    pid_file.write_text(PidRecord(sleeper.pid, real.start_ticks, "another-boot").render())
    assert _state(pid_file) == "reused" and running(pid_file) is None
    # The very process, recorded as it is, runs.
    pid_file.write_text(real.render())
    assert _state(pid_file) == "running"


def test_an_older_file_with_only_a_pid_is_not_trusted(tmp_path: Path) -> None:
    # The test's own pid, live, in the old format: it cannot be told from a reused pid.
    pid_file = tmp_path / "api.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert _state(pid_file) == "unverified" and running(pid_file) is None


def test_a_dead_pid_is_not_running(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    pid_file = tmp_path / "dead.pid"
    supervisor.write_pid_file(pid_file, proc.pid)
    proc.wait()  # reaped: the pid is free
    assert _state(pid_file) == "dead" and running(pid_file) is None


def test_a_zombie_is_not_running(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    pid_file = tmp_path / "zombie.pid"
    supervisor.write_pid_file(pid_file, proc.pid)
    try:
        # Exited and not reaped: a zombie until we wait for it.
        wait_until(lambda: not supervisor.alive(proc.pid), 10, "the child to exit")
        assert _state(pid_file) == "zombie" and running(pid_file) is None
    finally:
        proc.wait()


def test_start_detached_keeps_the_recorded_process_and_replaces_a_reused_pid(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file, log = tmp_path / "run" / "c.pid", tmp_path / "run" / "c.log"
    stale = PidRecord.of(sleeper.pid)
    assert stale.start_ticks is not None
    pid_file.parent.mkdir()
    pid_file.write_text(PidRecord(sleeper.pid, stale.start_ticks + 7, stale.boot_id).render())
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    pid = start_detached(pid_file, log, argv)
    try:
        assert pid != sleeper.pid and running(pid_file) == pid
        assert start_detached(pid_file, log, argv) == pid  # idempotent while it runs
    finally:
        assert stop_detached(pid_file, timeout=10)
    assert sleeper.poll() is None, "the unrelated process was signalled"
    assert not supervisor.alive(pid) and not pid_file.exists()


def test_stop_detached_leaves_a_process_that_only_shares_the_pid_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    for text in (
        f"{sleeper.pid}\n",  # an older file
        PidRecord(sleeper.pid, 1, supervisor.boot_id()).render(),  # a reused pid
    ):
        pid_file = tmp_path / "other.pid"
        pid_file.write_text(text)
        assert stop_detached(pid_file, timeout=2) is False
        assert sleeper.poll() is None, "the unrelated process was signalled"
        assert not pid_file.exists(), "the stale pid file stays"


def test_stop_detached_stops_the_recorded_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "g.pid"
    # A shell with a child of its own: both in the session start_detached makes, both stopped.
    pid = start_detached(pid_file, tmp_path / "g.log", ["sh", "-c", "sleep 300 & wait"])
    wait_until(lambda: len(_group(pid)) >= 2, 10, "the shell's child")
    members = _group(pid)
    assert stop_detached(pid_file, timeout=10)
    wait_until(lambda: not any(supervisor.alive(p) for p in members), 10, "the group to exit")


def _group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_zombie_or_reused_pid_is_never_signalled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    proc = subprocess.Popen(["true"])
    pid_file = tmp_path / "z.pid"
    supervisor.write_pid_file(pid_file, proc.pid)
    try:
        wait_until(lambda: not supervisor.alive(proc.pid), 10, "the child to exit")
        assert stop_detached(pid_file, timeout=1) is False
    finally:
        proc.wait()
    assert sent == []
