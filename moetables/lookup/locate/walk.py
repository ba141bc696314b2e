"""The exact search: the visibility walk every query took before the cell candidates, and
the decider of every refusal (scipy's compiled walk for batches, plain float arithmetic for
one point, a bounded brute search where a walk cannot decide).

Crossing a hull face means the point lies beyond a supporting plane of the convex hull,
outside; so does a point held only through the tolerance while past the measured hull's
planes. ``_walk_one_3d`` is the 3-D twin of ``_walk_one``: unrolled for the common DP+EP
surface, and kept because its float order is the one the answers were fixed with
(docs/benchmarks.md, "Lookup locator split").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moetables.lookup.locate.grid import CellGrid
from moetables.lookup.locate.triangulation import (
    INSIDE_TOL,
    MAX_STEPS,
    Columns,
    FloatArray,
    IntArray,
)

__all__ = ["ExactWalk"]


class ExactWalk(CellGrid):
    """The cell grid with the exact search, batch and scalar."""

    def search_by_walk(self, columns: Columns) -> tuple[IntArray, list[FloatArray]]:
        """``search`` by the exact search alone, as before the cell candidates."""
        unit = np.stack(self._unit(columns), axis=1)
        found = self._find_exact(unit, self._cells_of(self._hint_forward(columns)))
        inside = found >= 0
        w = np.zeros((len(unit), self.dim + 1))
        if inside.any():
            w[inside] = self._barycentric(unit[inside], found[inside])
        return found, [w[:, k].copy() for k in range(self.dim + 1)]

    def locate_by_walk(self, points: FloatArray) -> tuple[IntArray, FloatArray]:
        """``locate`` by the exact search alone, as before the cell candidates: the
        reference they answer to."""
        d = self.dim
        columns = [points[:, a] for a in range(d)]
        unit = np.stack(self._unit(columns), axis=1)
        found = self._find_exact(unit, self._cells_of(self._hint_forward(columns)))
        weights = np.zeros((len(points), d + 1), dtype=np.float64)
        inside = found >= 0
        if inside.any():
            w = np.clip(self._barycentric(unit[inside], found[inside]), 0.0, None)
            weights[inside] = w / w.sum(axis=1, keepdims=True)
        return found, weights

    def _find_exact(self, points: FloatArray, cell: IntArray) -> IntArray:
        """Simplex of each unit-scaled point (-1 outside): scipy's walk over points sorted
        by cell, then our own walk, from the cell's start, for what it refused or placed on
        a flat simplex.
        """
        start: IntArray = self.cell_start.take(cell).astype(np.int64)
        if self._tri is None:
            return self._walk(points, start)
        order = np.argsort(cell, kind="stable")
        found = np.empty(len(points), dtype=np.int64)
        found[order] = self._tri.find_simplex(points[order], tol=INSIDE_TOL)
        again = (found < 0) | self.flat[np.maximum(found, 0)]
        if again.any():
            rows = np.flatnonzero(again)
            found[rows] = self._walk(points[rows], start[rows])
        inside = found >= 0
        if inside.any():
            w = self._barycentric(points[inside], found[inside])
            bad = w.min(axis=1) < -INSIDE_TOL
            if bad.any():  # never expected: re-walk rather than return a non-convex weight
                rows = np.flatnonzero(inside)[bad]
                found[rows] = self._walk(points[rows], start[rows])
        return found

    def _walk(self, points: FloatArray, current: IntArray) -> IntArray:
        """Walk each point from ``current``; -1 once a hull face is crossed."""
        result = current.copy()
        active = np.arange(len(points))
        cur = current.copy()
        # Leaving through a random face of those the point lies beyond (a stochastic walk)
        # terminates on any triangulation; always taking the most negative one can cycle.
        rng = np.random.default_rng(0)
        for _ in range(MAX_STEPS):
            if active.size == 0:
                break
            w = self._barycentric(points[active], cur)
            beyond = w < -INSIDE_TOL
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
                result[rows] = self._brute(points[rows])
                out &= ~doubt
                nxt[doubt] = -2
            result[active[step][out]] = -1
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
        outside = self._outside_hull(points)
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

    def _exact_one(
        self, x: Sequence[float], start: int
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The exact search for one point, and, as for batches, a refusal of what it holds
        only through its tolerance past the hull."""
        found = self._walk_one(x, start)
        if found is not None and self._outside_hull(np.array([x], dtype=np.float64))[0]:
            return None
        return found

    def locate_one_by_walk(
        self, point: Sequence[float]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """``locate_one`` by the exact search alone, as before the cell candidates (from
        the same start simplex of the point's cell)."""
        d = self.dim
        mul, add = self._py_unit_mul, self._py_unit_add
        cell = self._cell_one(self._hint_forward_one(point))
        x = [point[a] * mul[a] + add[a] for a in range(d)]
        return self._walk_one(x, self._py_cell_start[cell])

    def _walk_one(
        self, x: Sequence[float], start: int
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The exact search for one unit-scaled (nudged) point, walking from ``start``."""
        if self.dim == 3:
            walked = self._walk_one_3d(start, x[0], x[1], x[2])
            if walked is not None:
                return walked if walked[0] else None
            return self.walk_one_nd(x, -1)  # undecided: the full search
        return self.walk_one_nd(x, start)

    def walk_one_nd(
        self, x: Sequence[float], start: int
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """``_walk_one`` in any dimension (``start`` -1: the brute search alone; the 3-D
        twin unrolls it: bench/locate_twins.py)."""
        d = self.dim
        cur = start
        frames, neighbors, flat = self._py_frames, self._py_neighbors, self._py_flat
        for step in range(MAX_STEPS if cur >= 0 else 0):
            if flat[cur]:
                cur = neighbors[cur][0]
                if cur < 0:
                    break
                continue
            f = frames[cur]
            w = [f[d * d + i] + sum(f[i * d + j] * x[j] for j in range(d)) for i in range(d)]
            w.append(1.0 - sum(w))
            beyond = [i for i in range(d + 1) if w[i] < -INSIDE_TOL]
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

    def _walk_one_3d(
        self, cur: int, x0: float, x1: float, x2: float
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The scalar walk unrolled for three dimensions.

        Returns None when undecided (step cap, or a hull face seen through a perturbed
        frame); a point certainly outside the hull returns ``()`` as its simplex.
        """
        frames, neighbors, flat, proper = (
            self._py_frames,
            self._py_neighbors,
            self._py_flat,
            self._py_proper,
        )
        tol = -INSIDE_TOL
        for step in range(MAX_STEPS):
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
