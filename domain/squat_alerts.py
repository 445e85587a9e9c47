"""Squatting alerts: a running job idle past the grace period is told about once per idle stretch.

The burn alerter asks, each round, for the jobs squatting now (`SquatFound`: `find_squatting` on
the ledger's pieces, with who and where); a job whose latest stretch is ongoing and not yet
flagged gets a `SquattingFlagged`, naming its user and its project's leads, its GPUs, since when
it idles and what it has cost so far. The fold of the alerts log keeps which stretches were
flagged (job, stretch start) while they last, so a restarted alerter sends none again; a job that
works again and then idles again starts a new stretch, and is flagged again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from allmende.domain.admission import gpu_hours
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND
from allmende.domain.squatting import Squatting, UsagePiece
from allmende.schemas.alert_events import MAX_LISTED, SquattingFlagged

StretchKey = tuple[str, int]  # (job id, start of the idle stretch)


@dataclass(frozen=True, slots=True)
class SquatFound:
    """A job `find_squatting` flagged, with what a message to people needs."""

    project: str
    user: str
    cluster: str
    leads: tuple[str, ...]
    gpus: int  # in the stretch's latest piece
    squatting: Squatting


def _hours(gpu_seconds: int) -> str:
    return gpu_hours(gpu_seconds * CHARGE_UNITS_PER_GPU_SECOND)


def _utc(instant: int) -> str:
    return dt.datetime.fromtimestamp(instant, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def message(found: SquatFound) -> str:
    s = found.squatting
    leads = ", ".join(found.leads) or "none named"
    return (
        f"Job {s.job_id} of {found.user or 'an unknown user'} (project {found.project}, "
        f"{found.cluster or 'unknown cluster'}) has held {found.gpus} GPU{'s' if found.gpus != 1 else ''} "
        f"idle since {_utc(s.latest_since)}: {_hours(s.idle_gpu_seconds)} idle GPU-hours; the job has "
        f"used {_hours(s.gpu_seconds)} GPU-hours, charged {gpu_hours(s.charge_units)} weighted "
        f"GPU-hours so far. Leads: {leads}."
    )


def squat_alerts(
    found: Iterable[SquatFound], flagged: Collection[StretchKey], now: int, as_of: int
) -> list[SquattingFlagged]:
    """A `SquattingFlagged` per job whose latest idle stretch is ongoing and not yet flagged, by
    job id. `as_of` is the ledger's clock the figures are from."""
    events = []
    for f in sorted(found, key=lambda f: f.squatting.job_id):
        s = f.squatting
        if not s.ongoing or (s.job_id, s.latest_since) in flagged:
            continue
        events.append(
            SquattingFlagged(
                event_id=f"squat/{s.job_id}/{s.latest_since}",
                occurred_at=now,
                job_id=s.job_id,
                project=f.project,
                user=f.user,
                cluster=f.cluster,
                leads=sorted(f.leads)[:MAX_LISTED],
                gpus=f.gpus,
                idle_since=s.latest_since,
                as_of=as_of,
                idle_gpu_seconds=s.idle_gpu_seconds,
                gpu_seconds=s.gpu_seconds,
                charge_units=s.charge_units,
                message=message(f)[:2000],
            )
        )
    return events


def keep_ongoing(flagged: set[StretchKey], found: Iterable[SquatFound]) -> None:
    """Keep only the flagged stretches still ongoing in this round: one that ended (the job works
    again, or ended) never comes back (a new stretch starts later), so the set stays as small as
    the squatting of now, not of all history."""
    ongoing = {(f.squatting.job_id, f.squatting.latest_since) for f in found if f.squatting.ongoing}
    flagged.intersection_update(ongoing)


def latest_gpus(pieces: Sequence[UsagePiece]) -> int:
    """The GPUs of the latest piece (0 without any)."""
    return max(pieces, key=lambda p: (p.end, p.start)).gpus if pieces else 0
