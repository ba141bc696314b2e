"""Point location in a Delaunay triangulation, fast enough for millions of lookups.

scipy's ``Delaunay.find_simplex`` takes about 100 us a query on a 2,000-point N/A/M table
(measured, docs/benchmarks.md). scipy still builds the triangulation, once; queries then
start from the simplex that holds the centre of their cell in a coarse grid and walk across
faces towards the point (a visibility walk, which terminates on Delaunay triangulations),
vectorised for batches and in plain float arithmetic for one point. Crossing a hull face means
the point lies beyond a supporting plane of the convex hull: it is outside, and refused.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import numpy.typing as npt
from scipy.spatial import Delaunay, cKDTree

__all__ = ["SimplexLocator"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Barycentric weights this far below zero still count as inside (the perturbation below and
# rounding on shared faces); they are clipped to zero before use, so the answer stays a convex combination.
_INSIDE_TOL = 1e-5
_MAX_STEPS = 4096


class SimplexLocator:
    """A Delaunay triangulation of ``vertices`` (n x d, d >= 2) with a walking point locator."""

    def __init__(self, vertices: FloatArray, *, cells_per_vertex: int = 128) -> None:
        n, d = vertices.shape
        if d < 2 or n < d + 1:
            raise ValueError(f"need at least {d + 1} points in {d} >= 2 dimensions, got {n}")
        self.dim = d
        # Measured grids put many points on common planes and spheres, where Delaunay yields
        # flat simplices that no walk can cross. A fixed, tiny perturbation (1e-7 of the span)
        # removes them; barycentric weights use the perturbed corners consistently, so the
        # answer moves by less than the table's own rounding, and exact rows never come here.
        lo, hi = vertices.min(axis=0), vertices.max(axis=0)
        jitter = np.random.default_rng(0x5EED).uniform(-1.0, 1.0, vertices.shape)
        # Each axis is scaled to [0, 1] first: barycentric weights do not change under this
        # affine map, but Delaunay's choice of simplices does, and unit axes keep them from
        # becoming needles along the longest axis (tokens and pairs reach thousands, A tens).
        span = np.where(hi > lo, hi - lo, 1.0)
        vertices = (vertices - lo) / span + jitter * 1e-7
        self.scale_lo, self.scale_span = lo, span
        self.vertices = vertices
        tri = Delaunay(vertices)
        self.simplices: IntArray = tri.simplices.astype(np.int64)
        self.neighbors: IntArray = tri.neighbors.astype(np.int64)
        # Barycentric frames computed here in one batched inverse: scipy's own
        # ``transform`` property builds them one simplex at a time (over a second here).
        corners = vertices[self.simplices]
        edges = np.transpose(corners[:, :-1, :] - corners[:, -1:, :], (0, 2, 1))
        det = np.linalg.det(edges)
        self.flat = ~(np.abs(det) > 1e-300)
        safe = np.where(self.flat[:, None, None], np.eye(d), edges)
        self.transform: FloatArray = np.where(self.flat[:, None, None], 0.0, np.linalg.inv(safe))
        self.offset: FloatArray = corners[:, -1, :].copy()
        # The hint grid is uniform in each axis's empirical distribution of vertices, so cells
        # are fine where measured points are dense (geometric grids crowd small N).
        self.knots = [np.unique(vertices[:, a]) for a in range(d)]
        self.ranks = [np.linspace(0.0, 1.0, len(k)) for k in self.knots]
        self.per_axis = min(
            512 if d == 2 else 64, max(2, round((cells_per_vertex * n) ** (1.0 / d)))
        )
        # Each cell starts its walks from the simplex holding its centre (found by walking
        # there from a simplex touching the nearest vertex), so most queries take one step.
        centres = self._cell_centres()
        _, nearest = cKDTree(vertices).query(centres)
        near = tri.vertex_to_simplex[nearest].astype(np.int64)
        self.cell_start: IntArray = self._walk(centres, near, hint_only=True)
        self._py_simplices = [tuple(int(v) for v in s) for s in self.simplices]
        self._py_neighbors = [tuple(int(v) for v in s) for s in self.neighbors]
        self._py_frames = [
            (tuple(map(float, t.ravel())), tuple(map(float, r)), bool(f))
            for t, r, f in zip(self.transform, self.offset, self.flat, strict=True)
        ]
        self._py_cell_start = [int(s) for s in self.cell_start]
        self._py_knots = [k.tolist() for k in self.knots]

    def _warp(self, axis: int, x: FloatArray) -> FloatArray:
        knots = self.knots[axis]
        if len(knots) == 1:
            return np.zeros_like(x)
        return np.interp(x, knots, self.ranks[axis])

    def _cell_centres(self) -> FloatArray:
        u = (np.arange(self.per_axis) + 0.5) / self.per_axis
        axes = [
            np.interp(u, self.ranks[a], self.knots[a])
            if len(self.knots[a]) > 1
            else np.full(self.per_axis, self.knots[a][0])
            for a in range(self.dim)
        ]
        mesh = np.meshgrid(*axes, indexing="ij")
        # Flattened so that cell index = sum(c_a * per_axis**a): axis 0 varies fastest.
        return np.stack([m.transpose().ravel() for m in mesh], axis=1)

    def _cell_of(self, points: FloatArray) -> IntArray:
        flat = np.zeros(len(points), dtype=np.int64)
        for axis in range(self.dim - 1, -1, -1):
            c = np.floor(self._warp(axis, points[:, axis]) * self.per_axis).astype(np.int64)
            flat = flat * self.per_axis + np.clip(c, 0, self.per_axis - 1)
        return flat

    def _barycentric(self, points: FloatArray, simplex: IntArray) -> FloatArray:
        d = self.dim
        t = self.transform[simplex]
        rel = points - self.offset[simplex]
        # Explicit d x d products: einsum on tiny inner dimensions is several times slower.
        out = np.empty((len(points), d + 1), dtype=np.float64)
        out[:, d] = 1.0
        for i in range(d):
            acc = t[:, i, 0] * rel[:, 0]
            for j in range(1, d):
                acc += t[:, i, j] * rel[:, j]
            out[:, i] = acc
            out[:, d] -= acc
        return out

    def _walk(self, points: FloatArray, current: IntArray, *, hint_only: bool = False) -> IntArray:
        """Walk each point from ``current``; -1 once a hull face is crossed.

        With ``hint_only`` (building start hints), a point outside the hull keeps the last
        simplex reached instead of -1: it is still a good place to start from.
        """
        result = current.copy()
        active = np.arange(len(points))
        cur = current.copy()
        for _ in range(_MAX_STEPS):
            if active.size == 0:
                break
            w = self._barycentric(points[active], cur)
            worst = np.argmin(w, axis=1)
            done = w[np.arange(len(active)), worst] >= -_INSIDE_TOL
            flat = self.flat[cur]
            done &= ~flat
            result[active[done]] = cur[done]
            step = ~done
            nxt = self.neighbors[cur[step], np.where(flat[step], 0, worst[step])]
            out = nxt < 0
            if not hint_only:
                result[active[step][out]] = -1
            else:
                result[active[step][out]] = cur[step][out]
            keep = ~out
            active = active[step][keep]
            cur = nxt[keep]
        if active.size:
            result[active] = self._brute(points[active])
        return result

    def _brute(self, points: FloatArray) -> IntArray:
        found = np.full(len(points), -1, dtype=np.int64)
        candidates = np.flatnonzero(~self.flat)
        for i, point in enumerate(points):
            w = self._barycentric(np.repeat(point[None], len(candidates), 0), candidates)
            inside = np.flatnonzero(w.min(axis=1) >= -_INSIDE_TOL)
            if inside.size:
                found[i] = candidates[inside[0]]
        return found

    def locate(self, points: FloatArray) -> tuple[IntArray, FloatArray]:
        """Simplex index (-1 outside) and d+1 barycentric weights (>= 0, summing to 1)."""
        points = (points - self.scale_lo) / self.scale_span
        found = self._walk(points, self.cell_start[self._cell_of(points)])
        weights = np.zeros((len(points), self.dim + 1), dtype=np.float64)
        inside = found >= 0
        if inside.any():
            w = np.clip(self._barycentric(points[inside], found[inside]), 0.0, None)
            weights[inside] = w / w.sum(axis=1, keepdims=True)
        return found, weights

    def locate_one(
        self, point: tuple[float, ...]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """Vertex indices and weights of the simplex holding ``point``, or None outside."""
        point = tuple(
            (point[a] - float(self.scale_lo[a])) / float(self.scale_span[a])
            for a in range(self.dim)
        )
        d = self.dim
        flat_index = 0
        for axis in range(d - 1, -1, -1):
            knots = self._py_knots[axis]
            x = point[axis]
            i = bisect.bisect_right(knots, x)
            if i <= 0 or len(knots) == 1:
                u = 0.0
            elif i >= len(knots):
                u = 1.0
            else:
                u = (i - 1 + (x - knots[i - 1]) / (knots[i] - knots[i - 1])) / (len(knots) - 1)
            c = min(self.per_axis - 1, max(0, math.floor(u * self.per_axis)))
            flat_index = flat_index * self.per_axis + c
        cur = self._py_cell_start[flat_index]
        for _ in range(_MAX_STEPS):
            t, r, degenerate = self._py_frames[cur]
            if degenerate:
                cur = self._py_neighbors[cur][0]
                if cur < 0:
                    break
                continue
            rel_pt = [point[i] - r[i] for i in range(d)]
            w = [sum(t[i * d + j] * rel_pt[j] for j in range(d)) for i in range(d)]
            w.append(1.0 - sum(w))
            worst = min(range(d + 1), key=w.__getitem__)
            if w[worst] >= -_INSIDE_TOL:
                clipped = [max(0.0, v) for v in w]
                total = sum(clipped)
                return self._py_simplices[cur], tuple(v / total for v in clipped)
            cur = self._py_neighbors[cur][worst]
            if cur < 0:
                return None
        found = self._brute(np.array([point], dtype=np.float64))[0]
        if found < 0:
            return None
        w_arr = np.clip(self._barycentric(np.array([point]), np.array([found]))[0], 0.0, None)
        return self._py_simplices[found], tuple(float(v) for v in w_arr / w_arr.sum())
