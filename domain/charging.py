"""Charge policy: what GPU time costs, exactly, under the policy in force when it was used.

charge = GPU-seconds x GPU-type weight x priority-class multiplier x interactive rate.

Each factor is fixed-point with two decimals (`Rate`, hundredths: 1.25 -> 125), so a charge is an
exact integer in *charge units* of 10^-6 weighted GPU-seconds: no rounding anywhere, and charges
add up across any split of the time (days, policy changes) to the same total. Int64 holds a
quarter of 5,000 GPUs at a combined factor of 20 with room to spare.

Policies change by events that apply from their effective time; a span of use is split at every
change inside it, each part charged at its own policy. Past charges are never rewritten.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

RATE_SCALE = 100  # a Rate of 100 is a factor of 1.00
CHARGE_UNITS_PER_GPU_SECOND = RATE_SCALE**3  # three factors, each scaled by RATE_SCALE
MAX_RATE = 100 * RATE_SCALE  # no factor above 100x: a typo must not drain a budget
PRIORITY_CLASSES = ("preemptible", "standard", "non-preemptible")


class PolicyInvalid(ValueError):
    """A policy that cannot be applied (unknown class, rate out of range, no policy in force)."""


def _check_rate(name: str, rate: int) -> int:
    if not isinstance(rate, int) or isinstance(rate, bool) or not 0 <= rate <= MAX_RATE:
        raise PolicyInvalid(f"{name}: a rate is an integer in hundredths from 0 to {MAX_RATE}, got {rate!r}")
    return rate


def _frozen(rates: Mapping[str, int], what: str) -> Mapping[str, int]:
    return MappingProxyType({key: _check_rate(f"{what} {key!r}", value) for key, value in rates.items()})


@dataclass(frozen=True)
class ChargePolicy:
    """One version of the price list, in force from `effective_from` (UTC Unix seconds)."""

    policy_id: str
    effective_from: int
    gpu_type_weights: Mapping[str, int]
    priority_multipliers: Mapping[str, int]
    interactive_rate: int = RATE_SCALE
    default_gpu_type_weight: int | None = None  # None: an unlisted GPU type is an error
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_type_weights", _frozen(self.gpu_type_weights, "GPU type"))
        object.__setattr__(self, "priority_multipliers", _frozen(self.priority_multipliers, "priority class"))
        _check_rate("interactive rate", self.interactive_rate)
        if self.default_gpu_type_weight is not None:
            _check_rate("default GPU type weight", self.default_gpu_type_weight)
        # Every class priced, none free, and dearer as it gets harder to interrupt: HIGH is a price.
        missing = [c for c in PRIORITY_CLASSES if c not in self.priority_multipliers]
        if missing:
            raise PolicyInvalid(f"policy {self.policy_id} has no multiplier for {', '.join(missing)}")
        multipliers = [self.priority_multipliers[c] for c in PRIORITY_CLASSES]
        if min(multipliers) <= 0 or multipliers != sorted(multipliers):
            raise PolicyInvalid(
                f"policy {self.policy_id}: multipliers must be above 0 and preemptible <= standard <= "
                f"non-preemptible, got {dict(zip(PRIORITY_CLASSES, multipliers, strict=True))}"
            )
        weights = [*self.gpu_type_weights.values(), self.default_gpu_type_weight or RATE_SCALE]
        if min(weights) <= 0 or self.interactive_rate <= 0:
            raise PolicyInvalid(f"policy {self.policy_id}: GPU time is never free; weights and rates above 0")

    def rate_per_gpu_second(self, gpu_type: str, priority_class: str, interactive: bool) -> int:
        """Charge units per GPU-second for this kind of GPU time."""
        weight = self.gpu_type_weights.get(gpu_type, self.default_gpu_type_weight)
        if weight is None:
            raise PolicyInvalid(f"policy {self.policy_id} has no weight for GPU type {gpu_type!r}")
        multiplier = self.priority_multipliers.get(priority_class)
        if multiplier is None:
            raise PolicyInvalid(
                f"policy {self.policy_id} has no multiplier for priority class {priority_class!r}"
            )
        return weight * multiplier * (self.interactive_rate if interactive else RATE_SCALE)


def flat_policy(policy_id: str = "flat", effective_from: int = 0) -> ChargePolicy:
    """Every factor 1.00: what GPU time costs before any policy is declared (a GPU-hour is a GPU-hour)."""
    return ChargePolicy(
        policy_id=policy_id,
        effective_from=effective_from,
        gpu_type_weights={},
        priority_multipliers=dict.fromkeys(PRIORITY_CLASSES, RATE_SCALE),
        default_gpu_type_weight=RATE_SCALE,
    )


@dataclass(frozen=True, slots=True)
class ChargedSpan:
    start: int
    end: int
    gpu_seconds: int
    charge_units: int
    policy_id: str


class PolicyTimeline:
    """Policy versions ordered by effective time; answers which one was in force when."""

    def __init__(self, policies: Sequence[ChargePolicy] = ()) -> None:
        self._policies: list[ChargePolicy] = []
        self._starts: list[int] = []  # effective_from of each, kept beside them for bisect
        for policy in policies:
            self.add(policy)

    def add(self, policy: ChargePolicy) -> None:
        """Insert a version; the same id again is a no-op (replays), a clash is an error."""
        for held in self._policies:
            if held.policy_id == policy.policy_id:
                if held != policy:
                    raise PolicyInvalid(f"policy {policy.policy_id} already exists with other rates")
                return
            if held.effective_from == policy.effective_from:
                raise PolicyInvalid(
                    f"policies {held.policy_id} and {policy.policy_id} both take effect at "
                    f"{policy.effective_from}"
                )
        index = bisect.bisect(self._starts, policy.effective_from)
        self._policies.insert(index, policy)
        self._starts.insert(index, policy.effective_from)

    def in_force(self, at: int) -> ChargePolicy:
        return self._policies[self._index_at(at)]

    def _index_at(self, at: int) -> int:
        index = bisect.bisect_right(self._starts, at) - 1
        if index < 0:
            raise PolicyInvalid(f"no charge policy is in force at {at}")
        return index

    def charge(
        self, start: int, end: int, gpus: int, gpu_type: str, priority_class: str, interactive: bool
    ) -> list[ChargedSpan]:
        """Charge [start, end) on `gpus` GPUs, split at every policy change inside it."""
        if end < start or gpus < 0:
            raise ValueError(f"not a span of use: [{start}, {end}) on {gpus} GPUs")
        spans: list[ChargedSpan] = []
        cursor = start
        while cursor < end:
            index = self._index_at(cursor)
            policy = self._policies[index]
            # The next policy starts after `cursor` (starts are sorted and distinct).
            stop = min(end, self._starts[index + 1]) if index + 1 < len(self._starts) else end
            gpu_seconds = gpus * (stop - cursor)
            rate = policy.rate_per_gpu_second(gpu_type, priority_class, interactive)
            spans.append(ChargedSpan(cursor, stop, gpu_seconds, gpu_seconds * rate, policy.policy_id))
            cursor = stop
        return spans
