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
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND, PolicyTimeline
from allmende.domain.fairshare.decay import decay_factor
from allmende.domain.fairshare.tree import ROOT, ShareNode, ShareTree
from allmende.domain.organisation import Node
from allmende.domain.postings import priced_pieces
from allmende.schemas.ledger import UNATTRIBUTED, LedgerEntry

BUCKET_S = 3600  # usage is counted per hour: fine beside a half-life of days, small to keep
JOURNAL_MAX = 100_000  # slot changes kept per followed project between two reads


_GENERATIONS = itertools.count(1)

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
    generation: int = field(default_factory=lambda: next(_GENERATIONS))  # a rebuilt ledger is another
    clock: int = 0  # the latest end of use seen: the stream's "now"
    # Per followed project, the slot changes since its reader last took them (`follow`, `changes`):
    # a reader that keeps sums (admission's budgets) adds these instead of walking every hour.
    _journals: dict[str, list[tuple[Slot, int]]] = field(default_factory=dict, repr=False, compare=False)
    # Charge units per project and hour whatever the cluster, kept with `hours`: what fair share
    # decays (`project_hours`), without regrouping every slot at each recompute.
    _per_hour: dict[str, dict[int, int]] = field(default_factory=dict, repr=False, compare=False)

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
        self.entries[entry.entry_id] = _Held(entry, hours)
        self._add(entry.project, entry.job_id, hours, 1)

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
        for slot, units in hours.items():
            left = totals.get(slot, 0) + sign * units
            if left:
                totals[slot] = left
            else:
                totals.pop(slot, None)
            hour = slot[0]
            left = per_hour.get(hour, 0) + sign * units
            if left:
                per_hour[hour] = left
            else:
                per_hour.pop(hour, None)
        if not totals:
            del self.hours[project]
        if not per_hour:
            del self._per_hour[project]

    def charge_units(self, project: str) -> int:
        return sum(self.hours.get(project, {}).values())

    def project_hours(self) -> dict[str, dict[int, int]]:
        """Charge units per project and hour, whatever the cluster: what fair share decays."""
        return {project: dict(per_hour) for project, per_hour in self._per_hour.items()}


def decayed_usage(
    hours: Mapping[str, Mapping[int, int]], at: int, half_life_s: int, resets: Iterable[int] = ()
) -> dict[str, float]:
    """Charged GPU-seconds per project, decayed to `at`, dropping what precedes the last reset.

    An hour's use counts from the hour's end (its decay starts when it is over). Use after `at`
    (a clock behind the data) counts undecayed.
    """
    marks = sorted(resets)
    index = bisect.bisect_right(marks, at)
    since = marks[index - 1] if index else None
    usage: dict[str, float] = {}
    decays: dict[int, float] = {}  # projects share their hours: each age's factor once (same value)
    for project in sorted(hours):
        total = 0.0
        for hour in sorted(hours[project]):
            end = (hour + 1) * BUCKET_S
            if since is not None and end <= since:
                continue
            units = hours[project][hour]
            age = max(0, at - end)
            decay = decays.get(age)
            if decay is None:
                decay = decays[age] = decay_factor(age, half_life_s)
            total += units / CHARGE_UNITS_PER_GPU_SECOND * decay
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
