"""Weight banks, weight sets and the forward schedule of the B and 2B arms (R17, R18).

A forward at A active experts reads A experts' weights. A *weight set* is one such group: a
physical bank (an independent clone of all L local experts) and a rotation of local expert
positions inside it, so one bank holds floor(L / A) disjoint sets. The control (B) arm cycles
through B sets whose bytes together exceed the cache (GPU L2, or the CPU's last-level cache)
by the capacity multiple, at least two sets; the published arm cycles through 2B. Both arms
run the same warmup and timed forward counts, whole multiples of 2B, so each covers complete
cycles; small-A points therefore use more forwards (the seed: "expert measurements may use
more forwards to complete the required weight cycles").

Counting the bytes a forward actually reads matters: with whole banks as the unit, two banks
at A = 2 of 64 experts cycle through 4 experts (38 MB of Qwen3-30B weights) that stay in an
H200's 60 MB L2, and the 2B arm came out 3-4% slower than B (seen on the H200, 2026-11-30).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ArmSchedule",
    "WeightSet",
    "arm_schedules",
    "physical_banks",
    "weight_set",
    "weight_sets",
]

CAPACITY_MULTIPLE = 2
MINIMUM_BANKS = 2


def weight_sets(
    active: int,
    expert_bytes: int,
    cache_bytes: int,
    *,
    capacity_multiple: int = CAPACITY_MULTIPLE,
    minimum: int = MINIMUM_BANKS,
) -> int:
    """B for a point with ``active`` experts: sets whose bytes exceed the cache, at least two.

    The all-remote point (A = 0) reads no expert weights and keeps the minimum.
    """
    if expert_bytes < 1:
        raise ValueError(f"expert bytes must be positive, got {expert_bytes}")
    if cache_bytes < 0 or active < 0:
        raise ValueError("cache bytes and active experts must not be negative")
    if active == 0:
        return minimum
    return max(minimum, math.ceil(capacity_multiple * cache_bytes / (active * expert_bytes)))


@dataclass(frozen=True, slots=True)
class WeightSet:
    bank: int
    offset: int


def weight_set(index: int, active: int, local_experts: int) -> WeightSet:
    """Where the ``index``-th set of a cycle lives: its bank and local expert rotation."""
    per_bank = max(1, local_experts // max(active, 1))
    return WeightSet(bank=index // per_bank, offset=(index % per_bank) * active)


def physical_banks(
    actives: Iterable[int],
    expert_bytes: int,
    cache_bytes: int,
    local_experts: int,
    *,
    capacity_multiple: int = CAPACITY_MULTIPLE,
    minimum: int = MINIMUM_BANKS,
) -> int:
    """Banks to clone so that the 2B arm of every planned A finds its sets (at least 2B)."""
    needed = 2 * minimum
    for active in set(actives):
        sets = 2 * weight_sets(
            active, expert_bytes, cache_bytes, capacity_multiple=capacity_multiple, minimum=minimum
        )
        needed = max(needed, weight_set(sets - 1, active, local_experts).bank + 1)
    return needed


@dataclass(frozen=True, slots=True)
class ArmSchedule:
    """One arm of a context: its weight-set count and forward counts."""

    label: str
    sets: int
    warmup: int
    timed: int

    def set_of(self, forward: int) -> int:
        """Set used by the ``forward``-th forward of the context (warmup forwards included)."""
        return forward % self.sets


def arm_schedules(
    sets: int, iterations: int, warmup_cycles: int
) -> tuple[ArmSchedule, ArmSchedule]:
    """The B (control) and 2B (published) arms with identical forward counts."""
    if sets < 1 or iterations < 1 or warmup_cycles < 0:
        raise ValueError("sets and iterations must be positive, warmup cycles not negative")
    cycle = 2 * sets
    timed = math.ceil(iterations / cycle) * cycle
    warmup = warmup_cycles * cycle
    return (
        ArmSchedule(label="B", sets=sets, warmup=warmup, timed=timed),
        ArmSchedule(label="2B", sets=2 * sets, warmup=warmup, timed=timed),
    )
