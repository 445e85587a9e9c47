"""GPUs in use on a cluster over time: what the sum of runs asks of a cluster's capacity."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from allmende.schemas.admin_events import UsageDisputed
from allmende.schemas.alert_events import MAX_LISTED, CapacityExceeded


def peak_in_use(runs: Iterable[tuple[int, int, int]]) -> int:
    """The most GPUs in use at once by runs given as (start, end, gpus), end exclusive.

    A run ending at an instant frees its GPUs for one starting at that instant (ends sort first),
    as a scheduler hands them over.
    """
    changes: list[tuple[int, int]] = []
    for start, end, gpus in runs:
        if end > start and gpus > 0:
            changes.append((start, gpus))
            changes.append((end, -gpus))
    changes.sort()  # at one instant the negative change (an end) comes first
    peak = in_use = 0
    for _, delta in changes:
        in_use += delta
        peak = max(peak, in_use)
    return peak


@dataclass(frozen=True, slots=True)
class InUse:
    """GPUs in use on a cluster from `start` until `end` (the next change), above its capacity."""

    cluster: str
    start: int
    end: int
    gpus: int


@dataclass(frozen=True, slots=True)
class Episode:
    """A stretch in which a cluster ran more GPUs than it has: impossible, so some usage in it was
    reported wrongly (twice, or by a broken producer)."""

    cluster: str
    capacity: int
    start: int
    end: int
    peak: int
    # It began at or before the look-back's start: `start` is only where the look-back cut it.
    clipped: bool = False

    @property
    def excess(self) -> int:
        return self.peak - self.capacity


@dataclass(frozen=True, slots=True)
class RunOnCluster:
    """A job's run as the ledger holds it, during an episode."""

    job_id: str
    project: str
    started_at: int  # its first piece in the ledger
    gpus: int  # the most it used during the episode


# An episode with the runs on its cluster during it: what the sweep finds, what alerts and
# disputes are made of.
Found = tuple[Episode, Sequence[RunOnCluster]]


def episodes(rows: Iterable[InUse], capacity: Mapping[str, int]) -> list[Episode]:
    """Consecutive over-capacity stretches of each cluster joined into episodes (rows sorted by
    cluster and start; a gap between two rows ends an episode)."""
    found: list[Episode] = []
    for row in rows:
        last = found[-1] if found else None
        if last is not None and last.cluster == row.cluster and last.end == row.start:
            found[-1] = Episode(row.cluster, last.capacity, last.start, row.end, max(last.peak, row.gpus))
        else:
            found.append(Episode(row.cluster, capacity[row.cluster], row.start, row.end, row.gpus))
    return found


def accounted_for(episode: Episode, runs: Iterable[RunOnCluster]) -> bool:
    """Whether the runs hold the episode's peak: the most GPUs each used in it add up to at least
    the peak (else the ledger changed between reading the sweep and reading the runs)."""
    return sum(r.gpus for r in runs) >= episode.peak


def pushed_over(episode: Episode, runs: Iterable[RunOnCluster]) -> list[RunOnCluster]:
    """The runs that pushed the cluster over: the last to start (ties: the larger job id), taken
    until their GPUs cover the excess. The runs that were there first are taken for real; which
    report is wrong cannot be known from the ledger, so the latest are the ones to look at."""
    taken: list[RunOnCluster] = []
    covered = 0
    for run in sorted(runs, key=lambda r: (r.started_at, r.job_id), reverse=True):
        if covered >= episode.excess:
            break
        taken.append(run)
        covered += run.gpus
    return taken


def capacity_alerts(
    found: Sequence[Found], raised: AbstractSet[tuple[str, int]], now: int
) -> list[CapacityExceeded]:
    """One alert per episode not raised before (its cluster and start), naming the runs that
    pushed the cluster over. An episode the look-back cut is not raised again for a cluster that
    has had an alert: its start moves with the look-back, so it would look new every round."""
    alerts: list[CapacityExceeded] = []
    alerted = {cluster for cluster, _ in raised}
    for episode, runs in found:
        if (episode.cluster, episode.start) in raised:
            continue
        if episode.clipped and episode.cluster in alerted:
            continue  # most likely one raised when it began, seen through a look-back that moved on
        pushers = pushed_over(episode, runs)[:MAX_LISTED]
        projects = sorted({r.project for r in pushers if r.project})[:MAX_LISTED]
        alerts.append(
            CapacityExceeded(
                event_id=f"capacity:{episode.cluster}/{episode.start}:raised",
                occurred_at=now,
                cluster=episode.cluster,
                capacity_gpus=episode.capacity,
                peak_gpus=episode.peak,
                start=episode.start,
                end=episode.end,
                jobs=[r.job_id for r in pushers],
                projects=projects,
                message=capacity_message(episode, pushers),
            )
        )
    return alerts


def capacity_message(episode: Episode, pushers: Sequence[RunOnCluster]) -> str:
    start = dt.datetime.fromtimestamp(episode.start, dt.UTC).strftime("%Y-%m-%d %H:%M")
    minutes = max(1, (episode.end - episode.start) // 60)
    named = ", ".join(f"{r.job_id} ({r.project or 'no project'}, {r.gpus} GPUs)" for r in pushers[:5])
    more = f" and {len(pushers) - 5} more" if len(pushers) > 5 else ""
    return (
        f"Cluster {episode.cluster} ran {episode.peak} GPUs of its {episode.capacity} from {start} UTC "
        f"for {minutes} min: some usage was reported wrongly. Latest to start: {named}{more}."
    )[:2000]


def usage_disputes(found: Sequence[Found], disputed: Collection[str], now: int) -> list[UsageDisputed]:
    """Admin events that hold as disputed the usage of each run that pushed a cluster over and
    is not disputed yet (nor was: a resolved dispute is an admin's decision, not raised again)."""
    events: dict[str, UsageDisputed] = {}
    for episode, runs in found:
        for run in pushed_over(episode, runs):
            if not run.project or run.job_id in disputed or run.job_id in events:
                continue
            events[run.job_id] = UsageDisputed(
                event_id=f"dispute:{run.job_id}:raised",
                occurred_at=now,
                actor="capacity-watch",
                source="alerter",
                reason=capacity_message(episode, [run]),
                job_id=run.job_id,
                project=run.project,
                cluster=episode.cluster,
                episode_start=episode.start,
                episode_end=episode.end,
                peak_gpus=episode.peak,
                capacity_gpus=episode.capacity,
            )
    return list(events.values())
