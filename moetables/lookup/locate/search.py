"""The cell search and the public `SimplexLocator`: a query looks up its cell, tests the
cell's candidates, steps across faces, and hands what it cannot decide to the exact search.

Three paths of one search, each kept because a benchmark needs it (docs/benchmarks.md):
``search`` for batches (numpy), ``locate_one`` for one point (plain floats: no array is
cheaper than a few float operations), and ``locate_one_3d``, ``locate_one`` unrolled for the
3-D surface of DP+EP targets. They settle on the same simplex with the same weights.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from moetables.lookup.locate.triangulation import (
    FINE_BINS,
    INSIDE_TOL,
    MAX_ROUNDS,
    STRICT_TOL,
    BoolArray,
    Columns,
    FloatArray,
    IntArray,
)
from moetables.lookup.locate.walk import ExactWalk

__all__ = ["SimplexLocator"]


class SimplexLocator(ExactWalk):
    """A Delaunay triangulation of ``vertices`` (n x d, d >= 2) with a cell-candidate locator.

    ``SimplexLocator(vertices, cells_per_vertex=..., hint_map=..., snap=...)``: see
    `CellGrid` for the options.
    """

    @functools.cached_property
    def _scalar_3d(self) -> tuple[Any, ...]:
        """What ``locate_one_3d`` reads, in one tuple (one attribute lookup a query)."""
        return (
            *self._py_unit_mul,
            *self._py_unit_add,
            *self._bin_lo,
            *self._bin_scale,
            *self._py_luts,
            self._py_frames,
            self._py_flat,
            self._py_neighbors,
            self._py_hull_face,
            self._py_candidates,
            self._py_offsets,
            self._py_cell_start,
            self._py_simplices,
        )

    def search(self, columns: Columns) -> tuple[IntArray, list[FloatArray]]:
        """Simplex index (-1 outside) and raw weights (one array per corner) of each point.

        ``columns`` holds one coordinate array per axis. Weights of points outside are
        undefined; inside, they sum to 1 and are at least ``-STRICT_TOL`` where the cell
        search decided, ``-INSIDE_TOL`` where the exact search did (not yet clipped).
        """
        d = self.dim
        unit = self._unit(columns)
        cell = self._cells_of(self._hint_forward(columns))
        # First round: every point against its cell's first candidate.
        found = self.cell_start.take(cell, mode="clip").astype(np.int64)
        weights = self._weights(unit, found)
        ok, across, low = self._accept(weights, found)
        miss = np.flatnonzero(~ok)
        exact: list[IntArray] = []
        if miss.size:
            rows, s = miss, found[miss]
            found[miss] = -1
            c = cell.take(miss)
            pos = self.cell_offsets.take(c) + 1
            stop = self.cell_offsets.take(c + 1)
            w, miss = weights, rows  # ``miss`` indexes ``w``, ``low`` and ``across``
            last = len(self.cell_candidates) - 1
            # Later rounds, for the points still missed: one its simplex holds within the
            # tolerance lies just beyond a face, so it steps across (as does one whose cell
            # has no candidate left); any other tries the cell's next candidate.
            for _ in range(MAX_ROUNDS):
                walk = low.take(miss) >= -INSIDE_TOL
                walk |= pos >= stop
                nxt = self.cell_candidates.take(np.minimum(pos, last), mode="clip").astype(np.int64)
                stepping = np.flatnonzero(walk)
                if stepping.size:
                    at = miss[stepping]
                    nxt[stepping] = self._step(s[stepping], [x.take(at) for x in w])
                pos += ~walk
                keep = nxt >= 0
                keep &= ~across.take(miss)
                exact.append(rows[~keep])
                rows, s, pos, stop = rows[keep], nxt[keep], pos[keep], stop[keep]
                if rows.size == 0:
                    break
                w = self._weights([u.take(rows, mode="clip") for u in unit], s)
                ok, across, low = self._accept(w, s)
                done = np.flatnonzero(ok)
                if done.size:
                    at = rows[done]
                    found[at] = s[done]
                    for k in range(d + 1):
                        weights[k][at] = w[k][done]
                miss = np.flatnonzero(~ok)
                rows, s, pos, stop = rows[miss], s[miss], pos[miss], stop[miss]
                if rows.size == 0:
                    break
            else:
                exact.append(rows)
        rest = np.concatenate(exact) if exact else np.zeros(0, dtype=np.int64)
        if rest.size:
            points = np.stack([u.take(rest) for u in unit], axis=1)
            s = self._find_exact(points, cell.take(rest))
            # The exact search holds points to within its tolerance, which near a hull
            # vertex reaches past the hull: those are outside, and refused.
            held = np.flatnonzero(s >= 0)
            s[held[self._outside_hull(points[held])]] = -1
            found[rest] = s
            inside = s >= 0
            if inside.any():
                w_exact = self._barycentric(points[inside], s[inside])
                done = rest[inside]
                for k in range(d + 1):
                    weights[k][done] = w_exact[:, k]
        return found, weights

    def interpolate(
        self, columns: Columns, corner_values: FloatArray
    ) -> tuple[FloatArray, BoolArray]:
        """Values at points (one coordinate array per axis) and whether each is inside.

        ``corner_values`` is (d+1) x simplices: the value at each corner of each simplex
        (``values[simplices].T``). Weights are clipped at zero, renormalised and summed in
        the order ``locate_one``'s weights are summed by its callers: the same number.
        """
        found, weights = self.search(columns)
        inside = found >= 0
        total = np.zeros(len(found))
        for w in weights:
            np.maximum(w, 0.0, out=w)
            total += w
        value = np.zeros(len(found))
        part = np.empty(len(found))
        for k, w in enumerate(weights):
            w /= total
            corner_values[k].take(found, out=part, mode="clip")  # -1 (outside): any corner
            part *= w
            value += part
        if not inside.all():
            value[~inside] = np.nan
        return value, inside

    def locate(self, points: FloatArray) -> tuple[IntArray, FloatArray]:
        """Simplex index (-1 outside) and d+1 barycentric weights (>= 0, summing to 1)."""
        found, raw = self.search([points[:, a] for a in range(self.dim)])
        weights = np.zeros((len(points), self.dim + 1), dtype=np.float64)
        inside = found >= 0
        if inside.any():
            w = np.clip(np.stack(raw, axis=1)[inside], 0.0, None)
            weights[inside] = w / w.sum(axis=1, keepdims=True)
        return found, weights

    def locate_one(
        self, point: Sequence[float]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """Vertex indices and weights of the simplex holding ``point``, or None outside.

        The same rounds as ``search``, one point in plain float arithmetic, so both paths
        settle on the same simplex.
        """
        if self.dim == 3:
            return self.locate_one_3d(point[0], point[1], point[2])
        return self.locate_one_nd(point)

    def locate_one_nd(
        self, point: Sequence[float]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """``locate_one`` in any dimension (the 3-D twin unrolls it; bench/locate_twins.py)."""
        d = self.dim
        mul, add = self._py_unit_mul, self._py_unit_add
        cell = self._cell_one(self._hint_forward_one(point))
        x = [point[a] * mul[a] + add[a] for a in range(d)]
        frames, flat, neighbors = self._py_frames, self._py_flat, self._py_neighbors
        hull, candidates = self._py_hull_face, self._py_candidates
        s = self._py_cell_start[cell]
        pos, stop = self._py_offsets[cell] + 1, self._py_offsets[cell + 1]
        for _ in range(MAX_ROUNDS + 1):
            w: list[float] | None = None
            if not flat[s]:
                f = frames[s]
                w = []
                last = 1.0
                for r in range(d):
                    acc = f[d * d + r]
                    for j in range(d):
                        acc += f[r * d + j] * x[j]
                    w.append(acc)
                    last -= acc
                w.append(last)
                low = min(w)
                if low >= -STRICT_TOL:
                    if low < 0.0 and any(v < 0.0 and h for v, h in zip(w, hull[s], strict=True)):
                        break  # held only on a hull face: the exact search decides
                    clipped = [v if v > 0.0 else 0.0 for v in w]
                    total = 0.0
                    for v in clipped:
                        total += v
                    return self._py_simplices[s], tuple(v / total for v in clipped)
            if w is not None and (low >= -INSIDE_TOL or pos >= stop):
                best, face = 0.0, -1
                for k in range(d + 1):
                    if not hull[s][k] and w[k] < best:
                        best, face = w[k], k
                if face < 0:
                    break
                s = neighbors[s][face]
            elif pos < stop:
                s = candidates[pos]
                pos += 1
            else:
                break
        return self._exact_one(x, self._py_cell_start[cell])

    def locate_one_3d(
        self, y0: float, y1: float, y2: float
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """``locate_one`` for a point of a 3-D locator, given as three numbers, unrolled
        (the common DP+EP surface, one query at a time)."""
        (
            mul0, mul1, mul2, add0, add1, add2, lo0, lo1, lo2, sc0, sc1, sc2, lut0, lut1, lut2,
            frames, flat, neighbors, hull, candidates, offsets, starts, simplices,
        ) = self._scalar_3d  # fmt: skip
        x0, x1, x2 = y0 * mul0 + add0, y1 * mul1 + add1, y2 * mul2 + add2
        # The cell, as ``_cell_one`` finds it.
        h0, h1, h2 = self._hint_forward_one((y0, y1, y2))
        top = FINE_BINS
        f = (h0 - lo0) * sc0
        cell = lut0[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]
        f = (h1 - lo1) * sc1
        cell += lut1[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]
        f = (h2 - lo2) * sc2
        cell += lut2[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]

        strict, near = -STRICT_TOL, -INSIDE_TOL
        s = starts[cell]
        pos, stop = offsets[cell] + 1, offsets[cell + 1]
        for _ in range(MAX_ROUNDS + 1):
            if flat[s]:
                if pos >= stop:
                    break
                s = candidates[pos]
                pos += 1
                continue
            t0, t1, t2, t3, t4, t5, t6, t7, t8, c0, c1, c2 = frames[s]
            w0 = c0 + t0 * x0 + t1 * x1 + t2 * x2
            w1 = c1 + t3 * x0 + t4 * x1 + t5 * x2
            w2 = c2 + t6 * x0 + t7 * x1 + t8 * x2
            w3 = 1.0 - w0 - w1 - w2
            low = min(w0, w1, w2, w3)
            if low >= strict:
                if low < 0.0:
                    h = hull[s]
                    if (
                        (w0 < 0.0 and h[0])
                        or (w1 < 0.0 and h[1])
                        or (w2 < 0.0 and h[2])
                        or (w3 < 0.0 and h[3])
                    ):
                        break  # held only on a hull face: the exact search decides
                    w0, w1, w2, w3 = max(w0, 0.0), max(w1, 0.0), max(w2, 0.0), max(w3, 0.0)
                total = w0 + w1 + w2 + w3
                return simplices[s], (w0 / total, w1 / total, w2 / total, w3 / total)
            if low >= near or pos >= stop:
                # Across the interior face it lies furthest beyond (first such face on ties).
                h = hull[s]
                best, face = 0.0, -1
                if not h[0] and w0 < best:
                    best, face = w0, 0
                if not h[1] and w1 < best:
                    best, face = w1, 1
                if not h[2] and w2 < best:
                    best, face = w2, 2
                if not h[3] and w3 < best:
                    face = 3
                if face < 0:
                    break
                s = neighbors[s][face]
            else:
                s = candidates[pos]
                pos += 1
        return self._exact_one((x0, x1, x2), self._py_cell_start[cell])
