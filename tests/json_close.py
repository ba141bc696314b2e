"""Comparing recomputed evidence with its committed JSON.

Evidence tests recompute a committed report from its raw file. The numbers are the same up to
the last bits of a float: numpy's BLAS and reductions sum in an order that depends on the CPU's
vector width, so a report written on one machine differs from another's in the 16th digit.
"""

from __future__ import annotations

import pytest


def json_close(a: object, b: object, *, rel: float = 1e-12) -> bool:
    """Equal structure, equal ints and strings, floats equal to `rel` (and 1e-15 absolute)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_close(a[k], b[k], rel=rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            json_close(x, y, rel=rel) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and a == pytest.approx(b, rel=rel, abs=1e-15)
        )
    return a == b
