"""Activated-expert (A) and local-assignment (M) axes of the expert component (R5, R11).

For N gathered rows of a rank with L local of E global experts and top-k k, positive work
lives in max(A, N*c) <= M <= N*min(k, A) with c = max(0, k - (E - L)). Both axes are
geometric; the polygon's vertices (range endpoints and the two slope changes, A = N*c and
A = k), every per-A endpoint of M and the balanced total ceil(N*k*L/E) are added wherever
feasible. A = M = 0 is its own point when remote experts can hold all k choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acquisition.plan.grid import geometric_points

if TYPE_CHECKING:
    from collections.abc import Iterable

    from acquisition.plan.kernel import KernelSteps
    from moetables.geometry import ExpertGeometry

__all__ = ["activated_axis", "expert_points"]


def activated_axis(geometry: ExpertGeometry, tokens: int, factor: float) -> list[int]:
    """Feasible positive A values at N = ``tokens``: geometric, endpoints and slope changes."""
    k = geometry.top_k
    c = max(0, k - geometry.remote_experts)
    low = max(1, c)
    high = min(geometry.local_experts, tokens * k)
    if low > high:
        return []
    axis = set(geometric_points(low, high, factor))
    # Where the lower bound of M stops being N*c, and where the upper bound stops growing.
    axis |= {a for a in (tokens * c, k) if low <= a <= high}
    return sorted(axis)


def _assignment_axis(
    geometry: ExpertGeometry,
    tokens: int,
    active: int,
    factor: float,
    kernel: KernelSteps | None = None,
) -> Iterable[int]:
    low, high = geometry.assignment_bounds(tokens, active)
    values = set(geometric_points(low, high, factor))
    balanced = geometry.balanced_total(tokens)
    if low <= balanced <= high:
        values.add(balanced)
    if kernel is not None:
        values.update(kernel.assignment_corners(tokens, active, low, high))
    return sorted(values)


def expert_points(
    geometry: ExpertGeometry,
    tokens: Iterable[int],
    factor: float,
    kernel: KernelSteps | None = None,
) -> list[tuple[int, int, int]]:
    """Every (N, A, M) of the plan, sorted; each satisfies ``geometry.feasible``.

    With ``kernel``, each (N, A) also gets the block-padding corners in M of the kernel's
    configuration at N (`KernelSteps.assignment_corners`), and under rule v4 an EP1 row with
    16-row tiles gets the A values where its tiles bend along A (`KernelSteps.active_points`).
    """
    points: set[tuple[int, int, int]] = set()
    for n in tokens:
        axis = activated_axis(geometry, n, factor)
        if kernel is not None:
            axis = sorted({*axis, *kernel.active_points(n, axis)})
        for a in axis:
            points.update((n, a, m) for m in _assignment_axis(geometry, n, a, factor, kernel))
        if geometry.all_remote_possible:
            points.add((n, 0, 0))
    infeasible = [p for p in points if not geometry.feasible(*p)]
    if infeasible:
        # The axes above are derived from the same bounds; this guards the derivation.
        raise AssertionError(f"planned infeasible expert points {sorted(infeasible)[:5]}")
    return sorted(points)
