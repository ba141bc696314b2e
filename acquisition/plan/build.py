"""The point plan of one target, from configuration and geometry only (never latencies).

The plan is deterministic: the same inputs give the same points in the same order and the
same ``sha256``, which the contract records and resume checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.plan.experts import activated_axis, expert_points
from acquisition.plan.kernel import KernelSteps
from acquisition.plan.tokens import CaptureSizes, CudagraphMode, TokenAxes, token_axes
from moetables.bundle import EXPERTS
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PlanPoint", "PointPlan", "build_plan"]

PLAN_SCHEMA = "moe-point-plan-v1"


@dataclass(frozen=True, slots=True)
class PlanPoint:
    """One row of the future table; local components carry A = M = -1."""

    component: str
    tokens: int
    activated_experts: int = -1
    local_assignments: int = -1

    @property
    def key(self) -> str:
        """Stable identity in samples.jsonl and file names."""
        if self.component == EXPERTS:
            return (
                f"{self.component}:{self.tokens}:{self.activated_experts}:{self.local_assignments}"
            )
        return f"{self.component}:{self.tokens}"

    @property
    def is_expert(self) -> bool:
        return self.component == EXPERTS


@dataclass(frozen=True, slots=True)
class PointPlan:
    target: MoeTarget
    geometry: ExpertGeometry
    components: tuple[str, ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    factor: float
    mode: CudagraphMode
    captures: CaptureSizes
    axes: TokenAxes
    points: tuple[PlanPoint, ...]
    # The kernel-step rule (issue 20) and the expert rows it added beyond ``axes.expert_rows``.
    kernel: KernelSteps | None = None
    kernel_rows: tuple[int, ...] = ()
    kernel_points: int = 0

    @property
    def expert_map(self) -> list[int]:
        return linear_expert_map(self.geometry.global_experts, self.target.ep, self.target.rank)

    def inputs(self) -> dict[str, Any]:
        """What the plan was derived from (a plan without the kernel rule hashes as before)."""
        data: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "target": self.target.as_dict(),
            "global_experts": self.geometry.global_experts,
            "global_top_k": self.geometry.top_k,
            "local_experts": self.geometry.local_experts,
            "components": list(self.components),
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "factor": self.factor,
            "cudagraph_mode": self.mode.value,
            "captures": self.captures.as_dict(),
        }
        if self.kernel is not None:
            data["kernel_steps"] = self.kernel.as_dict()
        return data

    def kernel_record(self) -> dict[str, Any] | None:
        """The kernel-step rule and what it added, for the contract (None: rule off)."""
        if self.kernel is None:
            return None
        return {
            **self.kernel.as_dict(),
            "expert_rows_added": list(self.kernel_rows),
            "expert_points_added": self.kernel_points,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.inputs(),
            "axes": self.axes.as_dict(),
            "points": [
                [p.component, p.tokens, p.activated_experts, p.local_assignments]
                for p in self.points
            ],
        }

    @property
    def sha256(self) -> str:
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def count(self, component: str) -> int:
        return sum(1 for p in self.points if p.component == component)


def build_plan(
    target: MoeTarget,
    geometry: ExpertGeometry,
    components: Sequence[str],
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    factor: float,
    mode: CudagraphMode,
    captures: CaptureSizes,
    kernel: KernelSteps | None = None,
) -> PointPlan:
    """Local components on the local row axis, experts on gathered rows x A x M (R10-R13).

    ``kernel`` (issue 20) adds the expert rows on both sides of every switch of the expert
    kernel's configuration and the block-padding corners in M (`acquisition.plan.kernel`),
    inside and outside the capture range alike: they come from the kernel's configuration,
    not from the capture list (R13), and local components keep their own axis.
    """
    if EXPERTS not in components:
        raise ValueError("a plan needs the experts component")
    axes = token_axes(target, max_num_batched_tokens, factor, mode, captures)
    expert_rows = set(axes.expert_rows)
    kernel_rows: tuple[int, ...] = ()
    if kernel is not None:
        found = set(kernel.row_steps(axes.expert_maximum))
        # At EP1 M = N k: the block-padding corners are rows (for every A of the axis).
        found.update(
            kernel.row_corners(
                axes.expert_maximum, activated_axis(geometry, axes.expert_maximum, factor)
            )
        )
        kernel_rows = tuple(sorted(found - expert_rows))
        expert_rows.update(kernel_rows)
    points: list[PlanPoint] = []
    # Local components first: they are cheap and need no weight banks.
    for component in components:
        if component != EXPERTS:
            points.extend(PlanPoint(component, rows) for rows in axes.local_rows)
    experts = expert_points(geometry, sorted(expert_rows), factor, kernel)
    points.extend(PlanPoint(EXPERTS, n, a, m) for n, a, m in experts)
    kernel_points = 0
    if kernel is not None:
        kernel_points = len(experts) - len(expert_points(geometry, axes.expert_rows, factor))
    return PointPlan(
        target=target,
        geometry=geometry,
        components=tuple(components),
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        factor=factor,
        mode=mode,
        captures=captures,
        axes=axes,
        points=tuple(points),
        kernel=kernel,
        kernel_rows=kernel_rows,
        kernel_points=kernel_points,
    )
