"""Trace files: the CSVs of a real cluster trace, plain or inside a tarball, as the domain's jobs.

The formats and the mapping to jobs are the domain's (`allmende.domain.traces`); this module only
opens the files (see ../shared/data/traces/README.md).
"""

from __future__ import annotations

import csv
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

from allmende.domain.traces import TraceFormat, TraceJob, TraceStats, trace_jobs


def _csv_sources(path: Path, cluster: str | None) -> Iterator[tuple[str, Iterator[dict[str, str]]]]:
    if path.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path, "r:gz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                name = Path(member.name).name
                if not name.endswith(".csv") or (cluster and name != f"{cluster}.csv"):
                    continue
                raw = tar.extractfile(member)
                if raw is not None:
                    yield name[:-4], csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"))
    else:
        with path.open(encoding="utf-8", newline="") as fh:
            yield path.stem, csv.DictReader(fh)


def read_trace(
    path: Path,
    fmt: TraceFormat,
    cluster: str | None = None,
    limit: int | None = None,
    stats: TraceStats | None = None,
) -> Iterator[TraceJob]:
    """Jobs of a trace file in file order; `cluster` picks one CSV of the ElasticFlow tarball."""
    return trace_jobs(_csv_sources(path, cluster), fmt, limit, stats)
