"""Current expert tables: an affine triangulation of the measured N/A/M points (R40).

Built once per deployment. Positive-work points are triangulated in log coordinates after
removing dependent dimensions (EP1's M = N*k leaves a plane); the all-remote points (A=M=0) lie
off that surface and form their own curve over N. A query returns the stored time at a measured
point, a convex combination of at most four measured vertices inside the hull, and an error
outside it: no nearest neighbour, fit or extrapolation.

Why log coordinates: the feasible region's bounds are products (M <= N*A, M <= N*k, M >= A),
which are planes in log space and curved in raw space, so log simplices follow the region's
faces; and measured grids are geometric, so log spacing gives well-shaped simplices. The
leave-one-out errors of both choices are in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import numpy.typing as npt

from moetables.errors import CoverageError, QueryError
from moetables.geometry import ExpertGeometry
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.locate import HintMap, SimplexLocator

__all__ = ["Coordinates", "ExpertSurface"]

Coordinates = Literal["log", "raw"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Relative size below which a singular value marks a dependent direction of the point cloud.
_RANK_TOL = 1e-9


# Batches at least this large are split over a thread per core.
_PARALLEL_ROWS = 1 << 17


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
        self.coordinates: Coordinates = coordinates
        self._exact = {
            (int(n), int(a), int(m)): float(t)
            for n, a, m, t in zip(tokens, active, pairs, times, strict=True)
        }
        keys = _key(tokens, active, pairs)
        order = np.argsort(keys)
        self._keys = keys[order]
        self._key_times = times[order]
        self._limit = int(max(tokens.max(), active.max(), pairs.max())) + 1
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
        self._times_py = self._times.tolist()
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
            if rank == 3:
                vt = np.eye(3)  # nothing to remove: keep the measured axes as they are
        else:
            vt, rank = np.eye(3), 0
        self._basis: FloatArray = vt[:rank]
        self._scale = float(np.abs(centred).max()) if len(points) else 1.0
        reduced = centred @ self._basis.T
        self.dimension = rank
        self._full = rank == 3
        self._mean_py = [float(v) for v in self._mean]
        self._basis_py = [[float(v) for v in row] for row in self._basis]
        hint = self._pairs_per_token_hint() if self._full else None
        self._locator = SimplexLocator(reduced, hint_map=hint) if rank >= 2 else None
        if rank == 1:
            order1 = np.argsort(reduced[:, 0], kind="stable")
            self._line_x = reduced[order1, 0]
            self._line_t = self._times[order1]

    def _pairs_per_token_hint(self) -> HintMap:
        """Lay start hints over (N, A, M/N): M's range grows with N, its ratio does not."""
        mean = self._mean
        log = self.coordinates == "log"

        def forward(y: FloatArray) -> FloatArray:
            x = y + mean
            out = x.copy()
            out[:, 2] = x[:, 2] - x[:, 0] if log else x[:, 2] / np.maximum(x[:, 0], 1e-12)
            return out

        def inverse(h: FloatArray) -> FloatArray:
            x = h.copy()
            x[:, 2] = h[:, 2] + h[:, 0] if log else h[:, 2] * h[:, 0]
            return x - mean

        mean_py = self._mean_py

        def forward_one(y: list[float]) -> list[float]:
            x = [v + mean_py[i] for i, v in enumerate(y)]
            x[2] = x[2] - x[0] if log else x[2] / max(x[0], 1e-12)
            return x

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
        g = self.geometry
        count = tokens.shape[0]
        values = np.full(count, np.nan)
        codes = np.full(count, OK, dtype=np.int8)
        remote = (active == 0) & (pairs == 0)
        low = np.maximum(active, tokens * max(0, g.top_k - g.remote_experts))
        high = tokens * np.minimum(g.top_k, active)
        feasible = (tokens >= 1) & (active >= 1) & (active <= g.local_experts)
        feasible &= (pairs >= low) & (pairs <= high)
        codes[~(feasible | (remote & (tokens >= 1) & g.all_remote_possible))] = INVALID

        if remote.any():
            rows = np.flatnonzero(remote & (codes == OK))
            if self.remote is None:
                codes[rows] = OUT_OF_SUPPORT
            else:
                values[rows], codes[rows] = self.remote.batch(tokens[rows])

        rows = np.flatnonzero(~remote & (codes == OK))
        if rows.size == 0:
            return values, codes
        n, a, m = tokens[rows], active[rows], pairs[rows]
        measurable = (n < self._limit) & (a < self._limit) & (m < self._limit)
        keys = _key(
            np.where(measurable, n, 0), np.where(measurable, a, 0), np.where(measurable, m, 0)
        )
        slot = np.clip(np.searchsorted(self._keys, keys), 0, len(self._keys) - 1)
        exact = measurable & (self._keys[slot] == keys)
        values[rows[exact]] = self._key_times[slot[exact]]
        rest = ~exact
        if not rest.any():
            return values, codes
        rows, n, a, m = rows[rest], n[rest], a[rest], m[rest]
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
        centred = self._transform(n, a, m) - self._mean
        if self._full:
            reduced = centred
            on_plane = np.ones(len(n), dtype=bool)
        else:
            reduced = centred @ self._basis.T
            # A query off the measured affine subspace (EP1's M = N*k plane, or an axis the
            # plan held fixed) has no enclosing simplex.
            residual = (
                np.abs(centred - reduced @ self._basis).max(axis=1) if len(centred) else np.zeros(0)
            )
            on_plane = residual <= 1e-9 * max(self._scale, 1.0)
        values = np.full(len(n), np.nan)
        ok = np.zeros(len(n), dtype=bool)
        if self._locator is not None:
            simplex, weights = self._locator.locate(reduced)
            ok = on_plane & (simplex >= 0)
            if ok.all():  # the common case: no masked copies
                values = np.einsum(
                    "ij,ij->i", weights, self._times[self._locator.simplices[simplex]]
                )
            else:
                vertices = self._locator.simplices[simplex[ok]]
                values[ok] = np.einsum("ij,ij->i", weights[ok], self._times[vertices])
        elif self.dimension == 1:
            x = reduced[:, 0]
            ok = on_plane & (x >= self._line_x[0]) & (x <= self._line_x[-1])
            values[ok] = np.interp(x[ok], self._line_x, self._line_t)
        return values, ok

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
        if not g.feasible(tokens, active, pairs):
            low, high = g.assignment_bounds(tokens, active) if tokens >= 1 else (0, 0)
            raise QueryError(
                f"{self.label}: N={tokens} A={active} M={pairs} is infeasible "
                f"(need 1 <= A <= {g.local_experts} and {low} <= M <= {high})"
            )
        exact = self._exact.get((tokens, active, pairs))
        if exact is not None:
            return exact
        values, ok = (
            self._interpolate(
                np.array([tokens], dtype=np.float64),
                np.array([active], dtype=np.float64),
                np.array([pairs], dtype=np.float64),
            )
            if self._locator is None
            else self._interpolate_one(tokens, active, pairs)
        )
        if not ok[0]:
            raise CoverageError(
                f"{self.label}: N={tokens} A={active} M={pairs} is outside the measured support "
                f"(tokens {self.support[0]}..{self.support[1]}); no extrapolation"
            )
        return float(values[0])

    def _interpolate_one(self, n: int, a: int, m: int) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        assert self._locator is not None
        if self.coordinates == "log":
            x = (math.log(n), math.log(a), math.log(m))
        else:
            x = (float(n), float(a), float(m))
        mean = self._mean_py
        c = (x[0] - mean[0], x[1] - mean[1], x[2] - mean[2])
        if self._full:
            y: tuple[float, ...] = c
        else:
            basis = self._basis_py
            y = tuple(row[0] * c[0] + row[1] * c[1] + row[2] * c[2] for row in basis)
            back = [sum(y[i] * basis[i][j] for i in range(len(y))) for j in range(3)]
            if max(abs(c[j] - back[j]) for j in range(3)) > 1e-9 * max(self._scale, 1.0):
                return np.array([np.nan]), np.array([False])
        located = self._locator.locate_one(y)
        if located is None:
            return np.array([np.nan]), np.array([False])
        vertices, weights = located
        times = self._times_py
        value = sum(w * times[v] for v, w in zip(vertices, weights, strict=True))
        return np.array([value]), np.array([True])
