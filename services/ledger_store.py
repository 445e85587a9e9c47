"""The ledger in ClickHouse: append postings, read current entry versions, offsets, projections."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allmende.clickhouse import Database
from domain.balances import ChargeRow
from domain.postings import Posting
from schemas.ledger import LedgerEntry

_POSTING_COLUMNS = (
    "posting_id",
    "kind",
    "entry_id",
    "job_id",
    "version",
    "interval_start",
    "interval_end",
    "gpus",
    "day",
    "piece_start",
    "piece_end",
    "gpu_seconds",
    "rate",
    "charge_units",
    "policy_id",
    "project",
    "user",
    "cluster",
    "gpu_type",
    "priority_class",
    "interactive",
    "source_event_id",
    "pred_event_id",
    "utilization_bp",
    "idle_units",
)
_EPOCH = dt.date(1970, 1, 1)
_USAGE_DIMENSIONS = {"user", "cluster", "gpu_type", "priority_class"}
# The projections the materialized views keep, and the key columns each sums by (in table order).
_PROJECTIONS = {
    "usage_daily": "project, day, user, cluster, gpu_type, priority_class, interactive",
    "job_pieces": "project, job_id, piece_start, piece_end, entry_id, interval_end, utilization_bp,"
    " user, cluster, gpu_type, priority_class, interactive",
}


@dataclass(frozen=True, slots=True)
class Reconciliation:
    postings_gpu_seconds: int
    postings_count: int
    projection_gpu_seconds: int
    projection_count: int
    duplicate_postings: int
    rebuilt: bool


class LedgerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- write side ---------------------------------------------------------------------------
    def append(self, postings: Sequence[Posting]) -> None:
        """One INSERT, one part: the batch lands whole or not at all."""
        rows = [
            (
                p.posting_id,
                int(p.kind),
                e.entry_id,
                e.job_id,
                e.version,
                e.interval_start,
                e.interval_end,
                e.gpus,
                _EPOCH + dt.timedelta(days=p.day),
                p.piece_start,
                p.piece_end,
                p.gpu_seconds,
                p.rate,
                p.charge_units,
                p.policy_id,
                e.project,
                e.user,
                e.cluster,
                e.gpu_type,
                e.priority_class,
                e.interactive,
                e.source_event_id,
                e.pred_event_id,
                p.utilization_bp,
                p.idle_units,
            )
            for p in postings
            for e in (p.entry,)
        ]
        self.db.insert("ledger_postings", rows, _POSTING_COLUMNS)

    def current_entries(self, job_ids: Iterable[str]) -> dict[str, LedgerEntry]:
        """The latest accepted revision of every entry of these jobs."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        rows = self.db.rows(
            "SELECT entry_id, job_id, argMax(tuple(version, interval_start, interval_end, gpus,"
            " project, user, cluster, gpu_type, priority_class, interactive, source_event_id,"
            " pred_event_id, utilization_bp), tuple(version, pred_event_id)) FROM {db}.ledger_postings"
            " WHERE kind = 'revision' AND job_id IN {ids:Array(String)}"
            " GROUP BY entry_id, job_id",
            {"ids": ids},
        )
        found = {}
        for entry_id, job_id, t in rows:
            found[entry_id] = LedgerEntry(
                entry_id=entry_id,
                job_id=job_id,
                version=int(t[0]),
                interval_start=int(t[1]),
                interval_end=int(t[2]),
                gpus=int(t[3]),
                project=t[4],
                user=t[5],
                cluster=t[6],
                gpu_type=t[7],
                priority_class=t[8],
                interactive=bool(t[9]),
                source_event_id=t[10],
                pred_event_id=t[11],
                utilization_bp=int(t[12]),
            )
        return found

    def offsets(self, consumer: str, topic: str) -> dict[int, int]:
        rows = self.db.rows(
            "SELECT partition, next_offset FROM {db}.ingest_offsets FINAL"
            " WHERE consumer = {c:String} AND topic = {t:String}",
            {"c": consumer, "t": topic},
        )
        return {int(p): int(o) for p, o in rows}

    def save_offsets(self, consumer: str, topic: str, next_offsets: Mapping[int, int]) -> None:
        self.db.insert(
            "ingest_offsets",
            [(consumer, topic, p, o) for p, o in sorted(next_offsets.items())],
            ("consumer", "topic", "partition", "next_offset"),
        )

    def reconcile(self) -> Reconciliation:
        """Check the projections (`usage_daily`, `job_pieces`) against the postings; rebuild them
        when they differ.

        A materialized view is fed by inserts only: if the process died between a postings part
        and a view's part, or a migration made a projection anew, only a rebuild restores it.
        """
        p_sum, p_charge, p_idle, p_count, p_distinct = self.db.rows(
            "SELECT sum(gpu_seconds), sum(charge_units), sum(idle_units), count(), uniqExact(posting_id)"
            " FROM {db}.ledger_postings WHERE kind != 'revision'"
        )[0]
        want = (int(p_sum), int(p_charge), int(p_idle), int(p_count))
        seen = {
            table: tuple(
                int(v)
                for v in self.db.rows(
                    "SELECT sum(gpu_seconds), sum(charge_units), sum(idle_units), sum(postings)"
                    f" FROM {{db}}.{table}"
                )[0]
            )
            for table in _PROJECTIONS
        }
        rebuilt = any(totals != want for totals in seen.values())
        if rebuilt:
            self.rebuild_projections()
        daily = seen["usage_daily"]
        return Reconciliation(want[0], want[3], daily[0], daily[3], want[3] - int(p_distinct), rebuilt)

    def rebuild_projections(self) -> None:
        for table, columns in _PROJECTIONS.items():
            self.db.command(f"TRUNCATE TABLE {{db}}.{table}")
            self.db.command(
                f"INSERT INTO {{db}}.{table} SELECT {columns}, sum(gpu_seconds), sum(charge_units),"
                f" sum(idle_units), count() FROM {{db}}.ledger_postings WHERE kind != 'revision'"
                f" GROUP BY {columns}"
            )

    def charge_horizon(self) -> int:
        """The latest instant of charged usage (0 for an empty ledger): policies start after it."""
        return int(self.db.rows("SELECT max(piece_end) FROM {db}.ledger_postings WHERE kind = 'usage'")[0][0])

    # -- read side ----------------------------------------------------------------------------
    def total_gpu_seconds(self, project: str | None = None) -> int:
        where, params = ("WHERE project = {p:String}", {"p": project}) if project else ("", {})
        return int(self.db.rows(f"SELECT sum(gpu_seconds) FROM {{db}}.usage_daily {where}", params)[0][0])

    def job_gpu_seconds(self) -> dict[str, int]:
        rows = self.db.rows(
            "SELECT job_id, sum(gpu_seconds) FROM {db}.ledger_postings"
            " WHERE kind != 'revision' GROUP BY job_id"
        )
        return {j: int(s) for j, s in rows}

    def job_idle_units(self) -> dict[str, int]:
        """Idle GPU-seconds x 10,000 per job (`domain.postings.idle_units`), from the postings."""
        rows = self.db.rows(
            "SELECT job_id, sum(idle_units) FROM {db}.ledger_postings"
            " WHERE kind != 'revision' GROUP BY job_id"
        )
        return {j: int(s) for j, s in rows}

    def usage_by_day(
        self, project: str, first_day: dt.date, last_day: dt.date, group_by: str | None = None
    ) -> list[tuple[dt.date, str, int]]:
        """GPU-seconds per UTC day (and per `group_by` value) for days in [first_day, last_day]."""
        if group_by is not None and group_by not in _USAGE_DIMENSIONS:
            raise ValueError(f"cannot group usage by {group_by!r}")
        key = group_by or "''"
        rows = self.db.rows(
            f"SELECT day, toString({key}) AS k, sum(gpu_seconds) AS s FROM {{db}}.usage_daily"
            " WHERE project = {p:String} AND day >= {a:Date} AND day <= {b:Date}"
            " GROUP BY day, k HAVING s != 0 ORDER BY day, k",
            {"p": project, "a": first_day, "b": last_day},
        )
        return [(d, k, int(s)) for d, k, s in rows]

    def projects(self) -> list[str]:
        return [r[0] for r in self.db.rows("SELECT DISTINCT project FROM {db}.usage_daily ORDER BY 1")]

    def project_days(self, project: str) -> tuple[dt.date, dt.date] | None:
        rows = self.db.rows(
            "SELECT min(day), max(day), count() FROM {db}.usage_daily WHERE project = {p:String}",
            {"p": project},
        )
        first, last, n = rows[0]
        return (first, last) if n else None

    # -- balances -----------------------------------------------------------------------------
    def charge_rows(self, project: str, segments: Sequence[tuple[int, int]], as_of: int) -> list[ChargeRow]:
        """The project's charges clipped to each segment, per cluster and GPU type, as of `as_of`.

        As of an instant means: the entries whose closing event had occurred by then (a replay of
        the events up to then gives exactly these). Clipping is exact: a posting's charge is
        GPU-seconds x a constant rate, so any part of it is an integer.
        """
        if not segments:
            return []
        starts = [s for s, _ in segments]
        ends = [e for _, e in segments]
        rows = self.db.rows(
            "SELECT seg, cluster, gpu_type,"
            " sum(intDiv(charge_units * ov, piece_end - piece_start)) AS units,"
            " sum(intDiv(gpu_seconds * ov, piece_end - piece_start)) AS secs"
            " FROM (SELECT arrayJoin(arrayEnumerate({s:Array(Int64)})) AS seg,"
            "   greatest(0, least(piece_end, {e:Array(Int64)}[seg])"
            "     - greatest(piece_start, {s:Array(Int64)}[seg])) AS ov,"
            "   charge_units, gpu_seconds, piece_start, piece_end, cluster, gpu_type"
            "   FROM {db}.job_pieces"  # ordered by project: a balance reads its project alone
            "   WHERE project = {p:String} AND interval_end <= {at:Int64}"
            "     AND piece_end > {lo:Int64} AND piece_start < {hi:Int64})"
            " WHERE ov > 0 GROUP BY seg, cluster, gpu_type ORDER BY seg, cluster, gpu_type",
            {"p": project, "s": starts, "e": ends, "at": as_of, "lo": min(starts), "hi": max(ends)},
        )
        return [
            ChargeRow(starts[seg - 1], ends[seg - 1], cluster, gpu_type, int(units), int(secs))
            for seg, cluster, gpu_type, units, secs in rows
        ]

    def project_charges(self, project: str, as_of: int) -> tuple[int, int]:
        """(charge units, GPU-seconds) of every entry of the project closed by `as_of`."""
        units, secs = self.db.rows(
            "SELECT sum(charge_units), sum(gpu_seconds) FROM {db}.job_pieces"
            " WHERE project = {p:String} AND interval_end <= {at:Int64}",
            {"p": project, "at": as_of},
        )[0]
        return int(units), int(secs)
