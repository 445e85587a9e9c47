"""Checkpoints: a projection's state with the Kafka offsets it covers, so that a starting process
loads it and reads only the tail of its topics (issue 23).

One file per projection and topic prefix, `<checkpoint_dir>/<prefix>/<kind>.ckpt`, replaced
atomically (temporary file, fsync, rename, fsync of the directory): a crash leaves the old one or
the new one, never half of either. The file is a header line (JSON: magic, format version, kind,
the offsets, a fingerprint of the settings the state depends on, when it was taken, the body's
length and SHA-256) and the body (the projection's own `dump()`, JSON, gzip'ed).

`load` never trusts a file blindly: a wrong magic, version, kind or fingerprint, a body that does
not match its checksum, or offsets outside what the topics hold now (the topic was recreated, or
its start was deleted) make it ignored with a log line, and the projection is rebuilt by replay as
without a checkpoint. A checkpoint is a shortcut, never a source of truth.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import structlog

log = structlog.get_logger(__name__)
MAGIC = "allmende-checkpoint"
FORMAT = 1

Offsets = dict[str, dict[int, int]]  # topic -> partition -> the next offset to read


@dataclass(frozen=True)
class Checkpoint:
    kind: str
    offsets: Offsets
    fingerprint: dict[str, Any]  # what the state depends on besides its topics: must match to load
    body: Any
    taken_at: int = field(default_factory=lambda: int(time.time()))


class CheckpointStore:
    def __init__(self, directory: Path, prefix: str) -> None:
        self.directory = directory / prefix

    def path(self, kind: str) -> Path:
        return self.directory / f"{kind}.ckpt"

    def save(self, checkpoint: Checkpoint) -> int:
        """Write it in place of the last one (atomically); returns the file's size."""
        body = gzip.compress(encode_body(checkpoint.body), compresslevel=1)
        offsets = {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in checkpoint.offsets.items()}
        header = {
            "magic": MAGIC, "format": FORMAT, "kind": checkpoint.kind,
            "offsets": offsets,
            "fingerprint": checkpoint.fingerprint, "taken_at": checkpoint.taken_at,
            "body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
        }  # fmt: skip
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(checkpoint.kind)
        tmp = target.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(orjson.dumps(header) + b"\n")
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return target.stat().st_size

    def load(self, kind: str, fingerprint: Mapping[str, Any]) -> Checkpoint | None:
        """The checkpoint of `kind` if there is one that can be trusted with these settings; None
        (with a log line saying why) otherwise. Offsets are checked against the topics by the
        caller (`offsets_problem`), which holds a consumer."""
        target = self.path(kind)
        if not target.exists():
            return None
        try:
            checkpoint = _read(target, kind, fingerprint)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("checkpoint_ignored", kind=kind, path=str(target), reason=str(exc))
            return None
        return checkpoint


def _read(target: Path, kind: str, fingerprint: Mapping[str, Any]) -> Checkpoint:
    with target.open("rb") as f:
        header = orjson.loads(f.readline())
        body = f.read()
    if header.get("magic") != MAGIC or header.get("format") != FORMAT:
        raise ValueError(f"not a checkpoint of format {FORMAT}")
    if header["kind"] != kind:
        raise ValueError(f"a checkpoint of {header['kind']}, not {kind}")
    if header["fingerprint"] != dict(fingerprint):
        raise ValueError(f"taken with other settings ({header['fingerprint']}, now {dict(fingerprint)})")
    if len(body) != header["body_bytes"] or hashlib.sha256(body).hexdigest() != header["body_sha256"]:
        raise ValueError("its body does not match its checksum (cut short or altered)")
    offsets = {t: {int(p): int(o) for p, o in ps.items()} for t, ps in header["offsets"].items()}
    return Checkpoint(
        kind, offsets, header["fingerprint"], orjson.loads(gzip.decompress(body)), header["taken_at"]
    )


def encode_body(body: Any) -> bytes:
    """A body as JSON: plain data, and the frozen event models a dump may hold by reference (taken
    under a lock cheaply, serialised here, outside it)."""
    return orjson.dumps(body, default=_event_json)


def _event_json(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if dump is None:
        raise TypeError(f"{type(value).__name__} is not JSON")
    return dump(mode="json")


def offsets_problem(expected: Offsets, beginnings: Offsets, ends: Offsets) -> str | None:
    """Why offsets cannot resume these topics as they are now (None: they can): every partition of
    the topic and no other, each offset between the partition's first and next offset."""
    for topic, partitions in expected.items():
        first, end = beginnings.get(topic, {}), ends.get(topic, {})
        if set(partitions) != set(end):
            return f"{topic} has partitions {sorted(end)}, the checkpoint {sorted(partitions)}"
        for partition, offset in sorted(partitions.items()):
            if offset > end[partition]:
                return f"{topic}[{partition}] ends at {end[partition]}, before the checkpoint's {offset}"
            if offset < first.get(partition, 0):
                return f"{topic}[{partition}] starts at {first[partition]}, after the checkpoint's {offset}"
    return None
