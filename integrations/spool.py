"""A durable spool of job events on their way to Kafka: one file per event.

Every event is written here first (a temporary file, fsync, atomic rename, fsync of the directory),
then sent; a file is removed only once the broker has acknowledged its event (acks=all). What
could not be sent (Kafka away) stays and goes out with the next flush: the next hook invocation
flushes first, and `python -m allmende.integrations.slurm.lifecycle flush` (or `allmende slurm flush`)
does it by hand or from a timer. Event ids are deterministic, so an event sent twice (a crash
between the acknowledgement and the removal) is one event to the platform.

Files are named `<ns since epoch>-<pid>-<seq>.json` and sent in name order, so a job's
JobSubmitted goes before its JobStarted. One flusher at a time (an exclusive lock on `.lock`); a
hook that finds the lock taken waits for it, then sends what the other one left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

_seq = 0


@dataclass(frozen=True)
class Spooled:
    path: Path
    topic: str
    key: bytes
    value: bytes


class Spool:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.tmp = directory / "tmp"
        self.last_error: str | None = None  # why the last flush left events behind

    def _ensure(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)

    def put(self, topic: str, key: str, value: bytes) -> Path:
        """Durably store one record; returns its file."""
        global _seq
        self._ensure()
        _seq += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{_seq:04d}.json"
        body = json.dumps({"topic": topic, "key": key, "value": value.decode()}).encode()
        tmp = self.tmp / name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        final = self.dir / name
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        return final

    def pending(self) -> list[Spooled]:
        if not self.dir.is_dir():
            return []
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                data: dict[str, Any] = json.loads(path.read_text())
                out.append(Spooled(path, data["topic"], data["key"].encode(), data["value"].encode()))
            except (OSError, ValueError, KeyError):
                bad = path.with_suffix(".bad")
                with contextlib.suppress(OSError):
                    path.rename(bad)  # kept for a human, never retried forever
        return out

    @contextlib.contextmanager
    def locked(self, wait_s: float = 0.0) -> Iterator[bool]:
        """True when this process holds the flush lock, waited for up to `wait_s`."""
        self._ensure()
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.05)
            yield True
        finally:
            os.close(fd)

    def flush(self, bootstrap: str, timeout_s: float = 5.0) -> tuple[int, int]:
        """Send what is spooled; (sent, left). Never raises for Kafka being away. Waits for a
        flush running elsewhere to end (it takes at most about `timeout_s`), then sends what is
        left, its own events included."""
        self.last_error = None
        with self.locked(wait_s=2 * timeout_s + 1) as mine:
            if not mine:
                self.last_error = "another process is flushing the spool"
                return 0, len(self.pending())
            records = self.pending()
            if not records:
                return 0, 0
            try:
                producer = make_producer(bootstrap, timeout_s)
            except Exception as exc:
                self.last_error = f"no producer for {bootstrap}: {exc!r}"
                return 0, len(records)
            sent = 0
            try:
                futures = []
                for record in records:
                    try:
                        futures.append(
                            (record, producer.send(record.topic, key=record.key, value=record.value))
                        )
                    except Exception as exc:  # no metadata for the topic in time: the broker is away
                        self.last_error = f"send to {record.topic}: {exc!r}"
                        break
                try:
                    producer.flush(timeout=timeout_s)
                except Exception as exc:
                    self.last_error = f"flush: {exc!r}"
                for record, future in futures:
                    if future.is_done and future.succeeded():
                        with contextlib.suppress(FileNotFoundError):
                            record.path.unlink()
                        sent += 1
                    elif future.is_done:
                        self.last_error = f"{record.path.name}: {future.exception!r}"
            finally:
                with contextlib.suppress(Exception):
                    producer.close(timeout=1)
            if sent:
                _fsync_dir(self.dir)
            return sent, len(records) - sent


def make_producer(bootstrap: str, timeout_s: float) -> KafkaProducer:
    ms = int(timeout_s * 1000)
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        retries=3,
        request_timeout_ms=ms,
        delivery_timeout_ms=max(ms, 2 * ms),
        max_block_ms=ms,
        bootstrap_timeout_ms=ms,
        reconnect_backoff_max_ms=500,
        linger_ms=0,
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
