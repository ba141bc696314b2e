"""The stored statistic and the stability control (R16, R18)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ControlResult", "median_of_context_medians", "pooled_median", "stability_control"]

QUALITY_TOLERANCE = 0.03


def median_of_context_medians(contexts: Sequence[Sequence[float]]) -> float:
    """The stored time: median over independent contexts of each context's forward median."""
    if not contexts or any(not c for c in contexts):
        raise ValueError("every context needs at least one forward")
    return float(statistics.median(statistics.median(c) for c in contexts))


def pooled_median(contexts: Sequence[Sequence[float]]) -> float:
    """Median of every forward of every context taken together."""
    pooled = [t for c in contexts for t in c]
    if not pooled:
        raise ValueError("no forwards")
    return float(statistics.median(pooled))


@dataclass(frozen=True, slots=True)
class ControlResult:
    """The published (2B) value beside its B control.

    ``relative_change`` compares the pooled medians of the arms, relative to the control.
    """

    selected_us: float
    control_us: float
    selected_pooled_us: float
    control_pooled_us: float
    relative_change: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.relative_change <= self.tolerance


def stability_control(
    selected: Sequence[Sequence[float]],
    control: Sequence[Sequence[float]],
    tolerance: float = QUALITY_TOLERANCE,
) -> ControlResult:
    """The 3% pooled-median check between the 2B (``selected``) and B (``control``) arms."""
    selected_pooled = pooled_median(selected)
    control_pooled = pooled_median(control)
    change = abs(selected_pooled - control_pooled) / control_pooled
    return ControlResult(
        selected_us=median_of_context_medians(selected),
        control_us=median_of_context_medians(control),
        selected_pooled_us=selected_pooled,
        control_pooled_us=control_pooled,
        relative_change=change,
        tolerance=tolerance,
    )
