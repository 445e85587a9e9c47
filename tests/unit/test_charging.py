"""Charge policy: exact fixed-point charges under the policy in force at the time of use."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.charging import (
    CHARGE_UNITS_PER_GPU_SECOND,
    ChargePolicy,
    PolicyInvalid,
    PolicyTimeline,
)

T0 = 1_798_761_600  # 2027-01-01T00:00:00Z


def policy(policy_id: str = "q1", at: int = T0, **overrides: object) -> ChargePolicy:
    fields: dict[str, object] = {
        "gpu_type_weights": {"H100": 100, "B300": 150},
        "priority_multipliers": {"preemptible": 50, "standard": 100, "non-preemptible": 200},
        "interactive_rate": 125,
    }
    fields.update(overrides)
    return ChargePolicy(policy_id=policy_id, effective_from=at, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpu_type", "priority_class", "interactive", "factor_hundredths_cubed"),
    [
        ("H100", "standard", False, 100 * 100 * 100),
        ("B300", "standard", False, 150 * 100 * 100),
        ("H100", "preemptible", False, 100 * 50 * 100),
        ("H100", "non-preemptible", False, 100 * 200 * 100),
        ("B300", "non-preemptible", True, 150 * 200 * 125),
    ],
    ids=[
        "an H100 standard GPU-second costs exactly one unit GPU-second",
        "a B300 second costs one and a half H100 seconds",
        "preemptible time costs half",
        "non-preemptible time costs double, so HIGH is never free",
        "interactive time multiplies on top of type and class",
    ],
)
def test_the_rate_is_the_product_of_the_three_factors(
    gpu_type: str, priority_class: str, interactive: bool, factor_hundredths_cubed: int
) -> None:
    assert policy().rate_per_gpu_second(gpu_type, priority_class, interactive) == factor_hundredths_cubed
    assert CHARGE_UNITS_PER_GPU_SECOND == 100 * 100 * 100


def test_a_span_that_crosses_a_policy_change_is_charged_at_each_sides_rate() -> None:
    timeline = PolicyTimeline([policy("q1", T0), policy("q1b", T0 + 3600, gpu_type_weights={"H100": 120})])

    spans = timeline.charge(T0 + 1800, T0 + 7200, 8, "H100", "standard", False)

    assert [(s.start, s.end, s.policy_id) for s in spans] == [
        (T0 + 1800, T0 + 3600, "q1"),
        (T0 + 3600, T0 + 7200, "q1b"),
    ]
    assert [s.gpu_seconds for s in spans] == [8 * 1800, 8 * 3600]
    assert [s.charge_units for s in spans] == [8 * 1800 * 100 * 100 * 100, 8 * 3600 * 120 * 100 * 100]


def test_a_policy_that_takes_effect_later_does_not_rewrite_earlier_use() -> None:
    timeline = PolicyTimeline([policy("q1", T0)])
    before = timeline.charge(T0, T0 + 60, 1, "H100", "standard", False)
    dearer = {"preemptible": 50, "standard": 300, "non-preemptible": 400}
    timeline.add(policy("q2", T0 + 3600, priority_multipliers=dearer))

    assert timeline.charge(T0, T0 + 60, 1, "H100", "standard", False) == before


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=86_399), max_size=6, unique=True),
    gpus=st.integers(min_value=0, max_value=1024),
    changes=st.lists(st.integers(min_value=1, max_value=86_399), max_size=3, unique=True),
)
def test_charges_add_up_exactly_however_the_time_is_split(
    cuts: list[int], gpus: int, changes: list[int]
) -> None:
    timeline = PolicyTimeline(
        [
            policy("base", T0),
            *(policy(f"p{c}", T0 + c, gpu_type_weights={"H100": 100 + c % 97}) for c in changes),
        ]
    )
    whole = timeline.charge(T0, T0 + 86_400, gpus, "H100", "standard", True)
    points = [T0, *sorted(T0 + c for c in cuts), T0 + 86_400]
    pieces = [
        s
        for a, b in itertools.pairwise(points)
        for s in timeline.charge(a, b, gpus, "H100", "standard", True)
    ]

    assert sum(s.charge_units for s in pieces) == sum(s.charge_units for s in whole)
    assert sum(s.gpu_seconds for s in pieces) == gpus * 86_400


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: policy(gpu_type_weights={"H100": 100.5}), "integer in hundredths"),
        (lambda: policy(priority_multipliers={"standard": -1}), "integer in hundredths"),
        (lambda: policy(interactive_rate=10_001), "integer in hundredths"),
        (lambda: policy().rate_per_gpu_second("A100", "standard", False), "no weight for GPU type 'A100'"),
        (
            lambda: policy().rate_per_gpu_second("H100", "urgent", False),
            "no multiplier for priority class 'urgent'",
        ),
        (lambda: PolicyTimeline([policy("q1", T0)]).in_force(T0 - 1), "no charge policy is in force"),
        (lambda: PolicyTimeline([policy("q1", T0), policy("q2", T0)]), "both take effect"),
        (lambda: PolicyTimeline([policy("q1", T0), policy("q1", T0 + 5)]), "already exists with other rates"),
    ],
    ids=[
        "a fractional hundredth is refused",
        "a negative multiplier is refused",
        "a factor above 100x is refused",
        "an unlisted GPU type has no price unless a default is set",
        "an unknown priority class has no price",
        "use before the first policy has no price",
        "two versions cannot take effect at the same instant",
        "a policy id cannot be reused with other rates",
    ],
)
def test_bad_policies_are_refused_with_a_reason(make: object, message: str) -> None:
    with pytest.raises(PolicyInvalid, match=message):
        make()  # type: ignore[operator]


def test_the_same_policy_applied_again_changes_nothing() -> None:
    timeline = PolicyTimeline([policy("q1", T0)])
    timeline.add(policy("q1", T0))
    assert timeline.in_force(T0 + 10).policy_id == "q1"


def test_a_default_weight_prices_unlisted_gpu_types() -> None:
    assert policy(default_gpu_type_weight=80).rate_per_gpu_second("A100", "standard", False) == 80 * 100 * 100


@pytest.mark.parametrize(
    "multipliers",
    [
        {"standard": 100},
        {"preemptible": 0, "standard": 100, "non-preemptible": 200},
        {"preemptible": 50, "standard": 100, "non-preemptible": 90},
    ],
    ids=[
        "a policy must price every priority class",
        "no class is free",
        "non-preemptible never costs less than standard: HIGH is a price",
    ],
)
def test_a_policy_that_would_break_the_price_ladder_is_invalid(multipliers: dict[str, int]) -> None:
    with pytest.raises(PolicyInvalid):
        policy("bad", T0, priority_multipliers=multipliers)


def test_no_gpu_type_is_free() -> None:
    with pytest.raises(PolicyInvalid):
        policy("bad", T0, gpu_type_weights={"H100": 0})
