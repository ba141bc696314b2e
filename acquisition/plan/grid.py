"""Geometric grids: the rounded powers of the grid factor inside a range, plus its endpoints."""

from __future__ import annotations

import math

__all__ = ["MINIMUM_FACTOR", "geometric_points"]

# Below this a grid over a few thousand rows has hundreds of points: a typo, not a plan.
MINIMUM_FACTOR = 1.05


def geometric_points(low: int, high: int, factor: float) -> list[int]:
    """Rounded ``factor**i`` that fall in ``[low, high]``, with ``low`` and ``high`` themselves.

    Every axis is anchored at 1, so the same factor puts the same interior points on token,
    activated-expert and assignment axes whatever their ranges (R10, R11): neighbouring rows
    of a table share coordinates, which keeps the lookup's triangulation regular.
    """
    if low < 0 or high < low:
        raise ValueError(f"bad grid range [{low}, {high}]")
    if not factor >= MINIMUM_FACTOR:
        raise ValueError(f"grid factor must be at least {MINIMUM_FACTOR}, got {factor}")
    points = {low, high}
    exponent = 0
    while True:
        value = math.floor(factor**exponent + 0.5)
        if value > high:
            break
        if value >= low:
            points.add(value)
        exponent += 1
    return sorted(points)
