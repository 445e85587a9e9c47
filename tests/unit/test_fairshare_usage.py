"""Fair-share usage from ledger-entry revisions: exact, order-free, decayed from the hour totals."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND, ChargePolicy, PolicyTimeline, flat_policy
from allmende.domain.fairshare.decay import DEFAULT_HALF_LIFE
from allmende.domain.fairshare.usage import BUCKET_S, UsageLedger, decayed_usage, share_tree
from allmende.domain.metering import JobMeter
from allmende.domain.organisation import Node
from allmende.schemas.ledger import LedgerEntry
from tests.unit.builders import T0, finished, sample, started, submitted

FLAT = PolicyTimeline([flat_policy()])
HOUR = 3600
UNIT = CHARGE_UNITS_PER_GPU_SECOND


def _emitted(events: list[object], job: str) -> list[LedgerEntry]:
    """Every entry revision a meter emits for the events in this order (duplicates included)."""
    meter = JobMeter(job)
    out: list[LedgerEntry] = []
    for event in events:
        out.extend(meter.apply(event))  # type: ignore[arg-type]
    return out


def _job_events(job: str, project: str, gpus: int, samples: list[int], end: int) -> list[object]:
    return [
        submitted(gpus, job=job, project=project, event_id=f"{job}-sub"),
        started(0, gpus, f"{job}-start", job=job),
        *(sample(t, gpus, f"{job}-u{t}", job=job) for t in samples),
        finished(end, f"{job}-fin", job=job),
    ]


def test_an_entry_revision_replaces_what_the_older_one_charged() -> None:
    ledger = UsageLedger()
    events = _job_events("j1", "olmo", 4, [1800, 5400], 7200)
    revisions = _emitted(events, "j1")
    for entry in revisions:
        ledger.apply(entry, FLAT)
    assert ledger.charge_units("olmo") == 4 * 7200 * UNIT
    assert sum(ledger.project_hours()["olmo"].values()) == 4 * 7200 * UNIT
    assert ledger.jobs == {"j1": 4 * 7200 * UNIT}
    assert ledger.clock == T0 + 7200


def test_an_equal_or_older_revision_changes_nothing() -> None:
    ledger = UsageLedger()
    entry = _emitted(_job_events("j1", "olmo", 2, [], 3600), "j1")[-1]
    assert ledger.apply(entry, FLAT) is True
    assert ledger.apply(entry, FLAT) is False


def test_unattributed_time_counts_for_nobody_until_the_submission_is_known() -> None:
    ledger = UsageLedger()
    events = _job_events("j1", "olmo", 2, [600], 1200)
    late_submission = [*events[1:], events[0]]
    for entry in _emitted(late_submission, "j1"):
        ledger.apply(entry, FLAT)
    assert set(ledger.hours) == {"olmo"}
    assert ledger.charge_units("olmo") == 2 * 1200 * UNIT


def test_charges_follow_the_policy_and_are_cut_into_hours() -> None:
    dearer = ChargePolicy("dear", T0 + 1800, {}, {"standard": 300, "preemptible": 50, "non-preemptible": 400},
                          default_gpu_type_weight=100)  # fmt: skip
    timeline = PolicyTimeline([flat_policy(), dearer])
    ledger = UsageLedger()
    for entry in _emitted(_job_events("j1", "olmo", 1, [], 3600), "j1"):
        ledger.apply(entry, timeline)
    assert ledger.charge_units("olmo") == 1800 * UNIT + 1800 * 3 * UNIT
    hours = ledger.project_hours()["olmo"]
    assert all(h * BUCKET_S < T0 + 3600 for h in hours) and len(hours) == 2  # T0 is not on the hour
    assert {(c, g) for _, c, g in ledger.hours["olmo"]} == {("c1", "A100")}


@settings(max_examples=150, deadline=None, database=None)
@given(seed=st.integers(0, 10_000), copies=st.integers(1, 3))
def test_any_order_and_any_duplication_give_the_same_integers(seed: int, copies: int) -> None:
    rng = random.Random(seed)
    revisions: list[LedgerEntry] = []
    for j in range(3):
        samples = sorted(rng.sample(range(100, 20_000, 100), rng.randint(0, 5)))
        events = _job_events(f"j{j}", f"p{j % 2}", rng.randint(1, 8), samples, 20_000 + j)
        rng.shuffle(events)
        revisions += _emitted(events, f"j{j}")
    in_order = UsageLedger()
    for entry in revisions:
        in_order.apply(entry, FLAT)
    shuffled = revisions * copies
    rng.shuffle(shuffled)
    other = UsageLedger()
    for entry in shuffled:
        other.apply(entry, FLAT)
    assert other.hours == in_order.hours and other.clock == in_order.clock
    assert other.jobs == in_order.jobs
    # The hours fair share decays, kept as slots change, are the slots regrouped by hour.
    regrouped: dict[str, dict[int, int]] = {}
    for project, slots in other.hours.items():
        for (hour, _, _), units in slots.items():
            regrouped.setdefault(project, {})[hour] = regrouped.get(project, {}).get(hour, 0) + units
    assert (
        other.project_hours()
        == in_order.project_hours()
        == {p: {h: u for h, u in hours.items() if u} for p, hours in regrouped.items()}
    )


def test_ten_gpus_used_then_idle_halve_their_usage_every_half_life() -> None:
    hl = DEFAULT_HALF_LIFE
    start = (T0 // HOUR) * HOUR
    busy = 24  # hours of 10 GPUs
    hours = {"olmo": {start // HOUR + h: 10 * HOUR * UNIT for h in range(busy)}}
    idle_from = start + busy * HOUR
    at_stop = decayed_usage(hours, idle_from, hl)["olmo"]
    assert 0 < at_stop < 10 * busy * HOUR  # the earlier hours have begun to decay
    for n in (1, 2, 3):
        assert decayed_usage(hours, idle_from + n * hl, hl)["olmo"] == pytest.approx(
            at_stop / 2**n, rel=1e-12
        )
    assert decayed_usage(hours, idle_from + 5 * hl, 0)["olmo"] == 10 * busy * HOUR  # half-life 0: no decay


def test_a_reset_drops_the_usage_of_the_periods_before_it() -> None:
    hours = {"olmo": {10: 5 * UNIT, 20: 7 * UNIT}}
    assert decayed_usage(hours, 30 * HOUR, 0, resets=[15 * HOUR]) == {"olmo": 7.0}
    assert decayed_usage(hours, 30 * HOUR, 0, resets=[40 * HOUR]) == {"olmo": 12.0}  # not yet


def test_decayed_usage_does_not_depend_on_the_order_the_hours_were_filled_in() -> None:
    rng = random.Random(3)
    items = [(f"p{rng.randint(0, 4)}", rng.randint(0, 500), rng.randint(1, 10**12)) for _ in range(400)]
    first: dict[str, dict[int, int]] = {}
    second: dict[str, dict[int, int]] = {}
    for project, hour, units in items:
        first.setdefault(project, {})[hour] = first.get(project, {}).get(hour, 0) + units
    for project, hour, units in reversed(items):
        second.setdefault(project, {})[hour] = second.get(project, {}).get(hour, 0) + units
    assert decayed_usage(first, 600 * HOUR, 86_400) == decayed_usage(second, 600 * HOUR, 86_400)


def test_the_tree_holds_the_organisation_and_no_usage_is_dropped() -> None:
    nodes = {
        "inst": Node("inst", None, "organisation", 100, ()),
        "olmo": Node("olmo", "inst", "project", 10, ()),
        "empty": Node("empty", "inst", "group", 50, ()),
    }
    tree, leaves = share_tree(nodes, {"olmo": 5.0, "stealth": 2.0, "": 1.0, "inst": 3.0, "root": 4.0})
    assert "empty" not in tree  # an account with no project below it takes no rank
    assert tree.parent("stealth") == "root" and tree.shares("stealth") == 0
    assert tree.parent("inst:own") == "inst" and tree.parent("root:own") == "root"
    assert leaves == {"olmo": 5.0, "stealth": 2.0, "inst:own": 3.0, "root:own": 4.0}


def test_a_policy_seen_late_prices_again_what_it_covers() -> None:
    dearer = ChargePolicy("dear", T0 + 1800, {}, {"standard": 300, "preemptible": 50, "non-preemptible": 400},
                          default_gpu_type_weight=100)  # fmt: skip
    late = UsageLedger()
    for entry in _emitted(_job_events("j1", "olmo", 1, [], 3600), "j1"):
        late.apply(entry, FLAT)
    assert late.reprice(PolicyTimeline([flat_policy(), dearer]), dearer.effective_from) == 1
    on_time = UsageLedger()
    for entry in _emitted(_job_events("j1", "olmo", 1, [], 3600), "j1"):
        on_time.apply(entry, PolicyTimeline([flat_policy(), dearer]))
    assert late.hours == on_time.hours and late.jobs == on_time.jobs
