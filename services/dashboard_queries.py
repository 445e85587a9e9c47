"""The dashboards' ClickHouse reads: per project and period, from projections keyed by project.

Every query here reads `usage_daily` (per project, day and dimensions) or `job_pieces` (per
project and job), both ordered by project first, so a page costs what its project holds, not
what the whole ledger holds. Amounts come back as integers; GPU-hours are made at the API edge.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from allmende.clickhouse import Database
from domain.burn_rate import DayCharge
from domain.squatting import UsagePiece

_DIMENSIONS = {"cluster", "gpu_type", "user", "priority_class"}


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
    pieces: tuple[UsagePiece, ...]


class DashboardQueries:
    def __init__(self, db: Database) -> None:
        self.db = db

    def daily_charges(self, project: str, first: dt.date, last: dt.date) -> list[DayCharge]:
        """Charge units and GPU-seconds per UTC day in [first, last]."""
        rows = self.db.rows(
            "SELECT day, sum(charge_units) AS u, sum(gpu_seconds) AS s FROM {db}.usage_daily"
            " WHERE project = {p:String} AND day >= {a:Date} AND day <= {b:Date}"
            " GROUP BY day HAVING u != 0 OR s != 0 ORDER BY day",
            {"p": project, "a": first, "b": last},
        )
        return [DayCharge(d, int(u), int(s)) for d, u, s in rows]

    def totals_by(self, project: str | None, by: str, first: dt.date, last: dt.date) -> list[UsageTotals]:
        """GPU-seconds, charge and idle units per value of `by` (a dimension, or `project`)."""
        if by not in _DIMENSIONS | {"project"}:
            raise ValueError(f"cannot group usage by {by!r}")
        where = "project = {p:String} AND " if project is not None else ""
        rows = self.db.rows(
            f"SELECT toString({by}) AS k, sum(gpu_seconds) AS s, sum(charge_units) AS u,"
            " sum(idle_units) AS i FROM {db}.usage_daily"
            f" WHERE {where}day >= {{a:Date}} AND day <= {{b:Date}}"
            " GROUP BY k HAVING s != 0 OR u != 0 ORDER BY u DESC, k",
            {"p": project or "", "a": first, "b": last},
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
        """Every current piece of the jobs that had a piece under the threshold in [start, end)."""
        rows = self.db.rows(
            "SELECT job_id, any(toString(user)), any(toString(cluster)),"
            " groupArray(tuple(piece_start, piece_end, gpus, utilization_bp, charge_units))"
            " FROM (SELECT job_id, user, cluster, piece_start, piece_end, utilization_bp,"
            "   intDiv(sum(gpu_seconds), piece_end - piece_start) AS gpus, sum(charge_units) AS charge_units"
            "   FROM {db}.job_pieces WHERE project = {p:String} AND job_id IN ("
            "     SELECT DISTINCT job_id FROM {db}.job_pieces WHERE project = {p:String}"
            "     AND utilization_bp < {bp:UInt16} AND piece_end > {lo:Int64} AND piece_start < {hi:Int64}"
            "     GROUP BY job_id, entry_id, piece_start, piece_end, utilization_bp"
            "     HAVING sum(gpu_seconds) != 0)"
            "   AND piece_end > piece_start"
            "   GROUP BY job_id, entry_id, user, cluster, piece_start, piece_end, utilization_bp"
            "   HAVING sum(gpu_seconds) != 0)"
            " GROUP BY job_id ORDER BY job_id LIMIT {n:UInt32}",
            {"p": project, "bp": max_utilization_bp, "lo": start, "hi": end, "n": limit},
        )
        return [
            JobPieces(
                job_id,
                user,
                cluster,
                tuple(UsagePiece(int(a), int(b), int(g), int(u), int(c)) for a, b, g, u, c in pieces),
            )
            for job_id, user, cluster, pieces in rows
        ]

    def window_gpu_seconds(self, project: str, cluster: str, windows: Sequence[tuple[int, int]]) -> list[int]:
        """The project's GPU-seconds on `cluster` inside each window [start, end), exactly (a piece's
        GPU-seconds are GPUs x seconds, so any part of it is an integer)."""
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

    def ledger_clock(self) -> int:
        """The latest instant the ledger has charged (0 when empty): "now" of a replayed trace."""
        return int(self.db.rows("SELECT max(piece_end) FROM {db}.job_pieces")[0][0])
