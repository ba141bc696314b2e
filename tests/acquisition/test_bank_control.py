"""Weight banks, the B/2B schedule and the 3% pooled-median control (R16-R18)."""

from __future__ import annotations

import pytest

from acquisition.protocol.banks import (
    arm_schedules,
    physical_banks,
    weight_set,
    weight_sets,
)
from acquisition.protocol.statistics import (
    median_of_context_medians,
    pooled_median,
    stability_control,
)

L2_H200 = 60 * 1024 * 1024


def vars_of(where: object) -> tuple[int, int]:
    return (where.bank, where.offset)  # type: ignore[attr-defined]


QWEN_EXPERT = 3 * 2048 * 768 * 2  # bytes of one Qwen3-30B-A3B expert in bf16


def test_weight_sets_overflow_the_cache_twice_with_at_least_two() -> None:
    assert weight_sets(128, QWEN_EXPERT, L2_H200) == 2  # 1.2 GB per set: the minimum
    assert weight_sets(1, QWEN_EXPERT, L2_H200) == 14  # 14 x 9.4 MB >= 2 x 60 MiB
    assert weight_sets(0, QWEN_EXPERT, L2_H200) == 2  # all-remote reads no weights
    with pytest.raises(ValueError):
        weight_sets(4, 0, L2_H200)


def test_small_a_uses_enough_sets_to_leave_the_l2() -> None:
    # Seen on the H200: at A=2 of 64, two whole banks cycled through 4 experts (38 MB) that
    # stayed in the 60 MB L2 and the 2B arm was 3-4% slower. Counting read bytes fixes it.
    sets = weight_sets(2, QWEN_EXPERT, L2_H200)
    assert sets * 2 * QWEN_EXPERT >= 2 * L2_H200


def test_sets_rotate_inside_a_bank_before_using_the_next() -> None:
    # L=64, A=2: 32 disjoint sets per bank.
    assert [tuple(vars_of(weight_set(i, 2, 64))) for i in (0, 1, 31, 32)] == [
        (0, 0),
        (0, 2),
        (0, 62),
        (1, 0),
    ]
    assert [weight_set(i, 64, 64).bank for i in range(4)] == [0, 1, 2, 3]


def test_physical_banks_cover_the_published_arm_of_every_planned_a() -> None:
    assert physical_banks([1, 2, 64], QWEN_EXPERT, L2_H200, 64) == 4  # 2B of A=64
    assert physical_banks([1], QWEN_EXPERT, L2_H200, 8) == 4  # 28 sets of 1 in banks of 8
    assert physical_banks([], QWEN_EXPERT, L2_H200, 8) == 4


def test_both_arms_run_identical_whole_cycles() -> None:
    control, selected = arm_schedules(sets=3, iterations=4, warmup_cycles=1)
    assert (control.sets, selected.sets) == (3, 6)
    assert control.timed == selected.timed == 6  # one 2B cycle covers 4 iterations
    assert control.warmup == selected.warmup == 6
    assert control.timed % control.sets == 0 and selected.timed % selected.sets == 0
    assert [selected.set_of(i) for i in range(8)] == [0, 1, 2, 3, 4, 5, 0, 1]


def test_the_stored_time_is_the_median_of_context_medians() -> None:
    contexts = [[1.0, 2.0, 100.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    assert median_of_context_medians(contexts) == 4.0
    assert pooled_median(contexts) == 5.0


def test_the_control_passes_within_three_percent_and_publishes_the_higher_bank_arm() -> None:
    selected = [[100.0, 101.0], [102.0, 100.0]]
    control = [[99.0, 100.0], [101.0, 98.0]]
    result = stability_control(selected, control)
    assert result.passed and result.tolerance == 0.03
    assert result.selected_us == median_of_context_medians(selected)
    failing = stability_control([[110.0], [111.0]], [[100.0], [100.0]])
    assert not failing.passed and failing.relative_change == pytest.approx(0.105)
