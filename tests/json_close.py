"""Comparing recomputed evidence with its committed JSON.

Evidence tests recompute a committed report from its raw file. The numbers are the same up to
the last bits of a float: numpy's BLAS and reductions sum in an order that depends on the CPU's
vector width, so a report written on one machine differs from another's in the 16th digit.
A difference of two such numbers (an interpolated tile count less a whole one, an excess time)
keeps their absolute error, not their relative one: it can be 1e-7 with an error of 1e-12 in its
last kept digits, hence the absolute floor. Both limits are far below anything measured (the
tables' times resolve 0.001 us).
"""

from __future__ import annotations

import pytest


def json_close(a: object, b: object, *, rel: float = 1e-12, absolute: float = 1e-9) -> bool:
    """Equal structure, equal ints and strings, floats equal to `rel` or to `absolute`."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(
            json_close(a[k], b[k], rel=rel, absolute=absolute) for k in a
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            json_close(x, y, rel=rel, absolute=absolute) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and a == pytest.approx(b, rel=rel, abs=absolute)
        )
    return a == b
