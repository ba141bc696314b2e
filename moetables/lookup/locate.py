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
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.spatial import ConvexHull, Delaunay, cKDTree

__all__ = ["HintMap", "SimplexLocator"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Maps of point coordinates into the space where the start-hint grid is laid out: forward and
# inverse on arrays, and forward on one point; only hints depend on it, never answers.
HintMap = tuple[
    Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    Callable[[list[float]], list[float]],
]

# Barycentric weights this far below zero still count as inside (the perturbation below and
# rounding on shared faces); they are clipped to zero before use, so the answer stays a convex combination.
_INSIDE_TOL = 1e-5
# Queries move this fraction of the way to the vertices' centroid before location, so a point
# on the measured hull lands inside it rather than on faces the perturbation may have shifted
# (answers move by about 1e-8 of the local variation, far below measurement precision).
_NUDGE = 1e-8
_MAX_STEPS = 512
# How far past a hull plane (in unit-scaled coordinates) a point still counts as on it.
_HULL_TOL = 1e-9


class SimplexLocator:
    """A Delaunay triangulation of ``vertices`` (n x d, d >= 2) with a walking point locator."""

    def __init__(
        self,
        vertices: FloatArray,
        *,
        cells_per_vertex: int = 16,
        hint_map: HintMap | None = None,
    ) -> None:
        n, d = vertices.shape
        if d < 2 or n < d + 1:
            raise ValueError(f"need at least {d + 1} points in {d} >= 2 dimensions, got {n}")
        self.dim = d
        # Measured grids put many points on common planes and spheres, where Delaunay yields
        # flat simplices that no walk can cross. A fixed, tiny perturbation (1e-10 of the span)
        # removes them; barycentric weights use the perturbed corners consistently, so the
        # answer moves by less than the table's own rounding, and exact rows never come here.
        lo, hi = vertices.min(axis=0), vertices.max(axis=0)
        jitter = np.random.default_rng(0x5EED).uniform(-1.0, 1.0, vertices.shape)
        # Each axis is scaled to [0, 1] first: barycentric weights do not change under this
        # affine map, but Delaunay's choice of simplices does, and unit axes keep them from
        # becoming needles along the longest axis (tokens and pairs reach thousands, A tens).
        span = np.where(hi > lo, hi - lo, 1.0)
        exact = (vertices - lo) / span
        vertices = exact + jitter * 1e-10
        self.scale_lo, self.scale_span = lo, span
        self.vertices = vertices
        self._centre = exact.mean(axis=0)
        self._py_centre = self._centre.tolist()
        self._py_lo, self._py_span = lo.tolist(), span.tolist()
        tri = Delaunay(vertices)
        self.simplices: IntArray = tri.simplices.astype(np.int64)
        self.neighbors: IntArray = tri.neighbors.astype(np.int64)
        # Barycentric frames computed here in one batched inverse: scipy's own
        # ``transform`` property builds them one simplex at a time (over a second here).
        # Weights come from the measured (unperturbed) corners wherever those span a proper
        # simplex, so affine data is reproduced to rounding; only simplices that are flat
        # without the perturbation keep their perturbed frame.
        corners = exact[self.simplices]
        jittered = vertices[self.simplices]
        edges = np.transpose(corners[:, :-1, :] - corners[:, -1:, :], (0, 2, 1))
        # Proper: not a sliver, judged by volume against edge lengths (scale-free, since
        # geometric grids make simplices near N=1 millions of times smaller than at the top).
        lengths = np.prod(np.linalg.norm(edges, axis=1), axis=1)
        proper = np.abs(np.linalg.det(edges)) > 1e-6 * np.maximum(lengths, 1e-300)
        self.proper = proper
        corners = np.where(proper[:, None, None], corners, jittered)
        edges = np.transpose(corners[:, :-1, :] - corners[:, -1:, :], (0, 2, 1))
        det = np.linalg.det(edges)
        self.flat = ~(np.abs(det) > 1e-300)
        safe = np.where(self.flat[:, None, None], np.eye(d), edges)
        self.transform: FloatArray = np.where(self.flat[:, None, None], 0.0, np.linalg.inv(safe))
        self.offset: FloatArray = corners[:, -1, :].copy()
        self._tri = tri
        # Supporting planes of the measured hull (unperturbed): the final word on "outside"
        # when a walk leaves through a face of a perturbed near-flat simplex.
        self._hull = ConvexHull(exact).equations
        self._box_lo = exact[self.simplices].min(axis=1) - 1e-6
        self._box_hi = exact[self.simplices].max(axis=1) + 1e-6
        # scipy walks from the previous point's simplex in compiled code: fast on queries
        # sorted by cell. Hand it these frames (its own attribute, filled lazily and one
        # simplex at a time otherwise) so both paths test containment identically.
        if getattr(tri, "_transform", False) is None:
            tri._transform = np.concatenate(
                [
                    np.where(self.flat[:, None, None], np.nan, self.transform),
                    self.offset[:, None, :],
                ],
                axis=1,
            )
        else:  # a scipy without that attribute: keep to our own walk
            self._tri = None
        # b = T x + c, packed per simplex so one gather fetches a whole frame.
        shift = -np.einsum("sij,sj->si", self.transform, self.offset)

        self.frames: FloatArray = np.concatenate(
            [self.transform.reshape(len(self.transform), d * d), shift], axis=1
        )
        forward, inverse, forward_one = hint_map or (lambda x: x, lambda x: x, lambda x: x)
        self._hint_forward = lambda x: forward(x * span + lo)
        lo_py, span_py = lo.tolist(), span.tolist()
        self._hint_forward_one = lambda x: forward_one(
            [v * span_py[a] + lo_py[a] for a, v in enumerate(x)]
        )
        self._hint_inverse = lambda h: (inverse(h) - lo) / span
        # The hint grid is uniform in each axis's empirical distribution of vertices (in hint
        # space), so cells are fine where measured points are dense.
        hinted = self._hint_forward(vertices)
        self.knots = [np.unique(hinted[:, a]) for a in range(d)]
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
        self._py_frames = [tuple(map(float, f)) for f in self.frames]
        self._py_flat = self.flat.tolist()
        self._py_proper = self.proper.tolist()
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
        return self._hint_inverse(np.stack([m.transpose().ravel() for m in mesh], axis=1))

    def _cell_of(self, points: FloatArray) -> IntArray:
        points = self._hint_forward(points)
        flat = np.zeros(len(points), dtype=np.int64)
        for axis in range(self.dim - 1, -1, -1):
            c = np.floor(self._warp(axis, points[:, axis]) * self.per_axis).astype(np.int64)
            flat = flat * self.per_axis + np.clip(c, 0, self.per_axis - 1)
        return flat

    def _barycentric(self, points: FloatArray, simplex: IntArray) -> FloatArray:
        d = self.dim
        f = self.frames[simplex]
        out = np.empty((len(points), d + 1), dtype=np.float64)
        last = np.ones(len(points), dtype=np.float64)
        # Explicit d x d products: einsum on tiny inner dimensions is several times slower.
        for i in range(d):
            acc = f[:, d * d + i] + f[:, i * d] * points[:, 0]
            for j in range(1, d):
                acc += f[:, i * d + j] * points[:, j]
            out[:, i] = acc
            last -= acc
        out[:, d] = last
        return out

    def _walk(self, points: FloatArray, current: IntArray, *, hint_only: bool = False) -> IntArray:
        """Walk each point from ``current``; -1 once a hull face is crossed.

        With ``hint_only`` (building start hints), a point outside the hull keeps the last
        simplex reached instead of -1: it is still a good place to start from.
        """
        result = current.copy()
        active = np.arange(len(points))
        cur = current.copy()
        # Leaving through a random face of those the point lies beyond (a stochastic walk)
        # terminates on any triangulation; always taking the most negative one can cycle.
        rng = np.random.default_rng(0)
        for _ in range(_MAX_STEPS):
            if active.size == 0:
                break
            w = self._barycentric(points[active], cur)
            beyond = w < -_INSIDE_TOL
            worst = np.argmax(beyond * rng.random(w.shape), axis=1)
            done = ~beyond.any(axis=1)
            flat = self.flat[cur]
            done &= ~flat
            result[active[done]] = cur[done]
            step = ~done
            nxt = self.neighbors[cur[step], np.where(flat[step], 0, worst[step])]
            out = nxt < 0
            # A hull face seen through a perturbed (near-flat) frame proves nothing: search.
            doubt = out & ~self.proper[cur[step]]
            if doubt.any():
                rows = active[step][doubt]
                result[rows] = cur[step][doubt] if hint_only else self._brute(points[rows])
                out &= ~doubt
                nxt[doubt] = -2
            if not hint_only:
                result[active[step][out]] = -1
            else:
                result[active[step][out]] = cur[step][out]
            keep = nxt >= 0
            active = active[step][keep]
            cur = nxt[keep]
        if active.size:
            result[active] = self._brute(points[active])
        return result

    def _brute(self, points: FloatArray) -> IntArray:
        """Decide points the walks could not: outside the measured hull, or its simplex.

        A point inside the hull (by its unperturbed supporting planes) always gets a simplex:
        the one whose bounding box holds it and whose weights are least negative, which is
        exact except on boundaries drawn by perturbed near-flat simplices.
        """
        found = np.full(len(points), -1, dtype=np.int64)
        outside = (points @ self._hull[:, :-1].T + self._hull[:, -1] > _HULL_TOL).any(axis=1)
        for i in np.flatnonzero(~outside):
            point = points[i]
            near = np.flatnonzero(
                np.all((self._box_lo <= point) & (point <= self._box_hi), axis=1) & ~self.flat
            )
            if near.size == 0:
                continue
            w = self._barycentric(np.repeat(point[None], len(near), 0), near)
            found[i] = near[int(np.argmax(w.min(axis=1)))]
        return found

    def locate(self, points: FloatArray) -> tuple[IntArray, FloatArray]:
        """Simplex index (-1 outside) and d+1 barycentric weights (>= 0, summing to 1)."""
        points = (points - self.scale_lo) / self.scale_span
        points += (self._centre - points) * _NUDGE
        cells = self._cell_of(points)
        if self._tri is not None:
            order = np.argsort(cells, kind="stable")
            found = np.empty(len(points), dtype=np.int64)
            found[order] = self._tri.find_simplex(points[order], tol=_INSIDE_TOL)
            # Anything scipy refused or placed on a flat simplex is decided by our walk.
            again = (found < 0) | self.flat[np.maximum(found, 0)]
            if again.any():
                rows = np.flatnonzero(again)
                found[rows] = self._walk(points[rows], self.cell_start[cells[rows]])
        else:
            found = self._walk(points, self.cell_start[cells])
        weights = np.zeros((len(points), self.dim + 1), dtype=np.float64)
        inside = found >= 0
        if inside.any():
            w = self._barycentric(points[inside], found[inside])
            bad = w.min(axis=1) < -_INSIDE_TOL
            if bad.any():  # never expected: re-walk rather than return a non-convex weight
                rows = np.flatnonzero(inside)[bad]
                found[rows] = self._walk(points[rows], self.cell_start[cells[rows]])
                inside = found >= 0
                w = self._barycentric(points[inside], found[inside])
            w = np.clip(w, 0.0, None)
            weights[inside] = w / w.sum(axis=1, keepdims=True)
        return found, weights

    def _walk_one_3d(
        self, cur: int, x0: float, x1: float, x2: float
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The scalar walk unrolled for three dimensions (the common DP+EP surface).

        Returns None when undecided (step cap, or a hull face seen through a perturbed
        frame); a point certainly outside the hull returns ``()`` as its simplex.
        """
        frames, neighbors, flat, proper = (
            self._py_frames,
            self._py_neighbors,
            self._py_flat,
            self._py_proper,
        )
        tol = -_INSIDE_TOL
        for step in range(_MAX_STEPS):
            if flat[cur]:
                cur = neighbors[cur][0]
                if cur < 0:
                    return None
                continue
            t0, t1, t2, t3, t4, t5, t6, t7, t8, c0, c1, c2 = frames[cur]
            w0 = c0 + t0 * x0 + t1 * x1 + t2 * x2
            w1 = c1 + t3 * x0 + t4 * x1 + t5 * x2
            w2 = c2 + t6 * x0 + t7 * x1 + t8 * x2
            w3 = 1.0 - w0 - w1 - w2
            if w0 >= tol and w1 >= tol and w2 >= tol and w3 >= tol:
                w0, w1, w2, w3 = max(w0, 0.0), max(w1, 0.0), max(w2, 0.0), max(w3, 0.0)
                total = w0 + w1 + w2 + w3
                return self._py_simplices[cur], (w0 / total, w1 / total, w2 / total, w3 / total)
            beyond = [i for i, w in enumerate((w0, w1, w2, w3)) if w < tol]
            nxt = neighbors[cur][beyond[step % len(beyond)]]
            if nxt < 0:
                return ((), ()) if proper[cur] else None
            cur = nxt
        return None

    def locate_one(
        self, point: tuple[float, ...]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """Vertex indices and weights of the simplex holding ``point``, or None outside."""
        d = self.dim
        lo, span = self._py_lo, self._py_span
        centre = self._py_centre
        x = [(point[a] - lo[a]) / span[a] for a in range(d)]
        x = [v + (centre[a] - v) * _NUDGE for a, v in enumerate(x)]
        hinted = self._hint_forward_one(x)
        flat_index = 0
        for axis in range(d - 1, -1, -1):
            knots = self._py_knots[axis]
            h = hinted[axis]
            i = bisect.bisect_right(knots, h)
            if i <= 0 or len(knots) == 1:
                u = 0.0
            elif i >= len(knots):
                u = 1.0
            else:
                u = (i - 1 + (h - knots[i - 1]) / (knots[i] - knots[i - 1])) / (len(knots) - 1)
            c = min(self.per_axis - 1, max(0, math.floor(u * self.per_axis)))
            flat_index = flat_index * self.per_axis + c
        cur = self._py_cell_start[flat_index]
        if d == 3:
            walked = self._walk_one_3d(cur, x[0], x[1], x[2])
            if walked is not None:
                return walked if walked[0] else None
            cur = -1  # undecided: the full search below
        frames, neighbors, flat = self._py_frames, self._py_neighbors, self._py_flat
        for step in range(_MAX_STEPS if cur >= 0 else 0):
            if flat[cur]:
                cur = neighbors[cur][0]
                if cur < 0:
                    break
                continue
            f = frames[cur]
            if d == 3:
                x0, x1, x2 = x
                w = [
                    f[9] + f[0] * x0 + f[1] * x1 + f[2] * x2,
                    f[10] + f[3] * x0 + f[4] * x1 + f[5] * x2,
                    f[11] + f[6] * x0 + f[7] * x1 + f[8] * x2,
                ]
            else:
                w = [f[d * d + i] + sum(f[i * d + j] * x[j] for j in range(d)) for i in range(d)]
            w.append(1.0 - sum(w))
            beyond = [i for i in range(d + 1) if w[i] < -_INSIDE_TOL]
            if not beyond:
                clipped = [v if v > 0.0 else 0.0 for v in w]
                total = sum(clipped)
                return self._py_simplices[cur], tuple(v / total for v in clipped)
            # Cycle through the faces the point lies beyond (deterministic and terminating
            # in practice); the step cap below falls back to a full search.
            nxt = neighbors[cur][beyond[step % len(beyond)]]
            if nxt < 0:
                if self._py_proper[cur]:
                    return None
                break  # a perturbed frame's hull face proves nothing: search below
            cur = nxt
        found = self._brute(np.array([x], dtype=np.float64))[0]
        if found < 0:
            return None
        w_arr = np.clip(self._barycentric(np.array([x]), np.array([found]))[0], 0.0, None)
        return self._py_simplices[found], tuple(float(v) for v in w_arr / w_arr.sum())
