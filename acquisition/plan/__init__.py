"""The point plan: coordinates from configuration and geometry only (design: plan owner)."""

from __future__ import annotations

from acquisition.plan.build import PlanPoint, PointPlan, build_plan
from acquisition.plan.experts import activated_axis, expert_points
from acquisition.plan.grid import geometric_points
from acquisition.plan.tokens import (
    CaptureSizes,
    CudagraphMode,
    TokenAxes,
    derived_capture_sizes,
    token_axes,
)

__all__ = [
    "CaptureSizes",
    "CudagraphMode",
    "PlanPoint",
    "PointPlan",
    "TokenAxes",
    "activated_axis",
    "build_plan",
    "derived_capture_sizes",
    "expert_points",
    "geometric_points",
    "token_axes",
]
