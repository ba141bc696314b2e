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
# Batches take coordinates up to this size through array arithmetic (int64 products stay
# exact); larger ones, all refusals in practice, go through ``time`` one by one.
_BIG = 1 << 31
# Batches rank candidates by one float key built from integer A values below this width
# (exact while 3 * width**5 < 2**53); wider rows go through ``time`` one by one.
_MAX_WIDTH = 1024
# Queries between rows are scored this many at a time: the (point, query) arrays then stay
# small enough for the allocator to reuse, where larger ones cost page faults per operation.
_CHUNK = 1024
# The fast pass of a batch looks at this many points of each row on either side of A.
_NEAR = 2
# Batches this small go through ``time`` row by row (the same answers, less set-up).
_FEW = 8


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
        self._arrays = _RowArrays.build(self.grid, self.rows, geometry)

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
                f"{self.label}: N={tokens} A={active} M={pairs} is infeasible: "
                f"{g.infeasibility(tokens, active, pairs)} "
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
        """Every query at once, with ``time``'s answers and refusals row for row.

        The checks, the interpolation along a row and the choice between two rows are
        ``time``'s, written over arrays with the same floating-point expressions in the same
        order, so the values are bit-identical (a property test compares the two paths).
        """
        count = tokens.shape[0]
        values = np.full(count, np.nan)
        codes = np.full(count, OK, dtype=np.int8)
        if count <= _FEW or self._arrays is None:
            self._scalar(np.arange(count), tokens, active, pairs, values, codes)
            return values, codes
        g = self.geometry
        limit = min(_BIG, (1 << 62) // (g.top_k * g.local_experts))
        big = (
            (tokens > limit)
            | (tokens < -limit)
            | (active > limit)
            | (active < -limit)
            | (pairs > limit)
            | (pairs < -limit)
        )
        if big.any():
            self._scalar(np.flatnonzero(big), tokens, active, pairs, values, codes)
        n, a, m = tokens, active, pairs
        work = ~big
        invalid = (n < 1) | (a < 0) | (m < 0)
        codes[work & invalid] = INVALID
        work &= ~invalid
        remote = work & (a == 0) & (m == 0)
        if remote.any():
            rows = np.flatnonzero(remote)
            if self.remote is None:
                codes[rows] = OUT_OF_SUPPORT
            else:
                values[rows], codes[rows] = self.remote.batch(n[rows])
            work &= ~remote
        low = np.maximum(a, n * max(0, g.top_k - g.remote_experts))
        high = n * np.minimum(g.top_k, a)
        feasible = (a >= 1) & (a <= g.local_experts) & (low <= m) & (m <= high)
        codes[work & ~feasible] = INVALID
        work &= feasible
        balanced = -(-n * g.top_k * g.local_experts // g.global_experts)
        unbalanced = (m != balanced) | (a > np.minimum(g.local_experts, m)) | (m > n * a)
        codes[work & unbalanced] = OUT_OF_SUPPORT
        rows = np.flatnonzero(work & ~unbalanced)
        if rows.size:
            assert self._arrays is not None
            got, ok = self._arrays.measured(n[rows], a[rows])
            values[rows[ok]] = got[ok]
            codes[rows[~ok]] = OUT_OF_SUPPORT
        return values, codes

    def _scalar(
        self,
        rows: npt.NDArray[np.intp],
        tokens: npt.NDArray[np.int64],
        active: npt.NDArray[np.int64],
        pairs: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        codes: npt.NDArray[np.int8],
    ) -> None:
        for i in rows.tolist():
            try:
                values[i] = self.time(int(tokens[i]), int(active[i]), int(pairs[i]))
            except QueryError:
                codes[i] = INVALID
            except CoverageError:
                codes[i] = OUT_OF_SUPPORT


class _RowArrays:
    """The measured rows as flat padded arrays, for ``BalancedExpertSurface.batch``.

    Row r (the r-th measured N) holds its A values ascending at ``act[r*cols + j]`` for
    j < ``length[r]``, NaN after them, and their times at the same places in ``times``; one
    more NaN at ``none`` stands for "no point". ``below[r*(width+1) + x]`` counts the A values
    of row r below the integer x (0 <= x <= width); ``index[r*width + x]`` is where A = x sits
    in row r, or -1.
    """

    def __init__(
        self,
        grid: npt.NDArray[np.int64],
        act: npt.NDArray[np.float64],
        times: npt.NDArray[np.float64],
        length: npt.NDArray[np.int64],
        width: int,
    ) -> None:
        rows, cols = act.shape
        self.grid = grid
        self.cols = cols
        self.width = width
        self.length = length
        self.none = rows * cols
        self.act = np.append(act.ravel(), np.nan)
        self.times = np.append(times.ravel(), np.nan)
        index = np.full((rows, width), -1, dtype=np.int64)
        below = np.zeros((rows, width + 1), dtype=np.int64)
        for r in range(rows):
            values = act[r, : length[r]].astype(np.int64)
            index[r, values] = np.arange(length[r])
            below[r] = np.searchsorted(values, np.arange(width + 1), side="left")
        self.index = index.ravel()
        self.below = below.ravel()
        self.unit = 3.0 * width**3  # a key divided by this, floored, is its spread

    @classmethod
    def build(
        cls,
        grid: list[int],
        rows: dict[int, list[tuple[int, float]]],
        geometry: ExpertGeometry,
    ) -> _RowArrays | None:
        """None when a batch must go row by row: no rows, or A values unfit for the keys."""
        if not grid:
            return None
        values = [a for n in grid for a, _ in rows[n]]
        width = max(max(values), geometry.local_experts) + 1
        if min(values) < 0 or width > _MAX_WIDTH:
            return None
        if any(len({a for a, _ in rows[n]}) != len(rows[n]) for n in grid):
            return None  # a repeated A on one row: leave its arithmetic to ``time``
        cols = max(2, max(len(rows[n]) for n in grid))
        act = np.full((len(grid), cols), np.nan)
        times = np.full((len(grid), cols), np.nan)
        for r, n in enumerate(grid):
            act[r, : len(rows[n])] = [a for a, _ in rows[n]]
            times[r, : len(rows[n])] = [t for _, t in rows[n]]
        length = np.array([len(rows[n]) for n in grid], dtype=np.int64)
        return cls(np.array(grid, dtype=np.int64), act, times, length, width)

    def measured(
        self, tokens: npt.NDArray[np.int64], active: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Balanced feasible queries: ``time``'s value where measured support holds it."""
        grid = self.grid
        values = np.full(tokens.shape[0], np.nan)
        ok = np.zeros(tokens.shape[0], dtype=bool)
        slot = np.searchsorted(grid, tokens)
        inside = (tokens >= grid[0]) & (tokens <= grid[-1])
        on_row = inside & (grid[np.minimum(slot, len(grid) - 1)] == tokens)
        rows = np.flatnonzero(on_row)
        if rows.size:
            values[rows], ok[rows] = self._along_row(slot[rows], active[rows])
        between = np.flatnonzero(inside & ~on_row)
        for begin in range(0, between.size, _CHUNK):
            rows = between[begin : begin + _CHUNK]
            values[rows], ok[rows] = self._between_rows(tokens[rows], active[rows], slot[rows])
        return values, ok

    def _between_rows(
        self,
        tokens: npt.NDArray[np.int64],
        active: npt.NDArray[np.int64],
        high: npt.NDArray[np.intp],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Queries strictly between measured rows ``high - 1`` and ``high``."""
        grid = self.grid
        low = high - 1
        f = (tokens - grid[low]) / (grid[high] - grid[low])
        # First only the points of each row nearest A: a segment from low point a spans at
        # least |a - A|, a triangle with apex c at least |c - A|, so when the best candidate
        # among them spans less than the nearest point left out, nothing left out can win.
        lo_at, lo_bound = self._nearest(low, active)
        hi_at, hi_bound = self._nearest(high, active)
        values, ok, spread = self._between(low, high, f, active, lo_at, hi_at)
        bound = np.minimum(lo_bound, hi_bound)
        rest = np.flatnonzero((spread >= bound) & np.isfinite(bound))
        if rest.size:  # every point of both rows
            span = np.arange(self.cols)[:, None]
            low, high = low[rest], high[rest]
            values[rest], ok[rest], _ = self._between(
                low, high, f[rest], active[rest], low * self.cols + span, high * self.cols + span
            )
        return values, ok

    def _nearest(
        self, row: npt.NDArray[np.intp], active: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
        """Where the ``2 * _NEAR`` points of each row around A are (``none`` past the row's
        ends), points x queries; and how far from A the nearest point left out is (inf: none)."""
        cols = self.cols
        length = self.length[row]
        at = self.below[row * (self.width + 1) + active]  # bisect_left of A in the row
        step = np.arange(-_NEAR, _NEAR)[:, None]
        j = at + step
        inside = (j >= 0) & (j < length)
        points = np.where(inside, row * cols + j, self.none)
        x = active.astype(np.float64)
        bound = np.full(x.shape, np.inf)
        below_j, above_j = at - _NEAR - 1, at + _NEAR
        has = below_j >= 0
        bound[has] = x[has] - self.act[(row * cols + below_j)[has]]
        has = above_j < length
        bound[has] = np.minimum(bound[has], self.act[(row * cols + above_j)[has]] - x[has])
        return points, bound

    def _along_row(
        self, row: npt.NDArray[np.intp], active: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """``_row_time``: linear over raw A along one measured N row."""
        act, times, cols = self.act, self.times, self.cols
        x = active.astype(np.float64)
        base = row * cols
        ok = (act[base] <= x) & (x <= act[base + self.length[row] - 1])
        # bisect_left over the row; 0 only where A is the row's first value (exact below)
        i = self.below[row * (self.width + 1) + np.clip(active, 0, self.width)]
        i = base + np.clip(i, 1, cols - 1)
        a0, a1, t0, t1 = act[i - 1], act[i], times[i - 1], times[i]
        with np.errstate(invalid="ignore", divide="ignore"):
            values = t0 + (t1 - t0) * (x - a0) / (a1 - a0)
        values = np.where(a1 == x, t1, np.where(a0 == x, t0, values))
        values[~ok] = np.nan
        return values, ok

    def _between(
        self,
        low: npt.NDArray[np.intp],
        high: npt.NDArray[np.intp],
        f: npt.NDArray[np.float64],
        active: npt.NDArray[np.int64],
        lo_at: npt.NDArray[np.intp],
        hi_at: npt.NDArray[np.intp],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """``BalancedExpertSurface._between`` for many queries (row ``low`` below, ``high``
        above, ``f`` of the way up), over the points ``lo_at`` and ``hi_at`` (points x queries,
        flat places in ``act``): segments start at those low points, triangles have their
        apex at them. Returns the values, whether found, and the winners' spreads (inf: none).

        Each family of candidates ``_between`` can accept is scored over (point, query) at
        once: segments, and triangles on either side with the adjacent pair bracketing the
        blend (the pair just below the bisection point, or the one starting at it when the
        blend lands on a measured A within eps). The smallest score per family, then over
        families, wins; only winners are valued.
        """
        act, times, width, cols = self.act, self.times, self.width, self.cols
        count = f.shape[0]
        rows = np.arange(count)
        x = active.astype(np.float64)
        one_f = 1 - f
        lo_act, hi_act = act.take(lo_at), act.take(hi_at)
        best_keys: list[npt.NDArray[np.float64]] = []
        best_values: list[npt.NDArray[np.float64]] = []
        with np.errstate(invalid="ignore", divide="ignore"):
            # Segments: one partner per low point a, where (1-f)*a + f*b = A.
            partner = np.rint((x - one_f * lo_act) / f)
            usable = (partner >= 0) & (partner < width)  # False on NaN
            where = self.index.take(high * width + np.where(usable, partner, 0).astype(np.intp))
            usable &= where >= 0
            usable &= np.abs(one_f * lo_act + f * partner - x) <= _EPS
            key = np.where(
                usable, _key(np.abs(partner - lo_act), 0.0, 0.0, lo_act, partner, width), np.inf
            )
            col = key.argmin(axis=0)
            best_keys.append(key[col, rows])
            a_t = times.take(lo_at[col, rows])
            b_t = times.take(high * cols + np.maximum(where[col, rows], 0))
            best_values.append(one_f * a_t + f * b_t)
            # Triangles: an adjacent pair on one row, an apex c on the other.
            for side, own, c_act, c_at, mass in (
                (0, low, hi_act, hi_at, one_f),
                (1, high, lo_act, lo_at, f),
            ):
                rest = 1 - mass
                effective = (x - rest * c_act) / mass
                start = np.ceil(effective - _EPS)
                start = np.where(start > 0, np.minimum(start, width), 0).astype(np.intp)  # NaN: 0
                first = self.below.take(own * (width + 1) + start)  # bisect_left(eff - eps)
                last = self.length[own] - 2
                base = own * cols
                real = c_act == c_act  # not NaN
                # The pair just below the bisection point brackets the blend wherever a pair
                # does; the pair starting at it does too only where the blend lands on a
                # measured A (within eps), which few entries do.
                k = first - 1
                usable = (k >= 0) & (k <= last) & real
                at = base + np.minimum(np.maximum(k, 0), cols - 2)
                a_act, b_act = act.take(at), act.take(at + 1)
                usable &= (a_act - _EPS <= effective) & (effective <= b_act + _EPS)
                key = self._pair_keys(usable, a_act, b_act, c_act, side)
                families = [(key, at)]
                at_hit = base + np.minimum(first, cols - 2)
                a_hit = act.take(at_hit)
                hit = np.flatnonzero((first <= last) & real & (a_hit - _EPS <= effective))
                if hit.size:
                    b_hit = act.take(at_hit.ravel()[hit] + 1)
                    e_hit = effective.ravel()[hit]
                    a_hit = a_hit.ravel()[hit]
                    hit_key = np.full(key.shape, np.inf)
                    hit_key.ravel()[hit] = self._pair_keys(
                        e_hit <= b_hit + _EPS, a_hit, b_hit, c_act.ravel()[hit], side
                    )
                    families.append((hit_key, at_hit))
                for key, at in families:
                    col = key.argmin(axis=0)
                    best_keys.append(key[col, rows])
                    pair = at[col, rows]
                    e = effective[col, rows]
                    a0, b0 = act.take(pair), act.take(pair + 1)
                    mix = np.minimum(1.0, np.maximum(0.0, (e - a0) / (b0 - a0)))
                    best_values.append(
                        mass * ((1 - mix) * times.take(pair) + mix * times.take(pair + 1))
                        + rest * times.take(c_at[col, rows])
                    )
        keys = np.stack(best_keys)
        family = keys.argmin(axis=0)
        best = keys[family, rows]
        found = np.isfinite(best)
        values = np.stack(best_values)[family, rows]
        values[~found] = np.nan
        return values, found, np.floor(best / self.unit)

    def _pair_keys(
        self,
        usable: npt.NDArray[np.bool_],
        a_act: npt.NDArray[np.float64],
        b_act: npt.NDArray[np.float64],
        c_act: npt.NDArray[np.float64],
        side: int,
    ) -> npt.NDArray[np.float64]:
        """Triangle scores (spread, pair width, side, a, c); infinite where not usable."""
        # a <= b on a row, so the spread of {a, b, c} is max(b, c) - min(a, c).
        spread = np.maximum(b_act, c_act) - np.minimum(a_act, c_act)
        key = _key(spread, b_act - a_act, side + 1.0, a_act, c_act, self.width)
        return np.where(usable, key, np.inf)


def _key(
    spread: npt.NDArray[np.float64],
    width_of_pair: npt.NDArray[np.float64] | float,
    side: float,
    a_act: npt.NDArray[np.float64],
    other: npt.NDArray[np.float64],
    width: int,
) -> npt.NDArray[np.float64]:
    """``_between``'s score tuple as one number: (spread, pair width, side + 1, a, other),
    each an integer below ``width`` (side + 1 below 3), compared in that order."""
    key: npt.NDArray[np.float64] = (
        ((spread * width + width_of_pair) * 3 + side) * width + a_act
    ) * width + other
    return key
