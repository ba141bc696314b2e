"""The point plan: geometric grids, capture rules, feasible corners, determinism (R5, R10-R13)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from acquisition.plan import (
    CaptureSizes,
    CudagraphMode,
    PointPlan,
    activated_axis,
    build_plan,
    derived_capture_sizes,
    expert_points,
    geometric_points,
    token_axes,
)
from moetables.geometry import ExpertGeometry, MoeTarget

NO_CAPTURES = CaptureSizes((), "target_option")
POWERS = CaptureSizes((1, 2, 4, 8, 16, 32, 64, 128, 256), "target_option")


def plan_for(
    target: MoeTarget,
    experts: int = 128,
    top_k: int = 8,
    *,
    budget: int = 2048,
    factor: float = 2.0,
    mode: CudagraphMode = CudagraphMode.NONE,
    captures: CaptureSizes = NO_CAPTURES,
) -> PointPlan:
    geometry = ExpertGeometry.for_target(experts, top_k, target)
    components = (
        ("gate_routing", "experts", "finalize_copy")
        if target.dp > 1
        else ("gate_routing", "experts")
    )
    return build_plan(
        target,
        geometry,
        components,
        max_num_batched_tokens=budget,
        max_num_seqs=128,
        factor=factor,
        mode=mode,
        captures=captures,
    )


def test_geometric_points_keep_both_endpoints() -> None:
    assert geometric_points(1, 100, 2) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert geometric_points(5, 5, 2) == [5]
    assert geometric_points(3, 12, 2) == [3, 4, 8, 12]


def test_a_root_two_factor_reproduces_the_published_llmservingsim_token_axis() -> None:
    # tokens of shared/data's RTXPRO6000 tables: 1, 2, 3, 4, 6, 8, 11, ..., 2896, 4096
    axis = geometric_points(1, 4096, math.sqrt(2))
    assert axis[:12] == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64]
    assert axis[-4:] == [1448, 2048, 2896, 4096]


def test_local_and_expert_rows_reach_their_budgets() -> None:
    # R10: local rows up to the local budget, expert rows up to the gathered maximum.
    plan = plan_for(MoeTarget.for_rank(1, 2, 0))
    assert plan.axes.local_budget == 2048 and plan.axes.expert_maximum == 4096
    local = [p.tokens for p in plan.points if p.component == "gate_routing"]
    experts = {p.tokens for p in plan.points if p.is_expert}
    assert max(local) == 2048 and max(experts) == 4096
    assert [p.tokens for p in plan.points if p.component == "finalize_copy"] == local


def test_sequence_parallel_rounding_raises_the_physical_bound() -> None:
    target = MoeTarget.for_rank(2, 2, 0, sequence_parallel=True)
    axes = token_axes(target, 2049, 2.0, CudagraphMode.NONE, NO_CAPTURES)
    assert axes.local_budget == 1025  # ceil(2049 / 2)
    assert axes.expert_maximum == 2 * 2 * 1025  # TP * sum over DP of ceil(n / TP)


def test_covering_modes_replace_interior_points_with_captures_at_dp1() -> None:
    captures = CaptureSizes((1, 2, 4, 8, 16, 24, 32, 48, 64), "target_option")
    axes = token_axes(
        MoeTarget.for_rank(1, 1, 0), 256, 2.0, CudagraphMode.FULL_AND_PIECEWISE, captures
    )
    # Inside [1, 64] only captures; past the cap the transition 65 and geometric points.
    assert axes.local_rows == (1, 2, 4, 8, 16, 24, 32, 48, 64, 65, 128, 256)
    assert axes.transition_local_rows == 65
    assert axes.expert_rows == axes.local_rows


def test_none_keeps_the_full_geometric_range_and_no_captures() -> None:
    axes = token_axes(
        MoeTarget.for_rank(1, 1, 0),
        256,
        2.0,
        CudagraphMode.NONE,
        CaptureSizes((24, 48), "target_option"),
    )
    assert axes.local_rows == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert axes.capture_local_rows == ()


def test_full_decode_only_keeps_the_geometric_range_and_adds_captures() -> None:
    axes = token_axes(
        MoeTarget.for_rank(1, 1, 0),
        64,
        2.0,
        CudagraphMode.FULL_DECODE_ONLY,
        CaptureSizes((24,), "target_option"),
    )
    assert axes.local_rows == (1, 2, 4, 8, 16, 24, 32, 64)


def test_dp_peers_keep_their_geometric_range_and_gathered_captures_are_added() -> None:
    captures = CaptureSizes((1, 2, 4, 8, 24), "target_option")
    axes = token_axes(MoeTarget.for_rank(1, 2, 1), 64, 2.0, CudagraphMode.FULL, captures)
    assert set(geometric_points(1, 64, 2.0)) <= set(axes.local_rows)
    assert set(geometric_points(1, 128, 2.0)) <= set(axes.expert_rows)
    assert 24 in axes.local_rows and 48 in axes.expert_rows  # G=24 gathered over DP2
    assert axes.capture_expert_rows == (2, 4, 8, 16, 48)


def test_derived_captures_follow_vllm_and_say_so() -> None:
    derived = derived_capture_sizes(max_num_seqs=128, max_num_batched_tokens=2048)
    assert derived.source == "derived" and derived.rule
    assert derived.sizes[:5] == (1, 2, 4, 8, 16) and derived.sizes[-1] == 256
    assert derived_capture_sizes(128, 100).sizes[-1] <= 100


def test_captures_never_decide_a_or_m() -> None:
    # R13: the expert points at a token count do not depend on where the tokens came from.
    target = MoeTarget.for_rank(1, 2, 0)
    with_captures = plan_for(target, budget=64, mode=CudagraphMode.FULL, captures=POWERS)
    without = plan_for(target, budget=64)
    for n in (2, 8, 64):
        assert {
            (p.activated_experts, p.local_assignments)
            for p in with_captures.points
            if p.is_expert and p.tokens == n
        } == {
            (p.activated_experts, p.local_assignments)
            for p in without.points
            if p.is_expert and p.tokens == n
        }


def test_ep1_collapses_the_assignment_axis() -> None:
    # R5: at EP1 every choice is local, M = N*k, and A starts at k.
    plan = plan_for(MoeTarget.for_rank(1, 1, 0))
    experts = [p for p in plan.points if p.is_expert]
    assert all(p.local_assignments == p.tokens * 8 for p in experts)
    assert min(p.activated_experts for p in experts) == 8
    assert not any(p.activated_experts == 0 for p in experts)


def test_corners_balanced_total_and_all_remote_are_planned() -> None:
    geometry = ExpertGeometry(global_experts=128, top_k=8, local_experts=64)
    points = set(expert_points(geometry, [16], 2.0))
    n, k = 16, 8
    assert (n, 0, 0) in points  # all-remote: 64 remote experts hold top-8
    assert (n, 1, 1) in points and (n, 1, n) in points  # A=1 endpoints of M
    assert (n, k, k) in points and (n, k, n * k) in points  # slope change of the upper bound
    assert (n, 64, 64) in points and (n, 64, n * k) in points  # A = L endpoints
    balanced = geometry.balanced_total(n)
    assert {a for (nn, a, m) in points if m == balanced} >= {
        a for a in activated_axis(geometry, n, 2.0) if geometry.feasible(n, a, balanced)
    }


def test_the_lower_bound_corner_appears_when_remote_experts_are_few() -> None:
    # E=8, k=6, L=4: c = k - (E - L) = 2, so M >= max(A, 2N) and A = 2N is a corner.
    geometry = ExpertGeometry(global_experts=8, top_k=6, local_experts=4)
    assert activated_axis(geometry, 2, 2.0) == [2, 4]  # A from c=2; corner 2N=4 = L
    points = expert_points(geometry, [1, 2], 2.0)
    assert (1, 2, 2) in points and (2, 4, 4) in points
    assert not any(a == 0 for _, a, _ in points)  # 4 remote experts cannot hold 6 choices


@given(
    experts=st.integers(1, 64),
    top_k=st.integers(1, 8),
    ep=st.integers(1, 8),
    budget=st.integers(1, 300),
    factor=st.sampled_from([1.5, 2.0, 3.0]),
    data=st.data(),
)
def test_every_planned_point_is_feasible(
    experts: int, top_k: int, ep: int, budget: int, factor: float, data: st.DataObject
) -> None:
    top_k = min(top_k, experts)
    ep = min(ep, experts)
    dp = data.draw(st.sampled_from([d for d in range(1, ep + 1) if ep % d == 0]))
    target = MoeTarget.for_rank(ep // dp, dp, data.draw(st.integers(0, ep - 1)))
    plan = plan_for(target, experts, top_k, budget=budget, factor=factor)
    geometry = plan.geometry
    assert all(
        geometry.feasible(p.tokens, p.activated_experts, p.local_assignments)
        for p in plan.points
        if p.is_expert
    )
    assert all(p.activated_experts == -1 for p in plan.points if not p.is_expert)
    assert len({p.key for p in plan.points}) == len(plan.points)


def test_the_plan_is_deterministic_and_hashed() -> None:
    target = MoeTarget.for_rank(1, 2, 1)
    first = plan_for(target, mode=CudagraphMode.FULL_AND_PIECEWISE, captures=POWERS)
    second = plan_for(target, mode=CudagraphMode.FULL_AND_PIECEWISE, captures=POWERS)
    assert first.points == second.points and first.sha256 == second.sha256
    assert plan_for(target, factor=3.0).sha256 != plan_for(target).sha256
    assert plan_for(MoeTarget.for_rank(1, 2, 0)).sha256 != plan_for(target).sha256
