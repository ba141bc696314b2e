"""Token axes of one target: local rows for gate/finalization, gathered rows for the experts.

The axes prefer the target's serving capture sizes G, each mapped through
``target.token_domains((G,) * DP)`` (R12). Which geometric points a capture list replaces
depends on the CUDA graph mode of the serving deployment; capture sizes never decide A or M
(R13), and endpoints stay whether or not they are captures.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from acquisition.plan.grid import geometric_points

if TYPE_CHECKING:
    from collections.abc import Sequence

    from moetables.geometry import MoeTarget

__all__ = [
    "CaptureSizes",
    "CudagraphMode",
    "TokenAxes",
    "derived_capture_sizes",
    "token_axes",
]


class CudagraphMode(StrEnum):
    """vLLM's ``compilation_config.cudagraph_mode`` of the serving deployment."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


# Modes whose graphs cover mixed and prefill steps up to the capture cap.
_COVERING = {CudagraphMode.PIECEWISE, CudagraphMode.FULL, CudagraphMode.FULL_AND_PIECEWISE}


@dataclass(frozen=True, slots=True)
class CaptureSizes:
    """Serving capture sizes G and where they came from (``target_option`` or ``derived``)."""

    sizes: tuple[int, ...]
    source: str
    rule: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"sizes": list(self.sizes), "source": self.source}
        if self.rule:
            data["rule"] = self.rule
        return data


def derived_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> CaptureSizes:
    """vLLM's default capture list when the target names none, labelled as derived (R13).

    [1, 2, 4] + range(8, 256, 8) + range(256, cap + 1, 16) with cap = min(2 * max_num_seqs,
    512), clipped to the token budget.
    """
    cap = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)]
    return CaptureSizes(
        sizes=tuple(sorted({s for s in sizes if s <= cap})),
        source="derived",
        rule="vllm default: [1,2,4]+range(8,256,8)+range(256,cap+1,16), "
        "cap=min(2*max_num_seqs,512,max_num_batched_tokens)",
    )


@dataclass(frozen=True, slots=True)
class TokenAxes:
    """Row counts to measure, and the capture sizes as this target sees them."""

    local_rows: tuple[int, ...]
    expert_rows: tuple[int, ...]
    local_budget: int
    expert_maximum: int
    capture_local_rows: tuple[int, ...]
    capture_expert_rows: tuple[int, ...]
    transition_local_rows: int | None
    transition_expert_rows: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "local_rows": list(self.local_rows),
            "expert_rows": list(self.expert_rows),
            "local_budget": self.local_budget,
            "expert_maximum": self.expert_maximum,
            "capture_tokens": {
                "local_rows": list(self.capture_local_rows),
                "expert_rows": list(self.capture_expert_rows),
            },
            "transition": {
                "local_rows": self.transition_local_rows,
                "expert_rows": self.transition_expert_rows,
            },
        }


def _replace_interior(geometric: Sequence[int], captures: set[int], extra: set[int]) -> set[int]:
    """Captures replace the geometric points strictly inside the range they cover."""
    low, high = min(captures), max(captures)
    kept = {p for p in geometric if p <= low or p >= high}
    return kept | captures | extra


def token_axes(
    target: MoeTarget,
    max_num_batched_tokens: int,
    factor: float,
    mode: CudagraphMode,
    captures: CaptureSizes,
) -> TokenAxes:
    """Local and gathered row axes of ``target`` under the seed's capture rules (R10, R12).

    - NONE: the full geometric ranges (nothing replays a graph).
    - FULL_DECODE_ONLY: the full geometric ranges, plus the captures (decode replays them,
      prefill and mixed steps run eagerly at any size).
    - FULL, PIECEWISE, FULL_AND_PIECEWISE at DP1: captures replace interior geometric points
      in the range they cover; beyond the cap, geometric points and the transition endpoint
      (the first eager size, cap + 1).
    - With DP, one peer outside the captures cancels replay for all, so peers keep their
      local geometric range and the possibly unequal gathered range; captures are added.
    """
    if max_num_batched_tokens < 1:
        raise ValueError("max_num_batched_tokens must be positive")
    budget = target.token_domains((max_num_batched_tokens,) * target.dp)
    local_geo = geometric_points(1, budget.local_rows, factor)
    expert_geo = geometric_points(1, budget.expert_rows, factor)
    sizes = sorted({g for g in captures.sizes if 1 <= g <= max_num_batched_tokens})
    local_cap = {target.token_domains((g,) * target.dp).local_rows for g in sizes}
    expert_cap = {target.token_domains((g,) * target.dp).expert_rows for g in sizes}
    transition_local: int | None = None
    transition_expert: int | None = None
    if sizes and sizes[-1] < max_num_batched_tokens:
        after = target.token_domains((sizes[-1] + 1,) * target.dp)
        transition_local, transition_expert = after.local_rows, after.expert_rows
    if mode is CudagraphMode.NONE or not sizes:
        local, expert = set(local_geo), set(expert_geo)
        local_cap, expert_cap = set(), set()
        transition_local = transition_expert = None
    elif mode is CudagraphMode.FULL_DECODE_ONLY:
        local, expert = set(local_geo) | local_cap, set(expert_geo) | expert_cap
        transition_local = transition_expert = None
    elif mode in _COVERING and target.dp == 1:
        local_extra = {transition_local} if transition_local else set()
        expert_extra = {transition_expert} if transition_expert else set()
        local = _replace_interior(local_geo, local_cap, local_extra)
        expert = _replace_interior(expert_geo, expert_cap, expert_extra)
    else:
        local = set(local_geo) | local_cap | ({transition_local} if transition_local else set())
        expert = (
            set(expert_geo) | expert_cap | ({transition_expert} if transition_expert else set())
        )
    # Endpoints always stay (R12), and nothing outside the budget is measurable.
    local |= {1, budget.local_rows}
    expert |= {1, budget.expert_rows}
    return TokenAxes(
        local_rows=tuple(sorted(r for r in local if 1 <= r <= budget.local_rows)),
        expert_rows=tuple(sorted(r for r in expert if 1 <= r <= budget.expert_rows)),
        local_budget=budget.local_rows,
        expert_maximum=budget.expert_rows,
        capture_local_rows=tuple(sorted(local_cap)),
        capture_expert_rows=tuple(sorted(expert_cap)),
        transition_local_rows=transition_local,
        transition_expert_rows=transition_expert,
    )
