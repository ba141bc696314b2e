"""Historical balanced-total expert tables, read the way their publisher's simulator read them.

These tables (LLMServingSim, ``moe-components-v1``) store one M per N: the balanced total
ceil(N*k*L/E). Their reader answered only balanced queries, interpolated linearly over raw A on
a measured N row, and between two N rows chose among segments and triangles of measured points
by the smallest A spread (R42). Giving the same answers and the same refusals keeps simulations
comparable across both readers.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from moetables.errors import CoverageError, QueryError
from moetables.geometry import ExpertGeometry
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve

__all__ = ["BalancedExpertSurface"]

_EPS = 1e-9


def _row_time(row: Sequence[tuple[int, float]], active: float, label: str) -> float:
    """Linear interpolation over raw A along one measured N row."""
    values = [a for a, _ in row]
    low, high = values[0], values[-1]
    if not low <= active <= high:
        raise CoverageError(
            f"{label}: activated_experts {active:g} is outside measured [{low}, {high}]"
        )
    i = bisect.bisect_left(values, active)
    if values[i] == active:
        return row[i][1]
    (a0, t0), (a1, t1) = row[i - 1], row[i]
    return t0 + (t1 - t0) * (active - a0) / (a1 - a0)


class BalancedExpertSurface:
    """Expert rows of one historical deployment and mode."""

    def __init__(
        self,
        tokens: npt.NDArray[np.int64],
        active: npt.NDArray[np.int64],
        pairs: npt.NDArray[np.int64],
        times: npt.NDArray[np.float64],
        geometry: ExpertGeometry,
        *,
        label: str,
    ) -> None:
        self.geometry = geometry
        self.label = label
        remote = (active == 0) & (pairs == 0)
        self.remote = (
            LocalCurve(tokens[remote], times[remote], f"{label} all-remote (A=M=0)")
            if remote.any()
            else None
        )
        rows: dict[int, list[tuple[int, float]]] = {}
        for n, a, t in zip(tokens[~remote], active[~remote], times[~remote], strict=True):
            rows.setdefault(int(n), []).append((int(a), float(t)))
        self.rows = {n: sorted(r) for n, r in rows.items()}
        self.grid = sorted(self.rows)

    def time(self, tokens: int, active: int, pairs: int) -> float:
        g = self.geometry
        if tokens < 1 or active < 0 or pairs < 0:
            raise QueryError(f"{self.label}: invalid expert query N={tokens} A={active} M={pairs}")
        if active == 0 and pairs == 0:
            if self.remote is None:
                raise CoverageError(
                    f"{self.label}: this deployment has no all-remote routing support"
                )
            return self.remote.time(tokens)
        if not g.feasible(tokens, active, pairs):
            low, high = g.assignment_bounds(tokens, active)
            raise QueryError(
                f"{self.label}: N={tokens} A={active} M={pairs} is infeasible "
                f"(need 1 <= A <= {g.local_experts} and {low} <= M <= {high})"
            )
        balanced = g.balanced_total(tokens)
        if (
            pairs != balanced
            or not 1 <= active <= min(g.local_experts, pairs)
            or pairs > tokens * active
        ):
            raise CoverageError(
                f"{self.label}: this historical table covers balanced assignment totals only "
                f"(M = ceil(N*k*L/E) = {balanced} at N={tokens}); got M={pairs}"
            )
        if tokens in self.rows:
            return _row_time(self.rows[tokens], active, self.label)
        if not self.grid or tokens < self.grid[0] or tokens > self.grid[-1]:
            raise CoverageError(
                f"{self.label}: tokens {tokens} is outside the measured range "
                f"[{self.grid[0] if self.grid else '-'}, {self.grid[-1] if self.grid else '-'}]"
            )
        i = bisect.bisect_left(self.grid, tokens)
        lo, hi = self.grid[i - 1], self.grid[i]
        value = self._between(self.rows[lo], self.rows[hi], (tokens - lo) / (hi - lo), active)
        if value is None:
            raise CoverageError(
                f"{self.label}: N={tokens} A={active} M={pairs} is outside the measured feasible support"
            )
        return value

    @staticmethod
    def _between(
        low: list[tuple[int, float]], high: list[tuple[int, float]], f: float, active: int
    ) -> float | None:
        """Best segment or triangle of measured points enclosing (N, A) between two rows.

        Candidates and their ranking are the publisher's: segments joining one point of each
        row whose blend at f is A; triangles of an adjacent A pair on one row and a point on
        the other; the smallest A spread wins, then segments, then the narrower pair, then the
        low row, then smaller A. Only candidates that can pass the acceptance tests are
        enumerated (one partner per point for segments, the bracketing pairs for triangles).
        """
        best: tuple[tuple[float, ...], float] | None = None
        high_index = {a: i for i, (a, _) in enumerate(high)}
        for a_act, a_t in low:
            # (1-f)*a + f*b = A has one real solution b; measured A values are integers.
            partner = round((active - (1 - f) * a_act) / f) if f > 0 else None
            hit = high_index.get(partner) if partner is not None else None
            if hit is None:
                continue
            b_act, b_t = high[hit]
            if abs((1 - f) * a_act + f * b_act - active) <= _EPS:
                score: tuple[float, ...] = (abs(b_act - a_act), 0, -1, a_act, b_act)
                if best is None or score < best[0]:
                    best = (score, (1 - f) * a_t + f * b_t)
        for side, (own, other) in enumerate(((low, high), (high, low))):
            mass = 1 - f if side == 0 else f
            values = [a for a, _ in own]
            # A lies between c and the pair's blend, so a triangle's spread is at least
            # |c - A|: visit c nearest first and stop once no triangle can beat the best.
            for c_act, c_t in sorted(other, key=lambda p: abs(p[0] - active)):
                if best is not None and abs(c_act - active) > best[0][0]:
                    break
                effective = (active - (1 - mass) * c_act) / mass
                first = max(0, bisect.bisect_left(values, effective - _EPS) - 1)
                last = min(len(own) - 2, bisect.bisect_right(values, effective + _EPS))
                for k in range(first, last + 1):
                    (a_act, a_t), (b_act, b_t) = own[k], own[k + 1]
                    if not a_act - _EPS <= effective <= b_act + _EPS:
                        continue
                    mix = min(1.0, max(0.0, (effective - a_act) / (b_act - a_act)))
                    spread = max(a_act, b_act, c_act) - min(a_act, b_act, c_act)
                    score = (spread, b_act - a_act, side, a_act, c_act)
                    if best is None or score < best[0]:
                        best = (score, mass * ((1 - mix) * a_t + mix * b_t) + (1 - mass) * c_t)
        return None if best is None else best[1]

    def batch(
        self,
        tokens: npt.NDArray[np.int64],
        active: npt.NDArray[np.int64],
        pairs: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8]]:
        values = np.full(tokens.shape[0], np.nan)
        codes = np.full(tokens.shape[0], OK, dtype=np.int8)
        for i, (n, a, m) in enumerate(
            zip(tokens.tolist(), active.tolist(), pairs.tolist(), strict=True)
        ):
            try:
                values[i] = self.time(n, a, m)
            except QueryError:
                codes[i] = INVALID
            except CoverageError:
                codes[i] = OUT_OF_SUPPORT
        return values, codes
