"""The ledger in ClickHouse: append postings, read current entry versions, offsets, projections."""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allmende.core.clickhouse import Database
from allmende.domain.balances import ChargeRow
from allmende.domain.gpu_utilisation import LOW_CAP_BP, IdleRow, JobAttribution, UnaccountedRow
from allmende.domain.postings import Posting, PostingKind
from allmende.schemas.admission_events import AdmissionDecided, encode_admission_event, parse_admission_event
from allmende.schemas.events import JobPreempted
from allmende.schemas.ledger import LedgerEntry

_UNACCOUNTED_COLUMNS = ("node", "piece_start", "piece_end", "gpus", "utilization_bp")
# In the rows' own field order (IdleRow, JobAttribution, UnaccountedRow): inserted as they are.
_IDLE_COLUMNS = ("job_id", "node", "piece_start", "piece_end", "gpus", "utilization_bp")
_ATTRIBUTION_COLUMNS = ("job_id", "project", "user", "cluster")
# The jobs of project {p}, for reading their GPU samples (gpu_idle is keyed by job).
PROJECT_JOBS = "SELECT job_id FROM {db}.job_attribution WHERE project = {p:String}"
_PROJECT_OF_MAX = 100_000  # jobs whose project the sole writer remembers (a job's never changes)
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
# Admission decisions (`admission_decisions`, migration 0009): every one ever recorded.
_DECISION_COLUMNS = (
    "job_id",
    "attempt",
    "occurred_at",
    "project",
    "user",
    "cluster",
    "verdict",
    "lane",
    "event_id",
    "log_offset",
    "event",
)
_EPOCH = dt.date(1970, 1, 1)
_DAY = 86_400
_USAGE_DIMENSIONS = {"user", "cluster", "gpu_type", "priority_class"}
_DAILY_KEYS = "project, day, user, cluster, gpu_type, priority_class, interactive"
_PIECE_KEYS = (
    "project, job_id, piece_start, piece_end, entry_id, interval_end, utilization_bp,"
    " user, cluster, gpu_type, priority_class, interactive"
)
_LOW_KEYS = "project, job_id, piece_start, piece_end, entry_id, utilization_bp, user, cluster"
_SUMS = "sum(gpu_seconds), sum(charge_units), sum(idle_units)"
_USAGE = "FROM {db}.ledger_postings WHERE kind != 'revision'"
# Pieces under this utilisation are kept apart for squatting (`low_pieces`, migration 0008).
LOW_UTILIZATION_CAP_BP = LOW_CAP_BP  # the squatting cap (domain/gpu_utilisation.py): one number
# The ledger's horizon from its postings (`ledger_horizon`, migration 0006).
_HORIZON = "maxIf(piece_end, kind = 'usage'), maxIf(interval_end, kind != 'revision')"
# Each projection the materialized views keep beside the postings: (what reconcile sums in it,
# the SELECT that rebuilds it from the postings, which mirrors its view in schemas/clickhouse/).
_PROJECTIONS = {
    "usage_daily": (
        f"{_SUMS}, sum(postings)",
        f"SELECT {_DAILY_KEYS}, {_SUMS}, count() {_USAGE} GROUP BY {_DAILY_KEYS}",
    ),
    "job_pieces": (
        f"{_SUMS}, sum(postings)",
        f"SELECT {_PIECE_KEYS}, {_SUMS}, count() {_USAGE} GROUP BY {_PIECE_KEYS}",
    ),
    "usage_hourly": (
        "sum(gpu_seconds)",
        "SELECT project, cluster, hour, sum(intDiv(gpu_seconds * (least(piece_end, (hour + 1) * 3600)"
        " - greatest(piece_start, hour * 3600)), piece_end - piece_start)) FROM {db}.ledger_postings"
        " ARRAY JOIN range(intDiv(piece_start, 3600), intDiv(piece_end - 1, 3600) + 1) AS hour"
        " WHERE kind != 'revision' AND piece_end > piece_start GROUP BY project, cluster, hour",
    ),
    "low_pieces": (
        "sum(gpu_seconds), sum(charge_units)",
        f"SELECT {_LOW_KEYS}, sum(gpu_seconds), sum(charge_units) {_USAGE}"
        f" AND utilization_bp < {LOW_UTILIZATION_CAP_BP} GROUP BY {_LOW_KEYS}",
    ),
    "job_totals": (
        "sum(gpu_seconds), sum(charge_units), max(last_end)",
        "SELECT project, job_id, sum(gpu_seconds), sum(charge_units), maxIf(piece_end, kind = 'usage')"
        f" {_USAGE} GROUP BY project, job_id",
    ),
    "ledger_horizon": ("max(charged_to), max(closed_to)", f"SELECT {_HORIZON} FROM {{db}}.ledger_postings"),
}


@dataclass(frozen=True, slots=True)
class Reconciliation:
    postings_gpu_seconds: int
    postings_count: int
    projection_gpu_seconds: int
    projection_count: int
    duplicate_postings: int
    rebuilt: bool


@dataclass(frozen=True, slots=True)
class DayUsage:
    """One project's usage on one UTC day, cluster and GPU type (`usage_daily` summed)."""

    project: str
    day: dt.date
    cluster: str
    gpu_type: str
    charge_units: int
    gpu_seconds: int
    idle_units: int


@dataclass(frozen=True, slots=True)
class ProjectCharges:
    rows: list[ChargeRow]  # clipped to the project's segments
    charge_units: int  # every charge, inside the segments or not
    gpu_seconds: int


def _whole_days(
    spans: Sequence[tuple[str, int, int]],
) -> tuple[list[tuple[int, dt.date, dt.date]], list[tuple[int, int, int]]]:
    """Split each span [start, end) into its whole UTC days, (index, first day, end day), and the
    partial days at its edges, (index, start, end)."""
    days, edges = [], []
    for i, (_, start, end) in enumerate(spans):
        first, last = -(-start // _DAY) * _DAY, end // _DAY * _DAY
        if first >= last:
            edges.append((i, start, end))
            continue
        days.append((i, _EPOCH + dt.timedelta(days=first // _DAY), _EPOCH + dt.timedelta(days=last // _DAY)))
        edges += [(i, a, b) for a, b in ((start, first), (last, end)) if a < b]
    return days, edges


class LedgerStore:
    def __init__(self, db: Database, sole_writer: bool = False) -> None:
        """`sole_writer`: every posting of this database goes through this object (embedded chDB,
        the writer in this process), so it keeps the ledger's horizon in memory instead of
        reading it per request."""
        self.db = db
        self._sole_writer = sole_writer
        self._known_horizon: tuple[int, int] | None = None
        # Sole writer: per project, the jobs that have a piece under the cap (loaded on first
        # ask) and a version that moves whenever a posting reaches one of them.
        self._idle_lock = threading.Lock()
        self._idle_jobs: dict[str, set[str]] = {}
        self._idle_versions: dict[str, int] = defaultdict(int)
        self._project_of: dict[str, str] = {}  # job -> project, from job_attribution

    # -- write side ---------------------------------------------------------------------------
    def append(self, postings: Sequence[Posting]) -> None:
        """One INSERT, one part: the batch lands whole or not at all."""
        if not self._sole_writer:
            self._insert(postings)
            return
        # One pass for what this process keeps in memory: the horizon, and per job whether the
        # batch brings it a piece under the cap.
        charged_to, closed_to = self._horizon()
        jobs: dict[tuple[str, str], bool] = {}
        for p in postings:
            if p.kind is PostingKind.REVISION:
                continue
            if p.kind is PostingKind.USAGE:
                charged_to = max(charged_to, p.piece_end)
            closed_to = max(closed_to, p.entry.interval_end)
            key = (p.entry.project, p.entry.job_id)
            jobs[key] = jobs.get(key, False) or p.utilization_bp < LOW_UTILIZATION_CAP_BP
        # The horizon moves before the insert: one ahead of the rows only sends a balance down
        # the exact path; one behind them could take the shortcut for entries not yet closed.
        self._known_horizon = (charged_to, closed_to)
        self._insert(postings)
        self._note_idle(jobs)

    def append_idle(self, rows: Sequence[IdleRow], unaccounted: Sequence[UnaccountedRow] = ()) -> None:
        """GPU sample rows under the cap and unaccounted use (domain/gpu_utilisation.py): an
        INSERT each; idempotent (keyed)."""
        if unaccounted:
            self.db.insert("gpu_unaccounted", unaccounted, _UNACCOUNTED_COLUMNS)
        if not rows:
            return
        self.db.insert("gpu_idle", rows, _IDLE_COLUMNS)
        if self._sole_writer:
            # Looked up after the insert: a job attributed after this lookup is noted by
            # `append_attributions`, which then follows these rows.
            projects = self._projects(r.job_id for r in rows)
            self._note_idle({(projects[r.job_id], r.job_id): True for r in rows if r.job_id in projects})

    def append_attributions(self, found: Sequence[JobAttribution]) -> None:
        """Whose each job is (from its JobSubmitted); idempotent (keyed)."""
        if not found:
            return
        self.db.insert("job_attribution", found, _ATTRIBUTION_COLUMNS)
        if self._sole_writer:
            # Samples that came before a job's attribution count for its project from now on: only
            # those jobs move its version (most jobs have no idle rows; gpu_idle is keyed by job).
            # Looked up after the insert: rows written after this lookup are noted by `append_idle`.
            sampled = {
                str(j)
                for (j,) in self.db.rows(
                    "SELECT DISTINCT job_id FROM {db}.gpu_idle WHERE job_id IN {j:Array(String)}",
                    {"j": [a.job_id for a in found]},
                )
            }
            self._note_idle({(a.project, a.job_id): True for a in found if a.job_id in sampled})

    def _projects(self, job_ids: Iterable[str]) -> dict[str, str]:
        """Each attributed job's project (unattributed ones are left out)."""
        wanted = set(job_ids)
        missing = [j for j in wanted if j not in self._project_of]
        if missing:
            if len(self._project_of) + len(missing) > _PROJECT_OF_MAX:
                self._project_of.clear()  # bounded: jobs come and go; any can be read again
            rows = self.db.rows(
                "SELECT job_id, any(toString(project)) FROM {db}.job_attribution"
                " WHERE job_id IN {j:Array(String)} GROUP BY job_id",
                {"j": missing},
            )
            self._project_of.update({str(j): str(p) for j, p in rows})
        return {j: self._project_of[j] for j in wanted if j in self._project_of}

    def unaccounted_gpu_seconds(self, start: int, end: int) -> dict[str, int]:
        """Per node, GPU-seconds of GPUs busy with no job on them in [start, end) (periods
        clipped to it), from the GPUs' own samples."""
        rows = self.db.rows(
            "SELECT node, sum(gpus * (least(piece_end, {b:Int64}) - greatest(piece_start, {a:Int64})))"
            " FROM {db}.gpu_unaccounted FINAL WHERE piece_end > {a:Int64} AND piece_start < {b:Int64}"
            " GROUP BY node",
            {"a": start, "b": end},
        )
        return {str(node): int(s) for node, s in rows}

    def _note_idle(self, jobs: Mapping[tuple[str, str], bool]) -> None:
        """After the insert (a reader that saw the old version may have read the old rows, and
        the new version tells it to read again): move the version of every project whose idle
        jobs the batch reached; `jobs`: (project, job) -> it brought a piece under the cap."""
        with self._idle_lock:
            for (project, job), low in jobs.items():
                idle = self._idle_jobs.get(project)
                if idle is None:
                    self._idle_versions[project] += 1  # nobody reads it yet: move it anyway
                    continue
                if low:
                    idle.add(job)
                if job in idle:
                    self._idle_versions[project] += 1

    def idle_version(self, project: str) -> int | None:
        """What the project's squatting reads (`low_pieces`, `job_totals` of its idle jobs) is
        unchanged while this number is; None when other processes write (nothing to cache by)."""
        if not self._sole_writer:
            return None
        with self._idle_lock:
            if project not in self._idle_jobs:
                found = self.db.rows(
                    f"SELECT job_id FROM {{db}}.low_pieces WHERE project = {{p:String}} UNION DISTINCT"
                    f" SELECT job_id FROM {{db}}.gpu_idle WHERE job_id IN ({PROJECT_JOBS})",
                    {"p": project},
                )
                self._idle_jobs[project] = {j for (j,) in found}
            return self._idle_versions[project]

    def _insert(self, postings: Sequence[Posting]) -> None:
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
        """Check every projection against the postings; rebuild them all when one differs.

        A materialized view is fed by inserts only: if the process died between a postings part
        and a view's part, or a migration made a projection anew, only a rebuild restores it.
        """
        p_sum, p_charge, p_idle, p_count, p_distinct, charged_to, closed_to, low_sum, low_charge = (
            self.db.rows(
                "SELECT sum(gpu_seconds), sum(charge_units), sum(idle_units), count(), uniqExact(posting_id),"
                f" {_HORIZON}, sumIf(gpu_seconds, utilization_bp < {LOW_UTILIZATION_CAP_BP}),"
                f" sumIf(charge_units, utilization_bp < {LOW_UTILIZATION_CAP_BP})"
                " FROM {db}.ledger_postings WHERE kind != 'revision'"
            )[0]
        )
        want = (int(p_sum), int(p_charge), int(p_idle), int(p_count))
        summed = {
            table: tuple(int(v) for v in self.db.rows(f"SELECT {sums} FROM {{db}}.{table}")[0])
            for table, (sums, _) in _PROJECTIONS.items()
        }
        expected = {
            "usage_daily": want,
            "job_pieces": want,
            "usage_hourly": (want[0],),
            "low_pieces": (int(low_sum), int(low_charge)),
            "job_totals": (want[0], want[1], int(charged_to)),
            "ledger_horizon": (int(charged_to), int(closed_to)),
        }
        rebuilt = summed != expected
        if rebuilt:
            self.rebuild_projections()
        daily = summed["usage_daily"]
        return Reconciliation(want[0], want[3], daily[0], daily[3], want[3] - int(p_distinct), rebuilt)

    def rebuild_projections(self) -> None:
        for table, (_, select) in _PROJECTIONS.items():
            self.db.command(f"TRUNCATE TABLE {{db}}.{table}")
            self.db.command(f"INSERT INTO {{db}}.{table} {select}")

    def _horizon(self) -> tuple[int, int]:
        if self._known_horizon is not None:
            return self._known_horizon
        found = self._horizon_table()
        if self._sole_writer:
            self._known_horizon = found
        return found

    def _horizon_table(self) -> tuple[int, int]:
        charged_to, closed_to = self.db.rows(
            "SELECT max(charged_to), max(closed_to) FROM {db}.ledger_horizon"
        )[0]
        return int(charged_to), int(closed_to)

    def charge_horizon(self) -> int:
        """The latest instant of charged usage (0 for an empty ledger): policies start after it."""
        return self._horizon()[0]

    def closed_to(self) -> int:
        """The latest end of any entry version posted (0 for an empty ledger): as of then or later,
        every entry of the ledger has closed."""
        return self._horizon()[1]

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
    def daily_usage(self, projects: Sequence[str] | None = None) -> list[DayUsage]:
        """Every day of the projects' usage (every project's with None), per cluster and GPU type:
        one query of `usage_daily`, whose size grows with days and not with jobs."""
        where = "WHERE project IN {ps:Array(String)}" if projects is not None else ""
        rows = self.db.rows(
            "SELECT toString(project), day, toString(cluster), toString(gpu_type),"
            " sum(charge_units) AS u, sum(gpu_seconds) AS s, sum(idle_units) AS i"
            f" FROM {{db}}.usage_daily {where} GROUP BY project, day, cluster, gpu_type"
            " HAVING u != 0 OR s != 0 OR i != 0",
            {"ps": list(projects or ())},
        )
        return [DayUsage(p, d, c, g, int(u), int(s), int(i)) for p, d, c, g, u, s, i in rows]

    def charges_of(
        self,
        segments: Mapping[str, Sequence[tuple[int, int]]],
        as_of: int,
        whole_days: bool = True,
        days: Sequence[DayUsage] | None = None,
    ) -> dict[str, ProjectCharges]:
        """Each project's charges as of `as_of`: clipped to each of its segments per cluster and
        GPU type, and in total.

        As of an instant means: the entries whose closing event had occurred by then (a replay of
        the events up to then gives exactly these). Clipping is exact: a posting's charge is
        GPU-seconds x a constant rate, so any part of it is an integer. Once every entry of the
        ledger has closed by `as_of` (a balance now, the usual case), the whole UTC days of a
        segment come from `daily_usage` (postings are cut at midnight, so a day's rows are exactly
        its charges; pass `days` when already read), and only the partial days at a segment's
        edges are clipped from `job_pieces`. `whole_days=False` clips every piece instead: what
        the shortcut must equal.
        """
        spans = [(p, s, e) for p, segs in segments.items() for s, e in segs]
        projects = list(segments)
        parts: list[tuple[int, str, str, int, int]] = []
        if whole_days and as_of >= self.closed_to():
            usage = self.daily_usage(projects) if days is None else days
            by_project: dict[str, list[DayUsage]] = defaultdict(list)
            for d in usage:
                by_project[d.project].append(d)
            whole, edges = _whole_days(spans)
            for i, first_day, end_day in whole:
                parts += [
                    (i, d.cluster, d.gpu_type, d.charge_units, d.gpu_seconds)
                    for d in by_project[spans[i][0]]
                    if first_day <= d.day < end_day
                ]
            parts += self._clipped_parts(spans, edges, None)
            totals = {
                p: (sum(d.charge_units for d in ds), sum(d.gpu_seconds for d in ds))
                for p, ds in by_project.items()
            }
        else:
            parts += self._clipped_parts(spans, [(i, s, e) for i, (_, s, e) in enumerate(spans)], as_of)
            totals = self._project_totals(projects, as_of)
        summed: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])
        for i, cluster, gpu_type, units, secs in parts:
            summed[(i, cluster, gpu_type)][0] += units
            summed[(i, cluster, gpu_type)][1] += secs
        rows: dict[str, list[ChargeRow]] = {p: [] for p in projects}
        for (i, cluster, gpu_type), (units, secs) in sorted(summed.items()):
            project, start, end = spans[i]
            rows[project].append(ChargeRow(start, end, cluster, gpu_type, units, secs))
        return {p: ProjectCharges(rows[p], *totals.get(p, (0, 0))) for p in projects}

    def project_charges(self, project: str, as_of: int) -> tuple[int, int]:
        """(charge units, GPU-seconds) of every entry of the project closed by `as_of`."""
        found = self.charges_of({project: ()}, as_of)[project]
        return found.charge_units, found.gpu_seconds

    def _project_totals(self, projects: Sequence[str], as_of: int) -> dict[str, tuple[int, int]]:
        """(charge units, GPU-seconds) per project of the entries closed by `as_of`."""
        if not projects:
            return {}
        found = self.db.rows(
            "SELECT toString(project), sum(charge_units), sum(gpu_seconds) FROM {db}.job_pieces"
            " WHERE project IN {ps:Array(String)} AND interval_end <= {at:Int64} GROUP BY project",
            {"ps": list(projects), "at": as_of},
        )
        return {p: (int(u), int(s)) for p, u, s in found}

    def _clipped_parts(
        self, spans: Sequence[tuple[str, int, int]], parts: Sequence[tuple[int, int, int]], as_of: int | None
    ) -> list[tuple[int, str, str, int, int]]:
        """(span index, cluster, GPU type, charge units, GPU-seconds) of the pieces clipped to each
        part [start, end) of a span; with `as_of`, only of the entries closed by then."""
        if not parts:
            return []
        closed = "" if as_of is None else " AND interval_end <= {at:Int64}"
        found = self.db.rows(
            "SELECT seg, toString(cluster), toString(gpu_type),"
            " sum(intDiv(charge_units * ov, piece_end - piece_start)),"
            " sum(intDiv(gpu_seconds * ov, piece_end - piece_start))"
            " FROM (SELECT arrayJoin(arrayFilter(i -> {ps:Array(String)}[i] = project"
            "     AND piece_end > {s:Array(Int64)}[i] AND piece_start < {e:Array(Int64)}[i],"
            "     arrayEnumerate({ps:Array(String)}))) AS seg,"
            "   least(piece_end, {e:Array(Int64)}[seg]) - greatest(piece_start, {s:Array(Int64)}[seg]) AS ov,"
            "   charge_units, gpu_seconds, piece_start, piece_end, cluster, gpu_type"
            "   FROM {db}.job_pieces"  # ordered by project: a balance reads its projects alone
            f"   WHERE project IN {{ps:Array(String)}}{closed} AND piece_end > piece_start"
            "     AND piece_end > {lo:Int64} AND piece_start < {hi:Int64})"
            " GROUP BY seg, cluster, gpu_type",
            {
                "ps": [spans[i][0] for i, _, _ in parts],
                "s": [s for _, s, _ in parts],
                "e": [e for _, _, e in parts],
                "at": as_of or 0,
                "lo": min(s for _, s, _ in parts),
                "hi": max(e for _, _, e in parts),
            },
        )
        return [(parts[seg - 1][0], c, g, int(u), int(s)) for seg, c, g, u, s in found]

    # -- admission decisions (streams/decision_writer.py writes them) --------------------------
    def append_decisions(self, decisions: Sequence[tuple[int, AdmissionDecided]]) -> None:
        """(offset in the admission log, decision) pairs, as one INSERT. Idempotent in effect: a
        decision written again is the same row of `admission_decisions` once read with FINAL."""
        rows = [
            (
                d.job_id,
                d.attempt,
                d.occurred_at,
                d.project,
                d.user,
                d.cluster,
                d.verdict,
                d.lane or "",
                d.event_id,
                offset,
                encode_admission_event(d).decode(),
            )
            for offset, d in decisions
        ]
        self.db.insert("admission_decisions", rows, _DECISION_COLUMNS)

    def decision(self, job_id: str) -> AdmissionDecided | None:
        """The job's decision as the admission log holds it: its latest there (what the admission
        service answers while it keeps the job in memory), or None if it was never decided."""
        found = self.db.rows(
            "SELECT event FROM {db}.admission_decisions FINAL WHERE job_id = {j:String}"
            " ORDER BY log_offset DESC LIMIT 1",
            {"j": job_id},
        )
        return _decided(found[0][0]) if found else None

    def append_preemptions(self, preemptions: Sequence[JobPreempted]) -> None:
        rows = [(p.job_id, p.event_id, p.occurred_at, p.reason) for p in preemptions]
        self.db.insert("job_preemptions", rows, ("job_id", "event_id", "at", "reason"))

    def preemptions_of(self, project: str, start: int, end: int) -> list[tuple[str, str, str, int, str]]:
        """(job, user, cluster, at, reason) of the preemptions the project's jobs suffered in
        [start, end), oldest first; whose and where from the job's decisions, else from its
        charged usage (a job the scheduler ran without asking)."""
        window = "at >= {s:Int64} AND at < {e:Int64}"
        jobs = f"job_id IN (SELECT job_id FROM {{db}}.job_preemptions WHERE {window})"
        rows = self.db.rows(
            "SELECT p.job_id, j.user, j.cluster, p.at, p.reason FROM"
            f" (SELECT job_id, at, reason FROM {{db}}.job_preemptions FINAL WHERE {window}) AS p"
            " INNER JOIN (SELECT job_id, any(user) AS user, any(cluster) AS cluster FROM ("
            "  SELECT job_id, user, cluster FROM {db}.admission_decisions"
            f"  WHERE project = {{p:String}} AND {jobs}"
            "  UNION ALL SELECT job_id, user, cluster FROM {db}.ledger_postings"
            f"  WHERE project = {{p:String}} AND kind = 'usage' AND {jobs}"
            " ) GROUP BY job_id) AS j ON p.job_id = j.job_id"
            " ORDER BY p.at, p.job_id",
            {"p": project, "s": start, "e": end},
        )
        return [(str(j), str(u), str(c), int(a), str(r)) for j, u, c, a, r in rows]

    def decisions_of(self, project: str, since: int = 0, limit: int = 1000) -> list[AdmissionDecided]:
        """The project's decisions (every attempt) made at or after `since`, oldest first, at most
        `limit`. Reads every decision's row since then (the table is ordered by job)."""
        found = self.db.rows(
            "SELECT event FROM {db}.admission_decisions FINAL"
            " WHERE project = {p:String} AND occurred_at >= {s:Int64}"
            " ORDER BY occurred_at, job_id, attempt LIMIT {n:UInt64}",
            {"p": project, "s": since, "n": limit},
        )
        return [_decided(event) for (event,) in found]


def _decided(event: str | bytes) -> AdmissionDecided:
    decided = parse_admission_event(event.encode() if isinstance(event, str) else event)
    if not isinstance(decided, AdmissionDecided):  # the writer writes nothing else
        raise TypeError(f"admission_decisions holds a {decided.type} event")
    return decided
