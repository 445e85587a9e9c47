"""Fair-share usage from the ledger stream: charged GPU-seconds per project, decayed, exactly.

The ledger-entry stream carries revisions: the largest revision of an entry is its truth
(`schemas.ledger`). `UsageLedger` keeps, per entry, the largest revision seen and what it charged
per hour; per project it keeps integer charge units per hour. Applying a revision replaces the
entry's old hours by its new ones, so duplicates, reordering and replays converge to the same
integers: the state is a function of the set of latest revisions, not of their order.

Decay is computed from those integers at read time, in one canonical order (projects, then
hours, sorted), so the decayed usage is a pure function of (the hour totals, the instant, the
half-life, the resets): identical bit for bit after a rebuild by replay.

The instant the usage is decayed to is the stream's own clock (the latest end of use seen), not the
wall clock: a replay of last year's trace decays as it did then, and a rebuild gives the same
numbers whenever it runs.

Memory stays bounded by what is live (`UsageLedger.fold`): per project, the hours past the fold
horizon (FOLD_HALF_LIVES half-lives old) are summed into one integer figure, and the hours before
the last reset into another. Both stay exact integers, so a late revision of a folded hour is
subtracted and added there; and `decayed_usage` lumps every hour past the horizon into one figure
itself, so folding or not (or folding at other moments, as a replay does) gives the same bits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND, PolicyTimeline
from allmende.domain.fairshare.decay import decay_factor
from allmende.domain.fairshare.tree import ROOT, ShareNode, ShareTree
from allmende.domain.organisation import Node
from allmende.domain.postings import priced_pieces
from allmende.schemas.ledger import UNATTRIBUTED, LedgerEntry

BUCKET_S = 3600  # usage is counted per hour: fine beside a half-life of days, small to keep
JOURNAL_MAX = 100_000  # slot changes kept per followed project between two reads
# Use older than this many half-lives weighs less than 2^-40 (about 1e-12) of itself: far below
# what a factor resolves, so it is summed into one figure per project (`UsageLedger.fold`). With
# the default half-life of 7 days the horizon is 280 days: at most 6,721 live hours per project.
FOLD_HALF_LIVES = 40


_GENERATIONS = itertools.count(1)

K = TypeVar("K", str, int)
Slot = tuple[int, str, str]  # (hour index, cluster, GPU type): what a budget's scope can tell apart


@dataclass(slots=True)
class _Held:
    entry: LedgerEntry  # kept to price it again when a policy arrives late
    hours: dict[Slot, int]  # charge units


@dataclass
class UsageLedger:
    """Latest revision per entry; charge units per project and (hour, cluster, GPU type), and per
    job (all integers). Fair share reads the hours; admission reads budgets and holds from it."""

    entries: dict[str, _Held] = field(default_factory=dict)
    hours: dict[str, dict[Slot, int]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # job id -> charge units so far
    _of_job: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)  # its entry ids
    generation: int = field(default_factory=lambda: next(_GENERATIONS))  # a rebuilt ledger is another
    clock: int = 0  # the latest end of use seen: the stream's "now"
    # Per followed project, the slot changes since its reader last took them (`follow`, `changes`):
    # a reader that keeps sums (admission's budgets) adds these instead of walking every hour.
    _journals: dict[str, list[tuple[Slot, int]]] = field(default_factory=dict, repr=False, compare=False)
    # Charge units per project and hour whatever the cluster, kept with `hours`: what fair share
    # decays (`project_hours`), without regrouping every slot at each recompute.
    _per_hour: dict[str, dict[int, int]] = field(default_factory=dict, repr=False, compare=False)
    # What `fold` took out of `_per_hour`, per project (charge units, exact): the hours up to
    # `_drop_through` (they end at or before a reset: fair share ignores them) in `_dropped`, the
    # later ones up to `_fold_through` (past the horizon) in `_folded`. One bound for every project:
    # both follow from the clock alone. A revision of a folded hour is routed to its figure (`_add`).
    _dropped: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _folded: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _drop_through: int | None = field(default=None, repr=False, compare=False)
    _fold_through: int | None = field(default=None, repr=False, compare=False)

    def follow(self, project: str) -> None:
        """Keep the project's slot changes from now on, for `changes`."""
        self._journals[project] = []

    def changes(self, project: str) -> list[tuple[Slot, int]] | None:
        """The project's slot changes (slot, signed units) since `follow` or the last call; None
        when they were not kept (never followed, or more than JOURNAL_MAX: count them again)."""
        journal = self._journals.get(project)
        if journal is not None:
            self._journals[project] = []
        return journal

    def apply(self, entry: LedgerEntry, timeline: PolicyTimeline) -> bool:
        """Take one entry revision; False when an equal or later one was already taken."""
        held = self.entries.get(entry.entry_id)
        if held is not None and held.entry.revision_key() >= entry.revision_key():
            return False
        self._replace(held, entry, timeline)
        self.clock = max(self.clock, entry.interval_end)
        return True

    def reprice(self, timeline: PolicyTimeline, since: int) -> int:
        """Price again every entry with use from `since` on (a policy the stream saw late); returns
        how many. The ledger never charged that use under another policy (policies start after the
        charge horizon), so this only catches up with what the ledger writer priced."""
        later = [h for h in self.entries.values() if h.entry.interval_end > since]
        for held in later:
            self._replace(held, held.entry, timeline)
        return len(later)

    def _replace(self, held: _Held | None, entry: LedgerEntry, timeline: PolicyTimeline) -> None:
        if held is not None:
            self._add(held.entry.project, held.entry.job_id, held.hours, -1)
        hours: dict[Slot, int] = {}
        if entry.project != UNATTRIBUTED and entry.gpus:
            for hour, span in priced_pieces(entry, timeline, BUCKET_S):
                slot = (hour, entry.cluster, entry.gpu_type)
                hours[slot] = hours.get(slot, 0) + span.charge_units
        if held is None:
            self._of_job.setdefault(entry.job_id, []).append(entry.entry_id)
        self.entries[entry.entry_id] = _Held(entry, hours)
        self._add(entry.project, entry.job_id, hours, 1)

    def holds_job(self, job_id: str) -> bool:
        return job_id in self._of_job

    def retire(self, job_id: str) -> int:
        """Let go of what is kept per entry of a job the meter let go of (its entries are final:
        no revision follows its `retired` record); its units stay in the totals. Returns how
        many entries went."""
        gone = self._of_job.pop(job_id, [])
        for entry_id in gone:
            self.entries.pop(entry_id, None)
        self.jobs.pop(job_id, None)
        return len(gone)

    def _add(self, project: str, job_id: str, hours: Mapping[Slot, int], sign: int) -> None:
        if not hours:
            return
        job_total = self.jobs.get(job_id, 0) + sign * sum(hours.values())
        if job_total:
            self.jobs[job_id] = job_total
        else:
            self.jobs.pop(job_id, None)
        journal = self._journals.get(project)
        if journal is not None:
            if len(journal) >= JOURNAL_MAX:
                del self._journals[project]  # nobody took them for long: the reader counts again
            else:
                journal.extend((slot, sign * units) for slot, units in hours.items())
        totals = self.hours.setdefault(project, {})
        per_hour = self._per_hour.setdefault(project, {})
        fold_through = self._fold_through
        for slot, units in hours.items():
            left = totals.get(slot, 0) + sign * units
            if left:
                totals[slot] = left
            else:
                totals.pop(slot, None)
            hour = slot[0]
            if fold_through is not None and hour <= fold_through:
                # Folded already (a late revision): its figure takes the change, same sign.
                drop = self._drop_through
                figure = self._dropped if drop is not None and hour <= drop else self._folded
                _bump(figure, project, sign * units)
                continue
            _bump(per_hour, hour, sign * units)
        if not totals:
            del self.hours[project]
        if not per_hour:
            del self._per_hour[project]

    def charge_units(self, project: str) -> int:
        return sum(self.hours.get(project, {}).values())

    def project_hours(self) -> dict[str, dict[int, int]]:
        """Charge units per project and hour, whatever the cluster: what fair share decays.

        Folded hours (`fold`) appear as their figures: the units of the hours before the last
        reset at the hour `_drop_through` (which `decayed_usage` drops), the units past the horizon
        at the hour `_fold_through` (which `decayed_usage` lumps with every hour past the horizon).
        Each project's figures and hours still sum exactly to its charge units.
        """
        found = {project: dict(per_hour) for project, per_hour in self._per_hour.items()}
        for bound, figures in ((self._drop_through, self._dropped), (self._fold_through, self._folded)):
            for project, units in figures.items():
                if bound is not None:  # never None when there are figures; for the type checker
                    found.setdefault(project, {})[bound] = units  # no live hour is <= a bound
        return found

    def fold(self, half_life_s: int, resets: Iterable[int] = (), half_lives: int = FOLD_HALF_LIVES) -> int:
        """Move the hours fair share no longer tells apart out of `_per_hour`; returns how many.

        At the ledger's clock, an hour is past the horizon once it ended `half_lives` half-lives
        ago (`fold_horizon`; none for half-life 0, where nothing decays), and dropped once it ends
        at or before the last reset mark (`reset_hour`). Both bounds only move forward with the
        clock, so folding depends on the clock alone, not on when it is called. Give it the
        half-life and reset marks `decayed_usage` is given, including the last mark up to the
        clock (the quarterly marks `FairShareCalculator.compute` passes are exactly that).

        Cost: nothing unless a bound moved a whole hour; then, per project with live hours, the
        hours the bound passed (dict look-ups) or its live hours if fewer (after a jump of the
        clock): about one hour per project per hour of clock, far below a `decayed_usage`, which
        reads every live hour. No second index of hours to keep in step on the hot path (`_add`).
        """
        horizon = fold_horizon(self.clock, half_life_s, half_lives)
        reset = reset_hour(self.clock, resets)
        old_fold, old_drop = self._fold_through, self._drop_through
        drop = _newest(old_drop, reset)
        if drop is not None and old_fold is not None and old_drop != drop:
            if drop >= old_fold:  # the reset passed every folded hour: their figure is dropped
                for project, units in self._folded.items():
                    _bump(self._dropped, project, units)
                self._folded.clear()
            else:
                # A reset mark inside the folded hours (only when a mark up to an earlier fold's
                # clock was not given to it): that figure cannot be split, so it stays folded and
                # counted (`decayed_usage` says by how little); the next reset past it drops it.
                drop = old_drop
        target = _newest(_newest(old_fold, horizon), drop)
        if target is None or (target == old_fold and drop == old_drop):
            return 0
        self._fold_through, self._drop_through = target, drop
        moved = 0
        for project in list(self._per_hour):
            per_hour = self._per_hour[project]
            if old_fold is not None and target - old_fold <= len(per_hour):
                passed = [h for h in range(old_fold + 1, target + 1) if h in per_hour]
            else:  # first fold, or the clock jumped: fewer live hours than hours passed
                passed = [h for h in per_hour if h <= target]
            for hour in passed:
                dropped = drop is not None and hour <= drop
                _bump(self._dropped if dropped else self._folded, project, per_hour.pop(hour))
            moved += len(passed)
            if not per_hour:
                del self._per_hour[project]
        return moved

    # -- checkpoints (services/checkpoints.py): what cannot be derived, in one canonical order -----
    def dump(self) -> dict[str, Any]:
        """The state as plain JSON-able data: every latest revision with the hours it priced (kept,
        not priced again, so a restored ledger is the one taken), the hour totals (which keep a
        retired job's units), the clock and the fold bounds. Everything else is derived by
        `restore`. Sorted, so the same state gives the same data."""
        return {
            "entries": [
                [_entry_dict(self.entries[e].entry), _slots(self.entries[e].hours)]
                for e in sorted(self.entries)
            ],
            "hours": {project: _slots(self.hours[project]) for project in sorted(self.hours)},
            "clock": self.clock,
            "fold_through": self._fold_through,
            "drop_through": self._drop_through,
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> UsageLedger:
        """The ledger `dump` was taken of (a new generation: caches keyed on the old one are stale).
        ValueError when the data cannot be what `dump` gave."""
        ledger = cls()
        fold, drop = data["fold_through"], data["drop_through"]
        for value in (data["clock"], fold, drop):
            if value is not None and type(value) is not int:
                raise ValueError("a checkpoint's clock and bounds are integers")
        ledger.clock, ledger._fold_through, ledger._drop_through = data["clock"], fold, drop
        for raw, slots in data["entries"]:
            entry = LedgerEntry.from_dict(raw)
            hours = _unslots(slots)
            ledger.entries[entry.entry_id] = _Held(entry, hours)
            ledger._of_job.setdefault(entry.job_id, []).append(entry.entry_id)
            units = ledger.jobs.get(entry.job_id, 0) + sum(hours.values())
            if units:
                ledger.jobs[entry.job_id] = units
            else:
                ledger.jobs.pop(entry.job_id, None)
        for project, slots in data["hours"].items():
            totals = ledger.hours[project] = _unslots(slots)
            for (hour, _cluster, _gpu_type), units in totals.items():
                if fold is not None and hour <= fold:  # the rule `_add` routes a late revision by
                    _bump(
                        ledger._dropped if drop is not None and hour <= drop else ledger._folded,
                        project,
                        units,
                    )
                else:
                    _bump(ledger._per_hour.setdefault(project, {}), hour, units)
            if not ledger._per_hour.get(project, True):
                del ledger._per_hour[project]
        return ledger


def _entry_dict(entry: LedgerEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in LedgerEntry.__dataclass_fields__}


def _slots(hours: Mapping[Slot, int]) -> list[list[Any]]:
    return [
        [hour, cluster, gpu_type, hours[(hour, cluster, gpu_type)]]
        for hour, cluster, gpu_type in sorted(hours)
    ]


def _unslots(rows: Iterable[list[Any]]) -> dict[Slot, int]:
    hours: dict[Slot, int] = {}
    for hour, cluster, gpu_type, units in rows:
        if type(hour) is not int or type(units) is not int:
            raise ValueError("a checkpoint's hours and units are integers")
        hours[(hour, cluster, gpu_type)] = units
    return hours


def _bump(figures: dict[K, int], key: K, units: int) -> None:
    """Add to a figure, dropping it at zero (a project or hour with no units has no key)."""
    left = figures.get(key, 0) + units
    if left:
        figures[key] = left
    else:
        figures.pop(key, None)


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def fold_horizon(at: int, half_life_s: int, half_lives: int = FOLD_HALF_LIVES) -> int | None:
    """The newest hour that ended at least `half_lives` half-lives before `at` (its decay is at
    most 2^-half_lives); None for half-life 0: without decay no use becomes negligible."""
    if half_life_s == 0:
        return None
    return (at - half_lives * half_life_s) // BUCKET_S - 1


def reset_hour(at: int, resets: Iterable[int]) -> int | None:
    """The newest hour that ends at or before the last reset mark up to `at`; None without one."""
    since = max((mark for mark in resets if mark <= at), default=None)
    return None if since is None else since // BUCKET_S - 1


def decayed_usage(
    hours: Mapping[str, Mapping[int, int]],
    at: int,
    half_life_s: int,
    resets: Iterable[int] = (),
    fold_half_lives: int = FOLD_HALF_LIVES,
) -> dict[str, float]:
    """Charged GPU-seconds per project, decayed to `at`, dropping what precedes the last reset.

    An hour's use counts from the hour's end (its decay starts when it is over). Use after `at`
    (a clock behind the data) counts undecayed.

    The hours past the fold horizon (`fold_horizon`: ended `fold_half_lives` half-lives or more
    before `at`) are summed as integers and counted as if all used in the horizon hour itself: an
    upper bound, too high by less than 2^-fold_half_lives of those units (their true weight is
    between 0 and that). The folded figures of `UsageLedger.project_hours` are sums of such hours
    (or of hours before the reset, dropped either way), so folding changes nothing here: the
    same integer sum meets the same factor, and the result is the same bits whether and whenever
    the ledger folded, provided `at` is its clock (or later) and `fold` was given the same
    half-life, `fold_half_lives` and the last reset mark up to its clock. If a mark was withheld
    from a fold and given here, the hours it should drop that were folded after it count in the
    lumped figure: too high by less than 2^-fold_half_lives of their units, as above.
    """
    drop = reset_hour(at, resets)
    horizon = fold_horizon(at, half_life_s, fold_half_lives)
    usage: dict[str, float] = {}
    decays: dict[int, float] = {}  # projects share their hours: each age's factor once (same value)

    def factor(hour: int) -> float:
        age = max(0, at - (hour + 1) * BUCKET_S)
        decay = decays.get(age)
        if decay is None:
            decay = decays[age] = decay_factor(age, half_life_s)
        return decay

    for project in sorted(hours):
        per_hour = hours[project]
        total = 0.0
        lumped = 0  # integer units past the horizon: exact, whatever the grouping
        live: list[int] = []
        for hour in sorted(per_hour):
            if drop is not None and hour <= drop:
                continue
            if horizon is not None and hour <= horizon:
                lumped += per_hour[hour]
            else:
                live.append(hour)
        if lumped and horizon is not None:
            total += lumped / CHARGE_UNITS_PER_GPU_SECOND * factor(horizon)
        for hour in live:
            total += per_hour[hour] / CHARGE_UNITS_PER_GPU_SECOND * factor(hour)
        usage[project] = max(0.0, total)
    return usage


def share_tree(nodes: Mapping[str, Node], usage: Mapping[str, float]) -> tuple[ShareTree, dict[str, float]]:
    """The fair-share tree of the organisation and the usage of each of its leaves.

    Projects are the leaves; an organisation or group with no project below it is left out (an
    empty account would take a rank from real ones). Usage is never dropped: a project that used
    GPUs without being declared becomes a leaf under the root with 0 shares (its usage is real
    and counts in everybody's normalisation); usage booked on an inner node, or on the reserved
    id "root", becomes a 0-share leaf `<id>:own` under that node.
    """
    children: dict[str | None, list[str]] = {}
    for node in nodes.values():
        children.setdefault(node.parent, []).append(node.node_id)

    def kept(node_id: str) -> bool:
        return nodes[node_id].kind == "project" or any(kept(c) for c in children.get(node_id, []))

    keep = {n for n in nodes if kept(n)}
    tree_nodes = [ShareNode(n, nodes[n].parent or ROOT, nodes[n].shares) for n in sorted(keep)]
    leaf_usage: dict[str, float] = {}
    for project, amount in sorted(usage.items()):
        if project == UNATTRIBUTED:
            continue
        if project in keep and nodes[project].kind == "project":
            leaf_usage[project] = amount
        elif project in keep or project == ROOT:
            own = f"{project}:own"
            tree_nodes.append(ShareNode(own, project, 0))
            leaf_usage[own] = amount
        else:
            tree_nodes.append(ShareNode(project, ROOT, 0))
            leaf_usage[project] = amount
    return ShareTree(tree_nodes), leaf_usage
