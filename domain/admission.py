"""Admission: admit, queue or reject one job on a snapshot of its cluster and budget (no I/O).

`decide` is total: for any well-typed request and snapshot it returns a `Decision`, never raises,
and never changes the snapshot. Placing the hold, emitting events and stopping victims is the
service's business.

Rules in order of precedence; the first that decides wins, and its reason comes first:

====  ======================  =======  ==============================================================
rule  code                    verdict  when
====  ======================  =======  ==============================================================
0     invalid-request         REJECT   fewer than one GPU or fewer than one second asked for
1     too-large               REJECT   more GPUs than the cluster has
2     interactive-too-long    REJECT   interactive, longer than the interactive limit
2     interactive-limit       REJECT   interactive, the user's interactive GPUs would pass the limit
2     budget-exhausted        REJECT   interactive, the budget does not cover the expected charge
2     admitted-interactive    ADMIT    interactive: on free GPUs or preempting opportunistic jobs
2     cluster-full            QUEUE    interactive: not enough GPUs even with preemption
3     admitted-time-slice     ADMIT    inside the project's guarantee: free GPUs or preempting up to
                                       standard budget jobs (time-slice jobs are never preempted)
3     cluster-full            QUEUE    inside the guarantee, not enough GPUs even with preemption
4     admitted-budget         ADMIT    the budget covers the charge: free GPUs or preempting
                                       opportunistic jobs
4     cluster-full            QUEUE    the budget covers the charge, not enough GPUs
5     admitted-opportunistic  ADMIT    over budget, preemptible, enough idle GPUs (nothing held)
5     no-idle-gpus            QUEUE    over budget, preemptible, not enough idle GPUs
5     over-budget             REJECT   over budget and not preemptible
====  ======================  =======  ==============================================================

Information that follows the deciding reason: ``beyond-guarantee`` (a project with a guarantee
asks for more than it has left of it, so the budget applies), ``budget-exhausted`` (after an
over-budget verdict), and ``preempts-<group>`` (one per group of victims).

Holds: the interactive and budget lanes hold the whole expected charge; the time-slice lane holds
what budget there is, up to the expected charge (a guarantee is never refused for budget, the
ledger records use beyond it); the opportunistic lane holds nothing; QUEUE and REJECT hold nothing.
A hold is taken greedily from the budget lines in their paying order.

Figures in messages are GPU-hours at factor 1.00 (3.6e9 charge units), to at most one decimal.
Where a message sets what is left against what is needed, left is rounded down and needed up, so
the figures never contradict the verdict; elsewhere figures are rounded to the nearest tenth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from allmende.domain.admission_model import (
    AdmissionSnapshot,
    BudgetLine,
    Decision,
    JobRequest,
    Lane,
    Reason,
    Verdict,
    Victim,
)
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND
from allmende.domain.preemption import DEFAULT_FAIRSHARE, VICTIM_CODES, Reach, plan_victims, plural

UNITS_PER_GPU_HOUR = CHARGE_UNITS_PER_GPU_SECOND * 3600  # 3.6e9 at factor 1.00
LANES_THAT_HOLD = frozenset({Lane.INTERACTIVE, Lane.TIME_SLICE, Lane.BUDGET})
MAX_IDS_IN_A_REASON = 10  # a reason lists at most this many job ids, then "and N more"

Rounding = Literal["down", "nearest", "up"]


def gpu_hours(units: int, rounding: Rounding = "nearest") -> str:
    """Charge units as GPU-hours to at most one decimal, exactly (integers only): `1,000`, `12.5`."""
    sign = "-" if units < 0 else ""
    tenths, rest = divmod(abs(units) * 10, UNITS_PER_GPU_HOUR)
    bump = {"down": False, "nearest": 2 * rest >= UNITS_PER_GPU_HOUR, "up": rest > 0}[rounding]
    tenths += int(bump)
    whole, tenth = divmod(tenths, 10)
    text = f"{whole:,}" if tenth == 0 else f"{whole:,}.{tenth}"
    return f"{sign}{text}" if tenths else text


def _unit(figure: str) -> str:
    """`1 GPU-hour`, `0.5 GPU-hours`, `64 GPU-hours`."""
    return f"{figure} GPU-hour" if figure == "1" else f"{figure} GPU-hours"


def hours(seconds: int) -> str:
    """Seconds as hours to at most one decimal, rounded up: `8`, `1.5`."""
    tenths = -(-seconds * 10 // 3600)
    whole, tenth = divmod(tenths, 10)
    return f"{whole:,}" if tenth == 0 else f"{whole:,}.{tenth}"


def hold_for(budget: Sequence[BudgetLine], units: int) -> tuple[tuple[str, int], ...]:
    """Hold up to `units` greedily over the budget lines in paying order: (allocation id, units > 0)."""
    hold: list[tuple[str, int]] = []
    left = units
    for line in budget:
        if left <= 0:
            break
        take = min(left, line.available_units)
        if take > 0:
            hold.append((line.allocation_id, take))
            left -= take
    return tuple(hold)


# -- the facts every rule reads -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    expected_units: int  # gpus x requested seconds x rate
    available_before_units: int  # sum over the budget lines
    free_gpus: int  # cluster GPUs minus GPUs held by running jobs (below 0 when overcommitted)
    fairshare_factor: float
    notes: tuple[Reason, ...]  # information for decisions of the budget and over-budget rules

    @staticmethod
    def of(request: JobRequest, snapshot: AdmissionSnapshot) -> _Facts:
        note = _beyond_guarantee(request, snapshot)
        return _Facts(
            expected_units=request.gpus * request.requested_seconds * snapshot.rate,
            # "Never below 0" is the model's contract; clamping keeps hold <= available if it is broken.
            available_before_units=sum(max(line.available_units, 0) for line in snapshot.budget),
            free_gpus=snapshot.cluster_gpus - snapshot.load.used_gpus,
            fairshare_factor=snapshot.fairshare.get(request.project, DEFAULT_FAIRSHARE),
            notes=() if note is None else (note,),
        )


def _time_slice_gpus(request: JobRequest, snapshot: AdmissionSnapshot) -> int:
    """GPUs the project holds in the time-slice lane now, before this job."""
    return snapshot.load.time_slice_gpus(request.project)


def _inside_guarantee(request: JobRequest, snapshot: AdmissionSnapshot) -> bool:
    guaranteed = snapshot.guaranteed_gpus
    return guaranteed > 0 and _time_slice_gpus(request, snapshot) + request.gpus <= guaranteed


def _beyond_guarantee(request: JobRequest, snapshot: AdmissionSnapshot) -> Reason | None:
    if request.interactive or snapshot.guaranteed_gpus <= 0 or _inside_guarantee(request, snapshot):
        return None
    used = _time_slice_gpus(request, snapshot)
    return Reason(
        "beyond-guarantee",
        f"project {request.project} already holds {used} of its "
        f"{plural(snapshot.guaranteed_gpus, 'guaranteed GPU')} on cluster {request.cluster} and this job "
        f"asks for {request.gpus} more, so it is paid from the budget.",
    )


# -- building decisions -------------------------------------------------------------------------


def _decision(
    verdict: Verdict,
    lane: Lane | None,
    reasons: Sequence[Reason],
    facts: _Facts,
    snapshot: AdmissionSnapshot,
    hold: tuple[tuple[str, int], ...] = (),
    victims: tuple[Victim, ...] = (),
) -> Decision:
    return Decision(
        verdict=verdict,
        lane=lane,
        reasons=tuple(reasons),
        rate=snapshot.rate,
        expected_units=facts.expected_units,
        hold=hold,
        available_before_units=facts.available_before_units,
        available_after_units=facts.available_before_units - sum(units for _, units in hold),
        fairshare_factor=facts.fairshare_factor,
        preempt=victims,
    )


def _budget_sentence(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> str:
    needed = gpu_hours(facts.expected_units, "up")
    if not snapshot.budget:
        return (
            f"no allocation covers cluster {request.cluster} for project {request.project}; "
            f"this job needs up to {_unit(needed)}."
        )
    left = gpu_hours(facts.available_before_units, "down")
    return (
        f"project {request.project} has {_unit(left)} left in {snapshot.budget[0].period}; "
        f"this job needs up to {needed}."
    )


def _held_sentence(hold: tuple[tuple[str, int], ...], facts: _Facts) -> str:
    held = sum(units for _, units in hold)
    text = f"{_unit(gpu_hours(held))} held of {gpu_hours(facts.available_before_units)} left"
    if len(hold) > 1:
        text += " (" + ", ".join(f"{gpu_hours(units)} from {allocation}" for allocation, units in hold) + ")"
    return text


def _ids(victims: Sequence[Victim]) -> str:
    shown = ", ".join(v.job_id for v in victims[:MAX_IDS_IN_A_REASON])
    hidden = len(victims) - MAX_IDS_IN_A_REASON
    return shown if hidden <= 0 else f"{shown} and {hidden} more"


_GROUP_NOUNS = {
    "unhealthy-host": ("job on an unhealthy host", "jobs on unhealthy hosts"),
    "squatting": ("job that has left its GPUs idle", "jobs that have left their GPUs idle"),
    "opportunistic": ("opportunistic job", "opportunistic jobs"),
    "preemptible": ("preemptible budget job", "preemptible budget jobs"),
    "standard": ("standard budget job", "standard budget jobs"),
}


def _victim_reasons(victims: tuple[Victim, ...]) -> tuple[Reason, ...]:
    """One reason per group of victims, in the groups' order of precedence."""
    reasons: list[Reason] = []
    for code in VICTIM_CODES:
        group = [v for v in victims if v.code == code]
        if not group:
            continue
        one, many = _GROUP_NOUNS[code]
        noun = one if len(group) == 1 else many
        gpus = plural(sum(v.gpus for v in group), "GPU")
        tail = ", which must stop anyway" if code == "unhealthy-host" else ""
        reasons.append(
            Reason(f"preempts-{code}", f"it preempts {len(group)} {noun} ({gpus}){tail}: {_ids(group)}.")
        )
    return tuple(reasons)


_REACH_WORDS = {
    Reach.OPPORTUNISTIC: "opportunistic jobs",
    Reach.PREEMPTIBLE: "opportunistic and preemptible jobs",
    Reach.STANDARD: "opportunistic, preemptible and standard budget jobs",
}


@dataclass(frozen=True, slots=True)
class _Room:
    fits: bool
    victims: tuple[Victim, ...]
    freed_gpus: int


def _make_room(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts, reach: Reach) -> _Room:
    """Free GPUs first; otherwise the victims within `reach` (only when they make enough room)."""
    if facts.free_gpus >= request.gpus:
        return _Room(True, (), 0)
    victims, freed = plan_victims(
        snapshot.load.jobs,
        request.gpus - facts.free_gpus,
        now=snapshot.now,
        fairshare=snapshot.fairshare,
        unhealthy_hosts=snapshot.unhealthy_hosts,
        reach=reach,
    )
    return _Room(facts.free_gpus + freed >= request.gpus, victims, freed)


def _cluster_full(
    request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts, room: _Room, reach: Reach
) -> Reason:
    return Reason(
        "cluster-full",
        f"cluster {request.cluster} has {max(facts.free_gpus, 0)} of {plural(snapshot.cluster_gpus, 'GPU')} "
        f"free and preempting {_REACH_WORDS[reach]} would free {room.freed_gpus} more; this job needs "
        f"{request.gpus}, so it waits in the queue.",
    )


# -- the rules, in order of precedence: each decides or passes (None) ---------------------------


def _invalid_request(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision | None:
    if request.gpus >= 1 and request.requested_seconds >= 1:
        return None
    message = (
        f"job {request.job_id} asks for {plural(request.gpus, 'GPU')} for "
        f"{plural(request.requested_seconds, 'second')}; a job needs at least one GPU for one second or more."
    )
    return _decision(Verdict.REJECT, None, [Reason("invalid-request", message)], facts, snapshot)


def _too_large(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision | None:
    if request.gpus <= snapshot.cluster_gpus:
        return None
    message = (
        f"job {request.job_id} asks for {plural(request.gpus, 'GPU')}; cluster {request.cluster} has only "
        f"{snapshot.cluster_gpus}, so it could never start."
    )
    return _decision(Verdict.REJECT, None, [Reason("too-large", message)], facts, snapshot)


def _interactive(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision | None:
    if not request.interactive:
        return None
    limits = snapshot.limits
    if request.requested_seconds > limits.max_seconds:
        message = (
            f"interactive jobs may run at most {hours(limits.max_seconds)} hours; this one asks for "
            f"{hours(request.requested_seconds)}. Submit it as a batch job instead."
        )
        return _decision(Verdict.REJECT, None, [Reason("interactive-too-long", message)], facts, snapshot)
    in_use = snapshot.load.interactive_gpus(request.user)
    if in_use + request.gpus > limits.max_gpus_per_user:
        message = (
            f"user {request.user} already holds {plural(in_use, 'GPU')} in interactive jobs; "
            f"{request.gpus} more would make {in_use + request.gpus}, above the limit of "
            f"{limits.max_gpus_per_user} per user."
        )
        return _decision(Verdict.REJECT, None, [Reason("interactive-limit", message)], facts, snapshot)
    if facts.available_before_units < facts.expected_units:
        reason = Reason("budget-exhausted", _budget_sentence(request, snapshot, facts))
        return _decision(Verdict.REJECT, None, [reason], facts, snapshot)
    room = _make_room(request, snapshot, facts, Reach.OPPORTUNISTIC)
    if not room.fits:
        reason = _cluster_full(request, snapshot, facts, room, Reach.OPPORTUNISTIC)
        return _decision(Verdict.QUEUE, Lane.INTERACTIVE, [reason], facts, snapshot)
    hold = hold_for(snapshot.budget, facts.expected_units)
    admitted = Reason(
        "admitted-interactive", f"admitted in the interactive lane: {_held_sentence(hold, facts)}."
    )
    reasons = [admitted, *_victim_reasons(room.victims)]
    return _decision(Verdict.ADMIT, Lane.INTERACTIVE, reasons, facts, snapshot, hold, room.victims)


def _time_slice(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision | None:
    if not _inside_guarantee(request, snapshot):
        return None  # beyond the guarantee (or none): the budget rules decide, with a note
    room = _make_room(request, snapshot, facts, Reach.STANDARD)
    if not room.fits:
        reason = _cluster_full(request, snapshot, facts, room, Reach.STANDARD)
        return _decision(Verdict.QUEUE, Lane.TIME_SLICE, [reason], facts, snapshot)
    # A guarantee is never refused for budget: hold what there is, the ledger records the rest.
    hold = hold_for(snapshot.budget, facts.expected_units)
    held = sum(units for _, units in hold)
    used = _time_slice_gpus(request, snapshot) + request.gpus
    message = (
        f"admitted in the time-slice lane: with this job project {request.project} holds {used} of its "
        f"{plural(snapshot.guaranteed_gpus, 'guaranteed GPU')}; {_held_sentence(hold, facts)}"
    )
    if held < facts.expected_units:
        message += ", and use beyond that is charged over budget"
    reasons = [Reason("admitted-time-slice", message + "."), *_victim_reasons(room.victims)]
    return _decision(Verdict.ADMIT, Lane.TIME_SLICE, reasons, facts, snapshot, hold, room.victims)


def _budget(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision | None:
    if facts.available_before_units < facts.expected_units:
        return None
    room = _make_room(request, snapshot, facts, Reach.OPPORTUNISTIC)
    if not room.fits:
        reason = _cluster_full(request, snapshot, facts, room, Reach.OPPORTUNISTIC)
        return _decision(Verdict.QUEUE, Lane.BUDGET, [reason, *facts.notes], facts, snapshot)
    hold = hold_for(snapshot.budget, facts.expected_units)
    admitted = Reason("admitted-budget", f"admitted in the budget lane: {_held_sentence(hold, facts)}.")
    reasons = [admitted, *_victim_reasons(room.victims), *facts.notes]
    return _decision(Verdict.ADMIT, Lane.BUDGET, reasons, facts, snapshot, hold, room.victims)


def _over_budget(request: JobRequest, snapshot: AdmissionSnapshot, facts: _Facts) -> Decision:
    shortfall = Reason("budget-exhausted", _budget_sentence(request, snapshot, facts))
    if request.priority_class != "preemptible":
        message = (
            f"{_budget_sentence(request, snapshot, facts)} Over budget only preemptible jobs may run, "
            "opportunistically on idle GPUs: submit it as preemptible, or ask for more GPU-hours."
        )
        return _decision(
            Verdict.REJECT, None, [Reason("over-budget", message), *facts.notes], facts, snapshot
        )
    if facts.free_gpus < request.gpus:
        message = (
            f"over budget, this preemptible job may run only on idle GPUs; cluster {request.cluster} has "
            f"{max(facts.free_gpus, 0)} idle and it needs {request.gpus}, so it waits in the queue."
        )
        reasons = [Reason("no-idle-gpus", message), shortfall, *facts.notes]
        return _decision(Verdict.QUEUE, Lane.OPPORTUNISTIC, reasons, facts, snapshot)
    message = (
        "admitted in the opportunistic lane on idle GPUs: nothing is held, and the job may be preempted "
        "when budgeted work needs the GPUs."
    )
    reasons = [Reason("admitted-opportunistic", message), shortfall, *facts.notes]
    return _decision(Verdict.ADMIT, Lane.OPPORTUNISTIC, reasons, facts, snapshot)


_RULES = (_invalid_request, _too_large, _interactive, _time_slice, _budget)


def decide(request: JobRequest, snapshot: AdmissionSnapshot) -> Decision:
    """Admit, queue or reject `request` on `snapshot`: the first rule that decides wins."""
    facts = _Facts.of(request, snapshot)
    for rule in _RULES:
        decision = rule(request, snapshot, facts)
        if decision is not None:
            return decision
    return _over_budget(request, snapshot, facts)
