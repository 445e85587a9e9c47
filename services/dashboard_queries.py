"""The dashboards' ClickHouse reads: per project and period, from projections keyed by project.

Every query here reads `usage_daily` (per project, day and dimensions) or `job_pieces` (per
project and job), both ordered by project first, so a page costs what its project holds, not
what the whole ledger holds. Amounts come back as integers; GPU-hours are made at the API edge.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from allmende.core.clickhouse import Database
from allmende.core.ledger_store import LOW_UTILIZATION_CAP_BP, PROJECT_JOBS
from allmende.domain.gpu_utilisation import job_pieces
from allmende.domain.squatting import JobTotals, UsagePiece

_DIMENSIONS = {"cluster", "gpu_type", "user", "priority_class"}
HOUR = 3600


@dataclass(frozen=True, slots=True)
class UsageTotals:
    key: str
    gpu_seconds: int
    charge_units: int
    idle_units: int


@dataclass(frozen=True, slots=True)
class JobPieces:
    job_id: str
    user: str
    cluster: str
    pieces: tuple[UsagePiece, ...]  # those under LOW_UTILIZATION_CAP_BP, as `contiguous_runs`
    totals: JobTotals


def contiguous_runs(
    job_ids: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    gpu_seconds: Sequence[int],
    utilization_bp: Sequence[int],
    charge_units: Sequence[int],
    max_utilization_bp: int,
) -> dict[str, list[UsagePiece]]:
    """Each job's pieces (in any order) with every run of consecutive ones (each starting where
    the previous ended) on the same GPUs and the same side of the threshold merged into one piece.

    `find_squatting` decides the same on the runs as on the pieces: a stretch is a union of runs,
    GPUs x seconds and charges are sums, and a run keeps its side of the threshold. A page then
    judges a few runs per job instead of thousands of pieces, and numpy does the merging.
    """
    if len(starts) == 0:
        return {}
    names, jobs = np.unique(np.asarray(job_ids, dtype=object), return_inverse=True)
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    order = np.lexsort((e, s, jobs))
    jobs, s, e = jobs[order], s[order], e[order]
    gpus = np.asarray(gpu_seconds, dtype=np.int64)[order] // (e - s)
    bp = np.asarray(utilization_bp, dtype=np.int64)[order]
    charge = np.asarray(charge_units, dtype=object)[order]  # Int128: Python ints, exact
    idle = bp < max_utilization_bp
    breaks = np.ones(len(s), dtype=bool)
    breaks[1:] = (jobs[1:] != jobs[:-1]) | (s[1:] != e[:-1])
    breaks[1:] |= (gpus[1:] != gpus[:-1]) | (idle[1:] != idle[:-1])
    first = np.flatnonzero(breaks)
    last = np.append(first[1:], len(s)) - 1
    runs: dict[str, list[UsagePiece]] = defaultdict(list)
    for job, a, b, g, u, c in zip(
        jobs[first].tolist(),
        s[first].tolist(),
        e[last].tolist(),
        gpus[first].tolist(),
        np.maximum.reduceat(bp, first).tolist(),
        np.add.reduceat(charge, first).tolist(),
        strict=True,
    ):
        runs[names[job]].append(UsagePiece(a, b, g, u, c))
    return dict(runs)


def merged_runs(pieces: Sequence[UsagePiece], max_utilization_bp: int) -> list[UsagePiece]:
    """Sorted pieces with every run of consecutive ones on the same GPUs and side of the threshold
    merged (as `contiguous_runs`, for a job's measured pieces)."""
    runs: list[UsagePiece] = []
    for p in pieces:
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.end == p.start
            and last.gpus == p.gpus
            and (last.utilization_bp < max_utilization_bp) == (p.utilization_bp < max_utilization_bp)
        ):
            bp = max(last.utilization_bp, p.utilization_bp)
            runs[-1] = UsagePiece(last.start, p.end, p.gpus, bp, last.charge_units + p.charge_units)
        else:
            runs.append(p)
    return runs


class DashboardQueries:
    def __init__(self, db: Database) -> None:
        self.db = db

    def totals_by(self, project: str, by: str, first: dt.date, last: dt.date) -> list[UsageTotals]:
        """The project's GPU-seconds, charge and idle units per value of the dimension `by`."""
        if by not in _DIMENSIONS:
            raise ValueError(f"cannot group usage by {by!r}")
        rows = self.db.rows(
            f"SELECT toString({by}) AS k, sum(gpu_seconds) AS s, sum(charge_units) AS u,"
            " sum(idle_units) AS i FROM {db}.usage_daily"
            " WHERE project = {p:String} AND day >= {a:Date} AND day <= {b:Date}"
            " GROUP BY k HAVING s != 0 OR u != 0 ORDER BY u DESC, k",
            {"p": project, "a": first, "b": last},
        )
        return [UsageTotals(k, int(s), int(u), int(i)) for k, s, u, i in rows]

    def cluster_days(
        self, clusters: Sequence[str], first: dt.date, last: dt.date
    ) -> list[tuple[str, dt.date, int]]:
        """GPU-seconds used per cluster and UTC day, every project together."""
        if not clusters:
            return []
        rows = self.db.rows(
            "SELECT toString(cluster) AS c, day, sum(gpu_seconds) AS s FROM {db}.usage_daily"
            " WHERE cluster IN {cs:Array(String)} AND day >= {a:Date} AND day <= {b:Date}"
            " GROUP BY c, day ORDER BY c, day",
            {"cs": list(clusters), "a": first, "b": last},
        )
        return [(c, d, int(s)) for c, d, s in rows]

    def low_utilization_jobs(
        self, project: str, max_utilization_bp: int, start: int, end: int, limit: int = 500
    ) -> list[JobPieces]:
        """The jobs that had a piece under the threshold in [start, end): every current piece of
        theirs under LOW_UTILIZATION_CAP_BP (`low_pieces`) and their totals (`job_totals`). Both
        tables hold the project's idle jobs alone, so this costs those, not all its pieces."""
        if max_utilization_bp > LOW_UTILIZATION_CAP_BP:
            raise ValueError(f"the squatting threshold may not exceed {LOW_UTILIZATION_CAP_BP} bp")
        # FINAL sums each key's rows at read time: a reversal cancels its usage row, and a key
        # summed to zero is gone, so what is left is the current pieces. The job totals come in
        # the same query (k = 1): one round trip, and the engine reads both tables at once.
        columns = self.db.columns(
            "SELECT * FROM (SELECT 0, job_id, toString(user), toString(cluster), piece_start, piece_end,"
            "   utilization_bp, gpu_seconds, charge_units FROM {db}.low_pieces FINAL"
            "   WHERE project = {p:String} AND piece_end > piece_start AND gpu_seconds != 0"
            " UNION ALL SELECT 1, job_id, '', '', 0, last_end, 0, gpu_seconds, charge_units"
            "   FROM {db}.job_totals FINAL WHERE project = {p:String}"
            "   AND job_id IN (SELECT job_id FROM {db}.low_pieces WHERE project = {p:String}"
            f"     UNION DISTINCT SELECT job_id FROM {{db}}.gpu_idle WHERE job_id IN ({PROJECT_JOBS}))"
            # GPU samples carry the job alone: whose it is comes from job_attribution.
            " UNION ALL SELECT 2, i.job_id, toString(a.user), toString(a.cluster), piece_start, piece_end,"
            "   utilization_bp, gpus, 0 FROM {db}.gpu_idle AS i FINAL"
            "   INNER JOIN (SELECT job_id, any(user) AS user, any(cluster) AS cluster"
            "     FROM {db}.job_attribution WHERE project = {p:String} GROUP BY job_id) AS a"
            "   ON i.job_id = a.job_id"
            f"   WHERE i.job_id IN ({PROJECT_JOBS}))",
            {"p": project},
        )
        if not columns or not columns[0]:
            return []
        k, job_ids, users, clusters, starts, ends, bps, secs, charges = columns
        piece = [x == 0 for x in k]
        total = [x == 1 for x in k]
        sampled = [x == 2 for x in k]

        def of(column: Sequence[Any], which: list[bool]) -> list[Any]:
            return list(compress(column, which))

        jobs_of = of(job_ids, piece)
        runs = contiguous_runs(
            jobs_of, of(starts, piece), of(ends, piece), of(secs, piece), of(bps, piece), of(charges, piece),
            max_utilization_bp,
        )  # fmt: skip
        totals = {
            j: JobTotals(s, u, e)
            for j, s, u, e in zip(
                of(job_ids, total), of(secs, total), of(charges, total), of(ends, total), strict=True
            )
        }
        who = dict(zip(jobs_of, zip(of(users, piece), of(clusters, piece), strict=True), strict=True))
        # A job the GPUs' own samples judge is judged by them alone (domain/gpu_utilisation.py).
        measured: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
        for j, user, cluster, a, b, bp, gpus in zip(
            of(job_ids, sampled), of(users, sampled), of(clusters, sampled), of(starts, sampled),
            of(ends, sampled), of(bps, sampled), of(secs, sampled), strict=True,
        ):  # fmt: skip
            measured[j].append((a, b, gpus, bp))
            who[j] = (user, cluster)
        for j, rows in measured.items():
            runs[j] = merged_runs(job_pieces(rows, totals.get(j, JobTotals(0, 0, 0))), max_utilization_bp)
        jobs = sorted(
            job
            for job, pieces in runs.items()
            if any(p.utilization_bp < max_utilization_bp and p.end > start and p.start < end for p in pieces)
        )[:limit]
        return [
            JobPieces(j, who[j][0], who[j][1], tuple(runs[j]), totals.get(j, JobTotals(0, 0, 0)))
            for j in jobs
        ]

    def window_gpu_seconds(
        self, project: str, cluster: str, windows: Sequence[tuple[int, int]], charged_to: int
    ) -> list[int]:
        """The project's GPU-seconds on `cluster` inside each window [start, end), exactly.

        Whole hours come from `usage_hourly` (a window in local time is whole hours but in a few
        zones); only partial hours at a window's edges are clipped from the pieces. Nothing is
        charged after `charged_to`, so a window ending at or after it takes its last hour whole.
        """
        hours: list[tuple[int, int, int]] = []  # (window, first hour, end hour)
        edges: list[tuple[int, int, int]] = []  # (window, start, end)
        for i, (start, end) in enumerate(windows):
            first = -(-start // HOUR)
            last = -(-end // HOUR) if end >= charged_to else end // HOUR
            if first >= last:
                edges.append((i, start, end))
                continue
            hours.append((i, first, last))
            edges += [(i, a, b) for a, b in ((start, first * HOUR), (last * HOUR, end)) if a < b]
        used = [0] * len(windows)
        if hours:
            rows = self.db.rows(
                "SELECT w, sum(gpu_seconds) FROM (SELECT arrayJoin(arrayFilter("
                "   i -> hour >= {h0:Array(Int64)}[i] AND hour < {h1:Array(Int64)}[i],"
                "   arrayEnumerate({h0:Array(Int64)}))) AS w, gpu_seconds FROM {db}.usage_hourly"
                "   WHERE project = {p:String} AND cluster = {c:String}"
                "   AND hour >= {lo:Int64} AND hour < {hi:Int64})"
                " GROUP BY w",
                {
                    "p": project, "c": cluster,
                    "h0": [h for _, h, _ in hours], "h1": [h for _, _, h in hours],
                    "lo": min(h for _, h, _ in hours), "hi": max(h for _, _, h in hours),
                },
            )  # fmt: skip
            for w, secs in rows:
                used[hours[int(w) - 1][0]] += int(secs)
        for (i, _, _), secs in zip(
            edges, self._clipped(project, cluster, [(a, b) for _, a, b in edges]), strict=True
        ):
            used[i] += secs
        return used

    def _clipped(self, project: str, cluster: str, windows: Sequence[tuple[int, int]]) -> list[int]:
        """GPU-seconds in each window [start, end) from the pieces (any part of one is exact)."""
        if not windows:
            return []
        starts = [s for s, _ in windows]
        ends = [e for _, e in windows]
        rows = self.db.rows(
            "SELECT w, sum(intDiv(gpu_seconds * ov, piece_end - piece_start)) FROM"
            " (SELECT arrayJoin(arrayEnumerate({s:Array(Int64)})) AS w,"
            "   greatest(0, least(piece_end, {e:Array(Int64)}[w])"
            "     - greatest(piece_start, {s:Array(Int64)}[w])) AS ov,"
            "   gpu_seconds, piece_start, piece_end FROM {db}.job_pieces"
            "   WHERE project = {p:String} AND cluster = {c:String} AND piece_end > piece_start"
            "   AND piece_end > {lo:Int64} AND piece_start < {hi:Int64})"
            " WHERE ov > 0 GROUP BY w",
            {"p": project, "c": cluster, "s": starts, "e": ends, "lo": min(starts), "hi": max(ends)},
        )
        used = dict.fromkeys(range(1, len(windows) + 1), 0)
        for w, secs in rows:
            used[int(w)] = int(secs)
        return [used[i] for i in range(1, len(windows) + 1)]
