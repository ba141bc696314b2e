"""Which measured rows an expert answer is made of: vertices and weights, for people to inspect.

`DeploymentTables.time_us` gives the number; this module says where it came from, reading the
same loaded surfaces (it never builds a second triangulation), so the dashboard's lookup
playground shows exactly the simplex the lookup used. The time returned is always the lookup's
own answer; the vertices are its explanation.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from moetables.bundle import EXPERTS, ComponentTable
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.segments import SegmentedExpertSurface
from moetables.lookup.surface import ExpertSurface
from moetables.lookup.tables import DeploymentTables

__all__ = ["Explanation", "Vertex", "explain_expert"]


@dataclass(frozen=True, slots=True)
class Vertex:
    tokens: int
    activated_experts: int
    local_assignments: int
    time_us: float
    weight: float


@dataclass(frozen=True, slots=True)
class Explanation:
    time_us: float
    vertices: tuple[Vertex, ...]
    rule: str


def _bracket(xs: list[int], ts: list[float], x: int) -> list[tuple[int, float, float]]:
    """(x_i, t_i, weight) of the one or two measured points a 1-D interpolation used."""
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return [(xs[i], ts[i], 1.0)]
    lo, hi = xs[i - 1], xs[i]
    f = (x - lo) / (hi - lo)
    return [(lo, ts[i - 1], 1.0 - f), (hi, ts[i], f)]


def explain_expert(
    tables: DeploymentTables,
    table: ComponentTable,
    tokens: int,
    activated_experts: int,
    local_assignments: int,
    mode: str = "eager",
) -> Explanation:
    """The answer to one experts query and the measured rows behind it.

    Raises QueryError or CoverageError exactly as ``tables.time_us`` does. ``table`` is the
    deployment's loaded rows (``moetables.bundle.load_table``), in file order.
    """
    n, a, m = tokens, activated_experts, local_assignments
    value = tables.time_us(EXPERTS, n, a, m, mode=mode)
    rows = table.select(EXPERTS, mode)
    tok = table.tokens[rows]
    act = table.activated_experts[rows]
    prs = table.local_assignments[rows]
    times = table.time_us[rows]
    remote = (act == 0) & (prs == 0)
    exact = np.flatnonzero((tok == n) & (act == a) & (prs == m))
    if exact.size:
        return Explanation(value, (Vertex(n, a, m, float(times[exact[0]]), 1.0),), "measured row")
    if a == 0 and m == 0:
        order = np.argsort(tok[remote], kind="stable")
        xs = [int(v) for v in tok[remote][order]]
        ts = [float(v) for v in times[remote][order]]
        used = _bracket(xs, ts, n)
        return Explanation(
            value,
            tuple(Vertex(x, 0, 0, t, w) for x, t, w in used),
            "linear interpolation over N along the all-remote (A=M=0) curve",
        )
    surface = tables._experts[(EXPERTS, mode)]
    positive = ~remote
    p_tok, p_act, p_prs = tok[positive], act[positive], prs[positive]
    if isinstance(surface, BalancedExpertSurface):
        if n in surface.rows:
            row = surface.rows[n]
            used = _bracket([r[0] for r in row], [r[1] for r in row], a)
            return Explanation(
                value,
                tuple(Vertex(n, x, m, t, w) for x, t, w in used),
                "historical balanced table: linear interpolation over A on a measured N row",
            )
        i = bisect.bisect_left(surface.grid, n)
        lo, hi = surface.grid[i - 1], surface.grid[i]
        return Explanation(
            value,
            (),
            f"historical balanced table: between measured rows N={lo} and N={hi}, the "
            "publisher's smallest-A-spread segment or triangle (its vertices are not exposed)",
        )
    rule_note = ""
    if isinstance(surface, SegmentedExpertSurface):
        # A kernel-step table: the query's own kernel segment's surface answered it.
        segment = surface.segment(n)
        if segment.surface is None:
            return Explanation(value, (), f"kernel segment {segment.span}: no measured point")
        p_tok, p_act, p_prs = p_tok[segment.rows], p_act[segment.rows], p_prs[segment.rows]
        rule_note = f" on kernel segment {segment.span} ({segment.kernel})"
        surface = segment.surface
    assert isinstance(surface, ExpertSurface)
    if surface._locator is not None:
        if surface.coordinates == "log":
            x = (math.log(n), math.log(a), math.log(m))
        else:
            x = (float(n), float(a), float(m))
        c = [x[j] - surface._mean_py[j] for j in range(3)]
        if surface._full:
            y: tuple[float, ...] = tuple(c)
        else:
            y = tuple(sum(r[j] * c[j] for j in range(3)) for r in surface._basis_py)
        located = surface._locator.locate_one(y)
        if located is not None:
            vertices = tuple(
                Vertex(int(p_tok[v]), int(p_act[v]), int(p_prs[v]), float(surface._times[v]), w)
                for v, w in zip(located[0], located[1], strict=True)
                if w > 0.0
            )
            rule = (
                f"affine interpolation over a {surface.dimension}-D simplex "
                f"({surface.coordinates} coordinates){rule_note}"
            )
            return Explanation(value, vertices, rule)
    return Explanation(value, (), f"interpolation along the measured line{rule_note}")
