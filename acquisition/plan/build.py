"""The point plan of one target, from configuration and geometry only (never latencies).

The plan is deterministic: the same inputs give the same points in the same order and the
same ``sha256``, which the contract records and resume checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.plan.experts import expert_points
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

    @property
    def expert_map(self) -> list[int]:
        return linear_expert_map(self.geometry.global_experts, self.target.ep, self.target.rank)

    def inputs(self) -> dict[str, Any]:
        """What the plan was derived from."""
        return {
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
) -> PointPlan:
    """Local components on the local row axis, experts on gathered rows x A x M (R10-R13)."""
    if EXPERTS not in components:
        raise ValueError("a plan needs the experts component")
    axes = token_axes(target, max_num_batched_tokens, factor, mode, captures)
    points: list[PlanPoint] = []
    # Local components first: they are cheap and need no weight banks.
    for component in components:
        if component != EXPERTS:
            points.extend(PlanPoint(component, rows) for rows in axes.local_rows)
    points.extend(
        PlanPoint(EXPERTS, n, a, m) for n, a, m in expert_points(geometry, axes.expert_rows, factor)
    )
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
    )
