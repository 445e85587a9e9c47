"""What the dashboard routes answer: the domain's burn-rate and squatting rules over the ledger's
projections, the admin state (allocations, agreements, clusters) and the admission state.

Blocking (ClickHouse): run these in a thread, never on the event loop.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

from fastapi import HTTPException

from allmende.core.ledger_store import DayUsage
from allmende.domain.admin_state import AdminState, agreement_of
from allmende.domain.admission_model import RunningJob
from allmende.domain.balances import ProjectBalance
from allmende.domain.burn_alerts import ProjectBurn
from allmende.domain.burn_rate import SECONDS_PER_DAY, BurnRate, DayCharge, Forecast, burn_rate
from allmende.domain.capacity import Found
from allmende.domain.squat_alerts import SquatFound, latest_gpus
from allmende.domain.squatting import SquatRule, Squatting, find_squatting
from allmende.domain.timeslices import occurrences
from allmende.services.admin_service import AdminService
from allmende.services.api import dashboard_models as m
from allmende.services.api.access import readable_projects
from allmende.services.api.auth import Principal
from allmende.services.api.dashboard_models import gpu_hours, idle_hours, instant, percent, units_to_hours
from allmende.services.capacity_queries import CapacityQueries
from allmende.services.dashboard_queries import DashboardQueries, JobPieces

if TYPE_CHECKING:
    from allmende.services.admission_service import AdmissionService
    from allmende.streams.fairshare_calculator import FairShareCalculator

MAX_WINDOWS = 2_000  # time-slice windows listed per page: a bound on every query


# A squatting job is news to its people while its idle stretch reaches this close to the ledger's
# clock (samples come every few minutes to half an hour).
SQUAT_NEWS_S = 3600


@dataclass(frozen=True, slots=True)
class Period:
    name: str
    start: int
    end: int
    as_of: int

    @property
    def first_day(self) -> dt.date:
        return _day(self.start)

    @property
    def last_day(self) -> dt.date:
        """The last UTC day with usage up to as_of (the day before as_of when it is a midnight)."""
        return _day(max(self.start, self.as_of - 1))

    def meta(self) -> dict[str, str]:
        return {
            "period": self.name,
            "period_start": instant(self.start) or "",
            "period_end": instant(self.end) or "",
            "as_of": instant(self.as_of) or "",
        }


def _day(at: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=at // SECONDS_PER_DAY)


def periods_of(state: AdminState) -> dict[str, tuple[int, int]]:
    """Every period with allocations, by name: its span (the widest any allocation gives it)."""
    found: dict[str, tuple[int, int]] = {}
    for a in state.allocations.values():
        start, end = found.get(a.period, (a.start, a.end))
        found[a.period] = (min(start, a.start), max(end, a.end))
    return dict(sorted(found.items(), key=lambda kv: (kv[1], kv[0])))


class DashboardViews:
    def __init__(
        self,
        admin: AdminService,
        queries: DashboardQueries,
        squat_rule: SquatRule,
        admission: AdmissionService | None = None,
        fairshare: FairShareCalculator | None = None,
        overrun_grace_s: int = 900,
        capacity_lookback_s: int = 7 * 86_400,
    ) -> None:
        self.admin = admin
        self.overrun_grace_s = overrun_grace_s
        self.capacity = CapacityQueries(queries.db)
        self.capacity_lookback_s = capacity_lookback_s
        self.queries = queries
        self.squat_rule = squat_rule
        self.admission = admission
        self.fairshare = fairshare
        # (project, period start, period end) -> (the store's idle version, the squatting rows)
        self._squatting: dict[tuple[str, int, int], tuple[int, list[tuple[JobPieces, Squatting]]]] = {}

    def state(self) -> AdminState:
        """The admin state as last caught up: the pages read it without a round trip to Kafka per
        request. Commands through this API show at once; the follower (`follow_admin_log`) brings
        in what others published within ADMIN_FOLLOW_S."""
        return self.admin.log.state

    # -- time ---------------------------------------------------------------------------------
    def ledger_clock(self) -> int:
        """The latest instant charged; the wall clock when the ledger is empty. In live operation
        it trails now by the pipeline's lag; for a replayed trace it is the trace's "now"."""
        clock = self.admin.store.charge_horizon()
        return min(clock, self.admin.now()) if clock > 0 else self.admin.now()

    def over_capacity(self) -> list[Found]:
        """Clusters run above their declared capacity in the look-back before the ledger's clock."""
        capacity = {name: c.gpus for name, c in self.state().clusters.items()}
        return self.capacity.found(capacity, self.ledger_clock() - self.capacity_lookback_s)

    def period(self, state: AdminState, name: str | None, as_of: int | None) -> Period:
        known = periods_of(state)
        if not known:
            raise HTTPException(404, "no period has allocations yet: apply a plan first")
        clock = self.ledger_clock() if as_of is None else as_of
        if name is None:
            name = next((n for n, (s, e) in known.items() if s <= clock < e), next(reversed(known)))
        if name not in known:
            raise HTTPException(404, f"no allocations for period {name!r}; known: {', '.join(known)}")
        start, end = known[name]
        return Period(name, start, end, min(max(clock, start), end))

    # -- one project --------------------------------------------------------------------------
    def project_burns_of(
        self,
        state: AdminState,
        projects: Sequence[str],
        period: Period,
        as_of_given: bool,
        days: Sequence[DayUsage] | None = None,
    ) -> dict[str, tuple[BurnRate, ProjectBalance]]:
        """Each project's burn rate and balance, from one read of the daily projection (`days`,
        when the caller has it: every day of these projects)."""
        usage = self.admin.store.daily_usage(projects) if days is None else days
        balances = self.admin.balances(projects, period.as_of if as_of_given else None, state, days=usage)
        daily: dict[str, dict[dt.date, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for d in usage:
            if period.first_day <= d.day <= period.last_day:
                daily[d.project][d.day][0] += d.charge_units
                daily[d.project][d.day][1] += d.gpu_seconds
        found = {}
        for project in projects:
            lines = [b for b in balances[project].allocations if b.allocation.period == period.name]
            burn = burn_rate(
                allocated_units=sum(b.allocated_units for b in lines),
                held_units=sum(b.held_units for b in lines),
                period_start=period.start,
                period_end=period.end,
                as_of=period.as_of,
                daily=[DayCharge(day, u, s) for day, (u, s) in sorted(daily[project].items()) if u or s],
            )
            found[project] = (burn, balances[project])
        return found

    def burn(self, state: AdminState, project: str, period: Period, as_of_given: bool) -> m.BurnOut:
        # The same balance as `allmende budget balance`: the page's numbers are the balance's.
        return _burn_out(
            project, period, *self.project_burns_of(state, [project], period, as_of_given)[project]
        )

    def breakdown(self, project: str, period: Period, by: str) -> m.BreakdownOut:
        totals = self.queries.totals_by(project, by, period.first_day, period.last_day)
        return m.BreakdownOut(
            **period.meta(),
            project=project,
            by=by,
            rows=[
                m.BreakdownRow(
                    key=t.key,
                    gpu_hours=gpu_hours(t.gpu_seconds),
                    charged_gpu_hours=units_to_hours(t.charge_units),
                    idle_gpu_hours=idle_hours(t.idle_units),
                )
                for t in totals
            ],
        )

    def running(self, project: str) -> m.RunningOut:
        jobs = self.admission.running_jobs(project) if self.admission is not None else []
        now = self.admission.now() if self.admission is not None else 0
        return m.RunningOut(
            project=project,
            rows=[_running_row(cluster, j, j.overrun_s(now, self.overrun_grace_s)) for cluster, j in jobs],
        )

    def holds(self, project: str) -> m.HoldsOut:
        holds = self.admission.job_holds(project) if self.admission is not None else []
        return m.HoldsOut(
            project=project,
            rows=[
                m.HoldRow(
                    job_id=job_id, held_charged_gpu_hours=units_to_hours(units), expires_at=instant(expires)
                )
                for job_id, units, expires in holds
            ],
        )

    def preemptions(self, project: str, period: Period) -> m.PreemptionsOut:
        """From the store (every preemption, also of jobs admission let go of), with the admission
        state's for those the store has not taken yet."""
        end = period.as_of + 1
        found = {(job, at, reason): (user, cluster) for job, user, cluster, at, reason
                 in self.admin.store.preemptions_of(project, period.start, end)}  # fmt: skip
        live = self.admission.preemptions(project) if self.admission is not None else []
        for job, at, reason in live:
            if period.start <= at < end:
                found.setdefault((job.job_id, at, reason), (job.user, job.cluster))
        return m.PreemptionsOut(
            **period.meta(),
            project=project,
            rows=[
                m.PreemptionRow(job_id=job, user=user, cluster=cluster, at=instant(at), reason=reason)
                for (job, at, reason), (user, cluster) in sorted(
                    found.items(), key=lambda f: (f[0][1], f[0][0])
                )
            ],
        )

    def timeslices(self, state: AdminState, project: str, period: Period) -> m.TimeSlicesOut:
        rows: list[m.TimeSliceRow] = []
        agreements = [
            agreement_of(a)
            for key, a in sorted(state.agreements.items())
            if a.project == project and key not in state.revoked
        ]
        end = min(max(period.as_of, period.start + 1), period.end)
        charged_to = self.admin.store.charge_horizon()
        for agreement in agreements:
            # Each window clipped to the period and to as_of: a window under way shows its part so far.
            windows = [
                (max(s, period.start), min(e, end))
                for s, e in occurrences(agreement.window, period.start, end)
                if max(s, period.start) < min(e, end)
            ][:MAX_WINDOWS]
            used = self.queries.window_gpu_seconds(project, agreement.cluster, windows, charged_to)
            for (start, stop), secs in zip(windows, used, strict=True):
                guaranteed = agreement.gpus * (stop - start)
                # The guarantee is GPUs at each instant; GPU-seconds beyond it were not the agreement's.
                counted = min(secs, guaranteed)
                rows.append(
                    m.TimeSliceRow(
                        agreement_id=agreement.agreement_id,
                        cluster=agreement.cluster,
                        gpus=agreement.gpus,
                        window_start=instant(start),
                        window_end=instant(stop),
                        guaranteed_gpu_hours=gpu_hours(guaranteed),
                        used_gpu_hours=gpu_hours(counted),
                        used_percent=percent(_share(counted, guaranteed)),
                    )
                )
        return m.TimeSlicesOut(**period.meta(), project=project, rows=rows)

    def squatting(self, project: str, period: Period) -> m.SquattingOut:
        rule = self.squat_rule
        rows = self._squatting_rows(project, period)
        return m.SquattingOut(
            **period.meta(),
            project=project,
            max_utilization_percent=Decimal(rule.max_utilization_bp) / 100,
            grace_minutes=(Decimal(rule.grace_s) / 60).quantize(Decimal("0.01")),
            rows=rows,
        )

    def _squatting_of(self, project: str, period: Period) -> list[tuple[JobPieces, Squatting]]:
        """The project's jobs `find_squatting` flags, with their pieces. They depend on the
        project's idle jobs alone: kept until a posting reaches one of them (the store's idle
        version; with other writers, no version and no keeping), for the page and the alerter."""
        version = self.admin.store.idle_version(project)
        key = (project, period.start, period.end)
        kept = self._squatting.get(key)
        if version is not None and kept is not None and kept[0] == version:
            return kept[1]
        rule = self.squat_rule
        found = []
        for job in self.queries.low_utilization_jobs(
            project, rule.max_utilization_bp, period.start, period.end
        ):
            squat = find_squatting(job.job_id, job.pieces, rule, job.totals)
            if squat is not None:
                found.append((job, squat))
        if version is not None:
            self._squatting[key] = (version, found)
        return found

    def _squatting_rows(self, project: str, period: Period) -> list[m.SquattingRow]:
        rows = []
        for job, found in self._squatting_of(project, period):
            rows.append(
                m.SquattingRow(
                    job_id=job.job_id,
                    user=job.user,
                    cluster=job.cluster,
                    idle_since=instant(found.idle_since),
                    idle_until=instant(found.idle_until),
                    idle_hours=gpu_hours(found.idle_seconds),
                    idle_gpu_hours=gpu_hours(found.idle_gpu_seconds),
                    idle_charged_gpu_hours=units_to_hours(found.idle_charge_units),
                    gpu_hours=gpu_hours(found.gpu_seconds),
                    charged_gpu_hours=units_to_hours(found.charge_units),
                    ongoing=found.ongoing,
                )
            )
        rows.sort(key=lambda r: (-r.charged_gpu_hours, r.job_id))
        return rows

    # -- every project ------------------------------------------------------------------------
    def overview(
        self, state: AdminState, caller: Principal, period: Period, as_of_given: bool
    ) -> m.OverviewOut:
        days = self.admin.store.daily_usage()  # every project's, in one read
        idle = _idle_in(days, period)
        projects = readable_projects(state, caller, idle if caller.role == "admin" else ())
        burns = self.project_burns_of(state, projects, period, as_of_given, days)
        rows = []
        for project in projects:
            out = _burn_out(project, period, *burns[project])
            trailing = out.forecasts[1]
            rows.append(
                m.OverviewRow(
                    project=project,
                    allocated_gpu_hours=out.allocated_gpu_hours,
                    charged_gpu_hours=out.charged_gpu_hours,
                    held_gpu_hours=out.held_gpu_hours,
                    remaining_gpu_hours=out.remaining_gpu_hours,
                    elapsed_percent=out.elapsed_percent,
                    spent_percent=out.spent_percent,
                    exhaustion_at=trailing.exhaustion_at,
                    days_left=trailing.days_left,
                    lasts_period=trailing.lasts_period,
                    over_budget_gpu_hours=out.over_budget_gpu_hours,
                    idle_gpu_hours=idle_hours(idle.get(project, 0)),
                )
            )
        elapsed = percent(_share(period.as_of - period.start, period.end - period.start)) or Decimal(0)
        unaccounted: dict[str, int] | None = None
        if caller.role == "admin":
            unaccounted = self.admin.store.unaccounted_gpu_seconds(period.start, period.end)
        return m.OverviewOut(
            **period.meta(), elapsed_percent=elapsed, rows=rows,
            unaccounted_gpu_hours=None if unaccounted is None else gpu_hours(sum(unaccounted.values())),
            unaccounted_nodes=None if unaccounted is None else sum(1 for s in unaccounted.values() if s),
        )  # fmt: skip

    def project_burns(self) -> list[ProjectBurn]:
        """Every project with an allocation in the current period, as the burn alerter and the
        project gauges judge it: the same figures as the project page (blocking: ClickHouse)."""
        state = self.state()
        if not periods_of(state):
            return []
        period = self.period(state, None, None)
        days = self.admin.store.daily_usage()
        idle = _idle_in(days, period)
        projects = sorted({a.project for a in state.allocations.values() if a.period == period.name})
        burns = self.project_burns_of(state, projects, period, False, days)
        ends: dict[str, int] = {}
        for a in state.allocations.values():
            if a.period == period.name:
                ends[a.project] = max(ends.get(a.project, a.end), a.end)
        return [
            ProjectBurn(
                p, period.name, burns[p][0], idle.get(p, 0), tuple(sorted(state.leads_of(p))), ends.get(p)
            )
            for p in projects
        ]

    def squatting_now(self) -> tuple[list[SquatFound], int]:
        """Every project's jobs squatting now (their latest idle stretch ongoing), with their
        users and leads, and the ledger's clock they are judged at: what the burn alerter tells
        people about (blocking: ClickHouse)."""
        state, clock = self.state(), self.ledger_clock()
        if not periods_of(state):
            return [], clock
        period = self.period(state, None, None)
        found = []
        for project in state.projects():
            # Idle to its latest piece, and that piece recent: a job idle until it ended long
            # ago is on the page, not news.
            news = [
                (job, squat)
                for job, squat in self._squatting_of(project, period)
                if squat.ongoing and clock - squat.idle_until <= SQUAT_NEWS_S
            ]
            if news:
                leads = tuple(sorted(state.leads_of(project)))
                found += [
                    SquatFound(project, job.user, job.cluster, leads, latest_gpus(job.pieces), squat)
                    for job, squat in news
                ]
        return found, clock

    def cluster_utilization(self, state: AdminState, period: Period) -> m.ClusterUtilizationOut:
        clusters = {c.cluster: c.gpus for c in state.clusters.values()}
        used = {
            (c, d): s
            for c, d, s in self.queries.cluster_days(sorted(clusters), period.first_day, period.last_day)
        }
        rows = []
        for cluster, gpus in sorted(clusters.items()):
            day = period.first_day
            while day <= period.last_day:
                # A day that as_of cuts offers only the part before as_of.
                lo = max(period.start, _midnight(day))
                hi = min(
                    period.as_of if period.as_of > period.start else period.end,
                    _midnight(day) + SECONDS_PER_DAY,
                )
                capacity = gpus * max(0, hi - lo)
                secs = used.get((cluster, day), 0)
                rows.append(
                    m.ClusterDayRow(
                        cluster=cluster,
                        day=day,
                        gpus=gpus,
                        used_gpu_hours=gpu_hours(secs),
                        capacity_gpu_hours=gpu_hours(capacity),
                        utilization_percent=percent(_share(secs, capacity)) or Decimal(0),
                    )
                )
                day += dt.timedelta(days=1)
        return m.ClusterUtilizationOut(**period.meta(), rows=rows)


def _running_row(cluster: str, j: RunningJob, overrun_s: int | None) -> m.RunningRow:
    return m.RunningRow(
        job_id=j.job_id,
        user=j.user,
        cluster=cluster,
        gpus=j.gpus,
        priority_class=j.priority_class,
        lane=j.lane.value if j.lane is not None else None,
        since=instant(j.since) if j.since else None,
        hosts=" ".join(j.hosts),
        requested_s=j.requested_seconds or None,
        overrun_s=overrun_s,
        overran=overrun_s is not None,
    )


def _idle_in(days: Sequence[DayUsage], period: Period) -> dict[str, int]:
    """Idle units per project with usage in the period's days."""
    idle: dict[str, int] = defaultdict(int)
    for d in days:
        if period.first_day <= d.day <= period.last_day and (d.gpu_seconds or d.charge_units):
            idle[d.project] += d.idle_units
    return dict(idle)


def _burn_out(project: str, period: Period, burn: BurnRate, balance: ProjectBalance) -> m.BurnOut:
    lines = [b for b in balance.allocations if b.allocation.period == period.name]
    in_budget = sum(b.charged_units for b in lines)
    return m.BurnOut(
        **period.meta(),
        project=project,
        allocated_gpu_hours=units_to_hours(burn.allocated_units),
        charged_gpu_hours=units_to_hours(burn.charged_units),
        held_gpu_hours=units_to_hours(burn.held_units),
        remaining_gpu_hours=units_to_hours(sum(b.remaining_units for b in lines)),
        over_budget_gpu_hours=units_to_hours(max(0, burn.charged_units - in_budget)),
        elapsed_percent=percent(burn.elapsed_share) or Decimal(0),
        spent_percent=percent(burn.spent_share),
        forecasts=[_forecast(burn.period_to_date), _forecast(burn.trailing_7d)],
        rows=[
            m.BurnDayRow(
                day=d.day,
                gpu_hours=gpu_hours(d.gpu_seconds),
                charged_gpu_hours=units_to_hours(d.charge_units),
                cumulative_charged_gpu_hours=units_to_hours(d.cumulative_units),
                even_burn_gpu_hours=units_to_hours(d.even_burn_units),
            )
            for d in burn.days
        ],
    )


def _midnight(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days * SECONDS_PER_DAY


def _share(part: int, whole: int) -> Fraction | None:
    return Fraction(part, whole) if whole > 0 else None


def _forecast(f: Forecast) -> m.ForecastOut:
    return m.ForecastOut(
        basis=f.basis,
        charged_gpu_hours_per_day=units_to_hours(f.units_per_day),
        exhaustion_at=instant(f.exhaustion_at),
        days_left=f.days_left,
        lasts_period=f.lasts_period,
        projected_charged_gpu_hours_at_end=units_to_hours(f.projected_units_at_end),
    )
