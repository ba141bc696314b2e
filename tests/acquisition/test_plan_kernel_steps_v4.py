"""Rule v4 of the kernel-step plan (issue 20 item 1): v3 plus the A values where the balanced
tiles bend along A at EP1's 16-row rows, from configuration and geometry only (R10-R11: the A
axis gets the tiles' slope-change corners, nothing measured decides a point);
``--moe-kernel-steps v4`` and the default (``auto``/``on``: test_plan_kernel_steps_v3.py), v2 and
v3 unchanged (their plans keep their hashes, their leave-one-out classes their bends)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_plan_kernel_steps_v3 import F2K, argv, f2_plan, steps

from acquisition.cli import build_parser, prepare
from acquisition.options import OptionError
from acquisition.plan.experts import activated_axis
from acquisition.plan.kernel import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V3,
    KERNEL_STEPS_RULE_V4,
    KernelSteps,
)
from bench.kernel_step_loo import _positive
from bench.loo_surfaces import PointError, is_knot, kernel_steps
from moetables.bundle import open_bundle

V4 = KERNEL_STEPS_RULE_V4
# is_knot over the 551 positive points of the shipped f2k modular DP1 table: switch rows and
# corners under v2, and v3's ramp edges too (as the published v2 and v3 readings counted them).
V2_KNOTS = 230
V3_KNOTS = 252


def brute_corners(m: int, b: int, low: int, high: int, most: int) -> set[int]:
    """Both A of every step along A where the smallest or the largest expert's tiles drop from
    j + 1 (or more) to j <= ``most``, under the balanced histogram of m pairs over A experts."""

    def smallest(a: int) -> int:
        return math.ceil((m // a) / b)

    def largest(a: int) -> int:
        return math.ceil(-(-m // a) / b)

    found: set[int] = set()
    for a in range(1, m):
        for tiles in (smallest, largest):
            before, after = tiles(a), tiles(a + 1)
            if any(before >= j + 1 and after <= j for j in range(1, most + 1)):
                found.update((a, a + 1))
    return {a for a in found if low <= a <= high}


def test_v4_a_corners_are_where_the_balanced_tiles_step_along_a() -> None:
    """`active_corners` = floor(M/(Bj+1)), +1, ceil(M/(Bj)), -1 (j <= 3) is exactly the set of A
    next to a step of the smallest or largest expert's tiles, at every 16-row EP1 row."""
    v4 = steps(1, 0, V4)
    checked = 0
    for n in range(1, 193):
        if v4.naive(n) or v4.config(n).block_m != 16:
            assert v4.active_corners(n) == []
            continue
        m = 8 * n
        want = brute_corners(m, 16, 8, min(128, m), v4.assignment_steps)
        assert set(v4.active_corners(n)) == want, n
        checked += 1
    assert checked > 150
    # N = 68 (M = 544): 3 tiles each at A = 16 (34 pairs), 2 at A = 17 (32): both are corners.
    assert {16, 17, 32, 33, 34, 11, 12} == set(v4.active_corners(68))


def test_v4_midpoints_only_where_every_expert_is_one_tile() -> None:
    v4 = steps(1, 0, V4)
    # N = 8: M = 64, every A >= 8 holds at most 4 pairs an expert: one 16-row tile, tiles = A.
    assert v4.active_corners(8) == []
    assert v4.active_points(8, [8, 16, 32, 64]) == [12, 24, 48]
    # N = 68: one tile an expert only from A = 34 (544 / 16): midpoints 49 (34..64) and 96.
    points = v4.active_points(68, [8, 16, 32, 64, 128])
    assert set(points) == {11, 12, 17, 33, 34, 49, 96}
    assert all(a * 16 >= 544 for a in set(points) - set(v4.active_corners(68)))


@pytest.mark.parametrize(("dp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_v4_only_adds_points_keeps_the_switches_and_leaves_ep2_as_v3(dp: int, rank: int) -> None:
    v2, v3, v4 = steps(dp, rank), steps(dp, rank, KERNEL_STEPS_RULE_V3), steps(dp, rank, V4)
    assert v2.switches_rule == v4.switches_rule  # the same segments: the lookup splits alike
    assert v3.row_steps(4096) == v4.row_steps(4096)
    p3, p4 = f2_plan(dp, rank, v3), f2_plan(dp, rank, v4)
    assert set(p3.points) <= set(p4.points)
    assert p3.sha256 != p4.sha256  # the rule is in the plan's inputs: a v3 checkpoint is refused
    record = p4.kernel_record()
    assert record is not None and record["rule"] == V4
    assert p4.inputs()["kernel_steps"]["rule"] == V4
    assert "active_rows" in record and "active_rows" not in (p3.kernel_record() or {})
    added = set(p4.points) - set(p3.points)
    if dp == 1:
        # Every added point is an EP1 row with 16-row tiles (sorted assignment), M = 8 N.
        assert len(added) == 377
        for p in added:
            assert p.is_expert and p.local_assignments == 8 * p.tokens
            assert v4.config(p.tokens).block_m == 16 and not v4.naive(p.tokens)
            axis = activated_axis(p4.geometry, p.tokens, 2.0)
            assert p.activated_experts in v4.active_points(p.tokens, axis)
    else:
        # EP2: M is its own axis (its corners at every planned (N, A) already): v3's points.
        assert added == set()


def test_v4_lands_on_the_eight_a_kind_errors_of_the_f2k_dp1_table() -> None:
    """The 8 between-bend errors above 5 % of modular f2k DP1 that lacked an A (docs/
    benchmarks.md, "Rule v3", third kind): v4 adds an A at each one's row between its measured
    A neighbours; (68, 16) is itself an A corner (3 tiles an expert, 2 at A = 17)."""
    v4 = steps(1, 0, V4)
    axis = [8, 16, 32, 64, 128]
    errors = {(8, 16): (8, 32), (8, 32): (16, 64), (16, 16): (8, 32), (16, 32): (16, 64)}
    errors |= {(17, 16): (8, 32), (17, 32): (16, 64), (49, 16): (8, 32), (68, 16): (8, 32)}
    for (n, a), (below, above) in errors.items():
        row = [x for x in axis if x <= 8 * n]
        lands = [x for x in v4.active_points(n, row) if below < x < above]
        assert lands, (n, a)
    assert 9 in v4.active_points(17, axis)  # 17 pairs at A = 8 (2 tiles), <= 16 from A = 9
    assert {13, 23} <= set(v4.active_points(49, axis))
    assert [a for (n, a) in errors if a in v4.active_corners(n)] == [16]


def test_the_loo_classes_count_v4s_a_corners_as_bends_and_v2_v3_as_before() -> None:
    """bench's `is_knot`: a v4 table's A corners are bends; for every point of the shipped f2k
    DP1 table the v2 and v3 classes are what they were (v4 differs only at its A corners)."""
    bundle = open_bundle(F2K["modular"])
    entry = next(e for e in bundle.entries if e.target.deployment == "dp1_ep1_rank0_sp0")
    assert kernel_steps(entry).rule == KERNEL_STEPS_RULE
    n, a, m, t = _positive(bundle, entry)
    v2, v3, v4 = steps(1), steps(1, 0, KERNEL_STEPS_RULE_V3), steps(1, 0, V4)
    knots = {rule.rule: np.zeros(len(n), dtype=bool) for rule in (v2, v3, v4)}
    for i in range(len(n)):
        p = PointError(int(n[i]), int(a[i]), int(m[i]), float(t[i]), 0.0)
        for rule in (v2, v3, v4):
            knots[rule.rule][i] = is_knot(p, rule)
    corner = np.array([int(a[i]) in v4.active_corners(int(n[i])) for i in range(len(n))])
    # Pinned: the counts the published v2 / v3 readings were made with.
    assert (int(knots[KERNEL_STEPS_RULE].sum()), int(knots[KERNEL_STEPS_RULE_V3].sum())) == (
        V2_KNOTS,
        V3_KNOTS,
    )
    assert np.array_equal(knots[V4], knots[KERNEL_STEPS_RULE_V3] | corner)
    assert (corner & ~knots[KERNEL_STEPS_RULE_V3]).sum() > 0
    assert is_knot(PointError(68, 16, 544, 1.0, 1.0), v4)
    assert not is_knot(PointError(68, 16, 544, 1.0, 1.0), v3)


@pytest.mark.parametrize(
    ("value", "rule", "points"),
    [("v3", KERNEL_STEPS_RULE_V3, (633, 1430, 1430)), ("v4", V4, (1010, 1430, 1430))],
)
def test_the_option_picks_v4_and_the_dry_run_counts(
    tmp_path: Path, value: str, rule: str, points: tuple[int, ...]
) -> None:
    """``--moe-kernel-steps v4`` at the f2k options (docs/h200-runs.md, "Rule v4")."""
    args = argv(tmp_path, "--moe-kernel-steps", value)
    _, plans = prepare(build_parser().parse_args(args), args)
    assert [p.kernel.rule for p in plans if p.kernel is not None] == [rule] * 3
    assert tuple(len(p.points) for p in plans) == points


def test_v4_refuses_a_configuration_it_does_not_model(tmp_path: Path) -> None:
    args = argv(tmp_path, "--hardware", "RTXPRO6000", "--moe-kernel-steps", "v4")
    with pytest.raises(OptionError) as caught:
        prepare(build_parser().parse_args(args), args)
    assert caught.value.field == "kernel_steps"


def test_v4_off_a_16_row_ep1_row_adds_nothing() -> None:
    v4: KernelSteps = steps(1, 0, V4)
    assert v4.config(300).block_m == 32 and v4.active_points(300, [8, 16, 32, 64, 128]) == []
    assert v4.naive(4) and v4.active_points(4, [8, 16, 32]) == []
    for rule in (steps(1), steps(1, 0, KERNEL_STEPS_RULE_V3)):
        assert rule.active_points(8, [8, 16, 32, 64]) == [] and rule.active_corners(68) == []
