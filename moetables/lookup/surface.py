"""Current expert tables: an affine triangulation of the measured N/A/M points (R40).

Built once per deployment. Positive-work points are triangulated after removing dependent
dimensions (EP1's M = N*k leaves a plane), in raw coordinates by default; the all-remote points
(A=M=0) lie off that surface and form their own curve over N. A query returns the stored time at
a measured point, a convex combination of at most four measured vertices inside the hull, and an
error outside it: no nearest neighbour, fit or extrapolation.

Why raw coordinates: chosen by leave-one-out error on every real table (docs/benchmarks.md,
"Triangulation coordinates"): expert time is close to piecewise linear in the rows and the
weights it reads, which raw barycentric weights reproduce and log ones bend.
``coordinates="log"`` keeps the other choice (the feasible region's product bounds are planes
in log space, and geometric grids give even log spacing), for tables where it does better.
"""

from __future__ import annotations

import copy
import functools
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import numpy.typing as npt

from moetables.errors import CoverageError, QueryError
from moetables.geometry import ExpertGeometry
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.locate import HintMap, SimplexLocator, Snap

__all__ = ["Coordinates", "ExpertSurface", "feasibility_codes"]

Coordinates = Literal["log", "raw"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Relative size below which a singular value marks a dependent direction of the point cloud.
_RANK_TOL = 1e-9
# Components of a reduced basis vector below this are rounding left by the SVD, set to zero.
_BASIS_ZERO = 1e-12


def canonical_basis(vt: FloatArray) -> FloatArray:
    """The SVD's right singular vectors made the same on every CPU.

    LAPACK returns each vector up to its sign, and which sign (and the last bits of components
    that should be zero) depends on the BLAS kernel the CPU selects: measured on one table, an
    AVX-512 kernel returned (-0.124, 2e-16, -0.992) where an AVX2 one returned (0.124, 0, 0.992).
    Mirroring the reduced points moves them against the triangulation's fixed perturbation, so
    Delaunay broke the grid's ties differently (13 simplices against 15) and lookups moved by up
    to 0.5 %. Zeroing the rounding and making each vector's largest component positive (the
    first of equal ones) gives one basis, so one triangulation and one answer, on any machine."""
    out = np.where(np.abs(vt) < _BASIS_ZERO, 0.0, vt)
    for row in out:
        lead = int(np.argmax(np.abs(row)))
        if row[lead] < 0:
            row *= -1.0
    return out


# Batches at least this large are split over a thread per core.
_PARALLEL_ROWS = 1 << 17
# Largest stored coordinate for which per-axis tables of stored values are kept (keys hold
# 21 bits a coordinate anyway).
_OCCURS_LIMIT = 1 << 21


@functools.cache
def _pool_size() -> int:
    return max(
        1,
        min(
            8,
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1,
        ),
    )


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_pool_size(), thread_name_prefix="moetables")


def _key(tokens: IntArray, active: IntArray, pairs: IntArray) -> IntArray:
    # Measured coordinates stay far below 2**21 each, so three fit one int64 key.
    return (tokens << 42) | (active << 21) | pairs


def feasibility_codes(
    g: ExpertGeometry, tokens: IntArray, active: IntArray, pairs: IntArray
) -> npt.NDArray[np.int8]:
    """Per row: INVALID where no routing gives (N, A, M) (A = M = 0 needs N >= 1 and an
    all-remote choice), else OK."""
    codes = np.full(tokens.shape[0], OK, dtype=np.int8)
    remote = (active == 0) & (pairs == 0)
    low = np.maximum(active, tokens * max(0, g.top_k - g.remote_experts))
    high = tokens * np.minimum(g.top_k, active)
    feasible = (tokens >= 1) & (active >= 1) & (active <= g.local_experts)
    feasible &= (pairs >= low) & (pairs <= high)
    codes[~(feasible | (remote & (tokens >= 1) & g.all_remote_possible))] = INVALID
    return codes


class ExpertSurface:
    """Measured expert times of one deployment and mode, answered exactly or by triangulation."""

    def __init__(
        self,
        tokens: IntArray,
        active: IntArray,
        pairs: IntArray,
        times: FloatArray,
        geometry: ExpertGeometry,
        *,
        label: str,
        coordinates: Coordinates = "raw",
    ) -> None:
        self.geometry = geometry
        self.label = label
        self._log = coordinates == "log"
        self._local_experts = geometry.local_experts
        self._top_k = geometry.top_k
        self._floor_per_token = max(0, geometry.top_k - geometry.remote_experts)
        self.coordinates: Coordinates = coordinates
        self._exact = {
            (int(n), int(a), int(m)): float(t)
            for n, a, m, t in zip(tokens, active, pairs, times, strict=True)
        }
        keys = _key(tokens, active, pairs)
        order = np.argsort(keys)
        self._keys = keys[order]
        self._key_times = times[order]
        self._rows = (tokens, active, pairs, order)  # for `with_values`
        self._limit = int(max(tokens.max(), active.max(), pairs.max())) + 1
        # Per axis, which values occur among the stored rows: most queries fail one of these
        # three table reads and skip the exact-key search (tables stay small: values are rows).
        self._stored_values = (
            [self._occurs(column) for column in (tokens, active, pairs)]
            if self._limit <= _OCCURS_LIMIT
            else None
        )
        remote = (active == 0) & (pairs == 0)
        self.remote: LocalCurve | None = (
            LocalCurve(tokens[remote], times[remote], f"{label} all-remote (A=M=0)")
            if remote.any()
            else None
        )
        positive = ~remote
        self.support = (
            (int(tokens[positive].min()), int(tokens[positive].max())) if positive.any() else (0, 0)
        )
        self._times = times[positive]
        self._times_py: list[float] = self._times.tolist()
        points = self._transform(
            tokens[positive].astype(np.float64),
            active[positive].astype(np.float64),
            pairs[positive].astype(np.float64),
        )
        self._mean = points.mean(axis=0) if len(points) else np.zeros(3)
        centred = points - self._mean
        if len(points) > 1:
            _, sv, vt = np.linalg.svd(centred, full_matrices=False)
            rank = int(np.sum(sv > _RANK_TOL * max(sv[0], 1e-300)))
            # Full rank: nothing to remove, keep the measured axes as they are.
            vt = np.eye(3) if rank == 3 else canonical_basis(vt)
        else:
            vt, rank = np.eye(3), 0
        self._basis: FloatArray = vt[:rank]
        self._scale = float(np.abs(centred).max()) if len(points) else 1.0
        reduced = centred @ self._basis.T
        self.dimension = rank
        self._full = rank == 3
        self._mean_py = [float(v) for v in self._mean]
        self._basis_py = [[float(v) for v in row] for row in self._basis]
        hint = self._assignment_position_hint() if self._full else None
        self._locator = (
            SimplexLocator(
                reduced, hint_map=hint, snap=self._integer_snap() if self._full else None
            )
            if rank >= 2
            else None
        )
        if self._locator is not None:
            # The time at each corner of each simplex, one row per corner, for batch answers.
            self._corner_times = np.ascontiguousarray(self._times[self._locator.simplices].T)
        self._order1: IntArray | None = None
        if rank == 1:
            order1 = np.argsort(reduced[:, 0], kind="stable")
            self._order1 = order1
            self._line_x = reduced[order1, 0]
            self._line_t = self._times[order1]

    def with_values(self, values: FloatArray, *, label: str) -> ExpertSurface:
        """The same points with other values (one per row, in the rows' order), sharing this
        surface's triangulation and locator: interpolated as this surface would interpolate
        a table of them, for a fraction of the build (issue 18's tile surfaces)."""
        tokens, active, pairs, order = self._rows
        if values.shape != tokens.shape:
            raise ValueError(f"{label}: {values.shape[0]} values for {tokens.shape[0]} rows")
        other = copy.copy(self)
        other.label = label
        other._exact = {
            (int(n), int(a), int(m)): float(t)
            for n, a, m, t in zip(tokens, active, pairs, values, strict=True)
        }
        other._key_times = values[order]
        remote = (active == 0) & (pairs == 0)
        other.remote = (
            LocalCurve(tokens[remote], values[remote], f"{label} all-remote (A=M=0)")
            if remote.any()
            else None
        )
        other._times = values[~remote]
        other._times_py = other._times.tolist()
        if self._locator is not None:
            other._corner_times = np.ascontiguousarray(other._times[self._locator.simplices].T)
        if self._order1 is not None:
            other._line_t = other._times[self._order1]
        return other

    def _occurs(self, column: IntArray) -> npt.NDArray[np.bool_]:
        table = np.zeros(self._limit, dtype=bool)
        table[column[column >= 0]] = True
        return table

    def _integer_snap(self) -> Snap:
        """Queries come at integer N, A, M: move sample points onto the nearest of those."""
        mean = self._mean_py
        log = self.coordinates == "log"

        def snap(y: Sequence[FloatArray]) -> list[FloatArray]:
            out = []
            for axis, column in enumerate(y):
                x = column + mean[axis]
                if log:
                    with np.errstate(over="ignore"):
                        x = np.exp(x)
                x = np.maximum(np.rint(x), 1.0)
                if log:
                    x = np.log(x)
                out.append(x - mean[axis])
            return out

        return snap

    def _assignment_position_hint(self) -> HintMap:
        """Lay the cell grid over (N, A, t), t the position of M between its bounds at N, A.

        The feasible region is a box in these coordinates (M's range grows with N and A,
        t's does not), so cells follow it. Hint coordinates are the centred N and A (a
        shift of an axis moves no cell boundary relative to the vertices) and t; in log
        coordinates t is the position of log M between the logs of its bounds. Only the
        order in which candidates are tried depends on this, never an answer.
        """
        mean = self._mean
        g = self.geometry
        log = self.coordinates == "log"
        k = float(g.top_k)
        floor_per_token = float(max(0, g.top_k - g.remote_experts))
        if log:
            k = math.log(k)
            floor_per_token = math.log(floor_per_token) if floor_per_token > 0 else -math.inf
        # (In raw coordinates a floor of 0 is no floor: low is A itself.)

        def bounds(tokens: FloatArray, active: FloatArray) -> tuple[FloatArray, FloatArray]:
            if log:
                low = np.maximum(active, tokens + floor_per_token)
                return low, np.minimum(active, k) + tokens
            low = np.maximum(active, tokens * floor_per_token) if floor_per_token else active
            return low, np.minimum(active, k) * tokens

        def forward(y: Sequence[FloatArray]) -> list[FloatArray]:
            low, high = bounds(y[0] + mean[0], y[1] + mean[1])
            high -= low
            position = y[2] + mean[2]
            position -= low
            np.divide(position, high, out=position, where=high > 0.0)
            return [y[0], y[1], position]

        def inverse(h: Sequence[FloatArray]) -> list[FloatArray]:
            low, high = bounds(h[0] + mean[0], h[1] + mean[1])
            return [h[0], h[1], low + h[2] * (high - low) - mean[2]]

        mean0, mean1, mean2 = self._mean_py

        def forward_one(y: Sequence[float]) -> Sequence[float]:
            tokens, active = y[0] + mean0, y[1] + mean1
            if log:
                low, high = max(active, tokens + floor_per_token), min(active, k) + tokens
            else:
                low = max(active, tokens * floor_per_token) if floor_per_token else active
                high = min(active, k) * tokens
            high -= low
            position = y[2] + mean2 - low
            return (y[0], y[1], position / high if high > 0.0 else position)

        return forward, inverse, forward_one

    def _transform(self, n: FloatArray, a: FloatArray, m: FloatArray) -> FloatArray:
        if self.coordinates == "log":
            with np.errstate(divide="ignore"):
                return np.stack([np.log(n), np.log(a), np.log(m)], axis=-1)
        return np.stack([n, a, m], axis=-1)

    # -- batch --------------------------------------------------------------------------

    def batch(
        self, tokens: IntArray, active: IntArray, pairs: IntArray
    ) -> tuple[FloatArray, npt.NDArray[np.int8]]:
        """Times (NaN where refused) and per-row codes: OK, OUT_OF_SUPPORT or INVALID."""
        count = tokens.shape[0]
        values = np.full(count, np.nan)
        codes = feasibility_codes(self.geometry, tokens, active, pairs)
        remote = (active == 0) & (pairs == 0)

        if remote.any():
            rows = np.flatnonzero(remote & (codes == OK))
            if self.remote is None:
                codes[rows] = OUT_OF_SUPPORT
            else:
                values[rows], codes[rows] = self.remote.batch(tokens[rows])

        rows = np.flatnonzero(~remote & (codes == OK))
        if rows.size == 0:
            return values, codes
        if rows.size == count:  # the common case: every row to answer, no copies
            n, a, m = tokens, active, pairs
        else:
            n, a, m = tokens[rows], active[rows], pairs[rows]
        # Stored rows first, verbatim: only rows whose three values all occur in the table
        # can be one, so only those are looked up among the stored keys.
        if self._stored_values is not None:
            occurs_n, occurs_a, occurs_m = self._stored_values
            maybe = occurs_n.take(n, mode="clip")
            maybe &= occurs_a.take(a, mode="clip")
            maybe &= occurs_m.take(m, mode="clip")
            look = np.flatnonzero(maybe)
        else:
            look = np.arange(len(n))
        if look.size:
            ln, la, lm = n[look], a[look], m[look]
            measurable = (ln < self._limit) & (la < self._limit) & (lm < self._limit)
            keys = _key(
                np.where(measurable, ln, 0),
                np.where(measurable, la, 0),
                np.where(measurable, lm, 0),
            )
            slot = np.clip(np.searchsorted(self._keys, keys), 0, len(self._keys) - 1)
            exact = measurable & (self._keys[slot] == keys)
            hit = look[exact]
            values[rows[hit]] = self._key_times[slot[exact]]
            if hit.size:
                rest = np.ones(len(n), dtype=bool)
                rest[hit] = False
                rows, n, a, m = rows[rest], n[rest], a[rest], m[rest]
                if rows.size == 0:
                    return values, codes
        got, ok = self._interpolate(
            n.astype(np.float64), a.astype(np.float64), m.astype(np.float64)
        )
        values[rows[ok]] = got[ok]
        codes[rows[~ok]] = OUT_OF_SUPPORT
        return values, codes

    def _interpolate(
        self, n: FloatArray, a: FloatArray, m: FloatArray
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        workers = _pool_size()
        if workers > 1 and len(n) >= _PARALLEL_ROWS:
            # numpy and scipy's point location release the GIL: large batches use every core.
            bounds = np.linspace(0, len(n), workers + 1).astype(int)
            parts = list(
                _pool().map(
                    lambda i: self._interpolate_chunk(
                        n[bounds[i] : bounds[i + 1]],
                        a[bounds[i] : bounds[i + 1]],
                        m[bounds[i] : bounds[i + 1]],
                    ),
                    range(workers),
                )
            )
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        return self._interpolate_chunk(n, a, m)

    def _interpolate_chunk(
        self, n: FloatArray, a: FloatArray, m: FloatArray
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        # Centred coordinates, one array per axis, in the arithmetic ``_interpolate_one``
        # does for one query, so that both reach the same simplex and number.
        centred = [self._column(x) - self._mean_py[axis] for axis, x in enumerate((n, a, m))]
        if self._full and self._locator is not None:
            return self._locator.interpolate(centred, self._corner_times)
        c0, c1, c2 = centred
        reduced = [row[0] * c0 + row[1] * c1 + row[2] * c2 for row in self._basis_py]
        # A query off the measured affine subspace (EP1's M = N*k plane, or an axis the
        # plan held fixed) has no enclosing simplex.
        residual = np.zeros(len(n))
        for j in range(3):
            back = reduced[0] * self._basis_py[0][j]
            for i in range(1, len(reduced)):
                back += reduced[i] * self._basis_py[i][j]
            np.maximum(residual, np.abs(centred[j] - back), out=residual)
        on_plane = ~(residual > 1e-9 * max(self._scale, 1.0))
        values = np.full(len(n), np.nan)
        ok = np.zeros(len(n), dtype=bool)
        if self._locator is not None:
            got, inside = self._locator.interpolate(reduced, self._corner_times)
            ok = on_plane & inside
            values[ok] = got[ok]
        elif self.dimension == 1:
            x = reduced[0]
            ok = on_plane & (x >= self._line_x[0]) & (x <= self._line_x[-1])
            values[ok] = np.interp(x[ok], self._line_x, self._line_t)
        return values, ok

    def _column(self, x: FloatArray) -> FloatArray:
        if self._log:
            with np.errstate(divide="ignore"):
                return np.log(x)
        return x

    # -- one query ----------------------------------------------------------------------

    def time(self, tokens: int, active: int, pairs: int) -> float:
        """One query; raises QueryError (infeasible) or CoverageError (outside support)."""
        g = self.geometry
        if active == 0 and pairs == 0:
            if tokens < 1 or not g.all_remote_possible:
                raise QueryError(
                    f"{self.label}: A=M=0 needs N >= 1 and E-L >= k "
                    f"(E={g.global_experts} L={g.local_experts} k={g.top_k})"
                )
            if self.remote is None:
                raise CoverageError(f"{self.label}: this table has no all-remote (A=M=0) rows")
            return self.remote.time(tokens)
        # ExpertGeometry.feasible for A, M not both 0, inlined: this runs once a query.
        if not (
            tokens >= 1
            and 1 <= active <= self._local_experts
            and max(active, tokens * self._floor_per_token)
            <= pairs
            <= tokens * min(self._top_k, active)
        ):
            low, high = g.assignment_bounds(tokens, active) if tokens >= 1 else (0, 0)
            raise QueryError(
                f"{self.label}: N={tokens} A={active} M={pairs} is infeasible: "
                f"{g.infeasibility(tokens, active, pairs)} "
                f"(need 1 <= A <= {g.local_experts} and {low} <= M <= {high})"
            )
        exact = self._exact.get((tokens, active, pairs))
        if exact is not None:
            return exact
        value = (
            self._interpolate_one(tokens, active, pairs)
            if self._locator is not None
            else self._interpolate_line(tokens, active, pairs)
        )
        if value is None:
            raise CoverageError(self.outside_message(tokens, active, pairs))
        return value

    def outside_message(self, tokens: int, active: int, pairs: int) -> str:
        """The refusal of a feasible point (A, M not both 0) that no simplex holds."""
        return (
            f"{self.label}: N={tokens} A={active} M={pairs} is outside the measured support "
            f"(tokens {self.support[0]}..{self.support[1]}); no extrapolation"
        )

    def _interpolate_line(self, n: int, a: int, m: int) -> float | None:
        values, ok = self._interpolate(
            np.array([n], dtype=np.float64),
            np.array([a], dtype=np.float64),
            np.array([m], dtype=np.float64),
        )
        return float(values[0]) if ok[0] else None

    def _interpolate_one(self, n: int, a: int, m: int) -> float | None:
        locator = self._locator
        assert locator is not None
        mean0, mean1, mean2 = self._mean_py
        if self._log:
            c0, c1, c2 = math.log(n) - mean0, math.log(a) - mean1, math.log(m) - mean2
        else:
            c0, c1, c2 = n - mean0, a - mean1, m - mean2
        if self._full:
            located = locator.locate_one_3d(c0, c1, c2)
            if located is None:
                return None
            # Summed corner by corner, as ExpertSurface.batch sums: the same number.
            (v0, v1, v2, v3), (w0, w1, w2, w3) = located
            times = self._times_py
            return w0 * times[v0] + w1 * times[v1] + w2 * times[v2] + w3 * times[v3]
        basis = self._basis_py
        y = tuple(row[0] * c0 + row[1] * c1 + row[2] * c2 for row in basis)
        back = [sum(y[i] * basis[i][j] for i in range(len(y))) for j in range(3)]
        c = (c0, c1, c2)
        if max(abs(c[j] - back[j]) for j in range(3)) > 1e-9 * max(self._scale, 1.0):
            return None
        located = locator.locate_one(y)
        if located is None:
            return None
        # Summed corner by corner from 0.0, as ExpertSurface.batch sums: the same number.
        vertices, weights = located
        times = self._times_py
        value = 0.0
        for i, v in enumerate(vertices):
            value += weights[i] * times[v]
        return value
