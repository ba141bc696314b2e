"""Point location in a Delaunay triangulation, fast enough for millions of lookups.

scipy's ``Delaunay.find_simplex`` takes about 100 us a query on a 2,000-point N/A/M table
(measured, docs/benchmarks.md). scipy still builds the triangulation, once. At load, a grid
of cells is laid over the vertices, uniform in each axis's distribution of vertices in a
"hint" space the caller chooses, and each cell gets a short list of candidate simplices:
those that strictly hold random sample points of the cell (moved onto the integer points
queries take), most often found first, kept as flat arrays.

A query looks up its cell and tests the cell's first candidate. Missed, it tries the next
candidate, or, when the simplex at hand already holds it within tolerance (it lies just
beyond one face) or no candidate is left, steps across the interior face it lies furthest
beyond. The cell search answers only with a simplex holding the query strictly (every weight
>= 0 up to rounding), so its answer does not depend on the path: a batch, one point, any
split of a batch. Sampling orders the search and nothing else. A query still undecided after
``_MAX_ROUNDS`` rounds, one that would step out through the hull, and one held only on a hull
face go to the exact search, the visibility walk of before (scipy's compiled walk for
batches, plain float arithmetic for one point), which makes every refusal: crossing a hull
face means the point lies beyond a supporting plane of the convex hull, outside; so does a
point it holds only through its tolerance while past the measured hull's planes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.ndimage import distance_transform_edt
from scipy.spatial import ConvexHull, Delaunay

__all__ = ["HintMap", "SimplexLocator", "Snap"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Columns = Sequence[FloatArray]

# Maps of point coordinates (one array per axis) into the space where the cell grid is laid
# out: forward and inverse on columns, and forward on one point (the same arithmetic, so
# both paths agree on a cell); they decide only the order of the search, never an answer.
HintMap = tuple[
    Callable[[Columns], list[FloatArray]],
    Callable[[Columns], list[FloatArray]],
    Callable[[Sequence[float]], Sequence[float]],
]
# Moves points (one array per axis) onto the nearest point a query can take (integer N, A,
# M), so that candidates are ordered as queries will need them.
Snap = Callable[[Columns], list[FloatArray]]

# Barycentric weights this far below zero still count as inside in the exact search (the
# perturbation below and rounding on shared faces); they are clipped to zero before use, so
# the answer stays a convex combination.
_INSIDE_TOL = 1e-5
# The cell search accepts only a simplex holding the (nudged) point strictly, up to rounding.
_STRICT_TOL = 1e-12
# Queries move this fraction of the way to the vertices' centroid before location, so a point
# on the measured hull lands inside it rather than on faces the perturbation may have shifted
# (answers move by about 1e-8 of the local variation, far below measurement precision).
_NUDGE = 1e-8
_MAX_STEPS = 512
# How far past a hull plane (in unit-scaled coordinates) a point still counts as on it.
_HULL_TOL = 1e-9
# Cells of the grid per vertex, and at most (a cell costs 8 bytes and a little build time).
_CELLS_PER_VERTEX = 96
_MAX_CELLS = 1 << 18
# Fine bins per axis of the table mapping a hint coordinate to its cell (cells follow the
# vertices' distribution, so their edges need finer steps than the cells themselves).
_FINE_BINS = 1 << 14
# Random sample points per cell, which find and order its candidates.
_SAMPLES_PER_CELL = 2
# Rounds of the cell search (candidates and steps) before the exact search takes over.
_MAX_ROUNDS = 64


def _cells_per_axis(extents: Sequence[float], intervals: Sequence[int], cells: int) -> list[int]:
    """Cells per axis, about ``cells`` in all, in inverse proportion to the typical extent of
    a simplex along each axis (in the grid's warped coordinates): simplices then span about
    as many cells one way as another. Where an axis has fewer intervals between distinct
    values than cells, its cells are a whole number per interval, so that no cell straddles
    a plane of measured points. An axis of one value gets one cell."""
    live = [e for e in extents if e > 0.0]
    if not live:
        return [1] * len(extents)
    scale = (cells * math.prod(live)) ** (1.0 / len(live))
    out = []
    for extent, count in zip(extents, intervals, strict=True):
        if extent <= 0.0:
            out.append(1)
            continue
        want = max(2, round(scale / extent))
        out.append(count * max(1, round(want / count)) if count <= want else want)
    return out


def _identity(columns: Columns) -> list[FloatArray]:
    return list(columns)


def _identity_one(point: Sequence[float]) -> Sequence[float]:
    return point


class SimplexLocator:
    """A Delaunay triangulation of ``vertices`` (n x d, d >= 2) with a cell-candidate locator."""

    def __init__(
        self,
        vertices: FloatArray,
        *,
        cells_per_vertex: int = _CELLS_PER_VERTEX,
        hint_map: HintMap | None = None,
        snap: Snap | None = None,
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
        given = vertices
        exact = (vertices - lo) / span
        vertices = exact + jitter * 1e-10
        self.scale_lo, self.scale_span = lo, span
        self.vertices = vertices
        self._centre = exact.mean(axis=0)
        # Queries map to unit coordinates, nudged, in one multiply-add per axis.
        self._unit_mul = (1.0 - _NUDGE) / span
        self._unit_add = -lo * self._unit_mul + self._centre * _NUDGE
        self._py_unit_mul = self._unit_mul.tolist()
        self._py_unit_add = self._unit_add.tolist()
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
        self._delaunay = tri
        self._tri: Delaunay | None = tri
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
        # The same frames one row per coefficient (gathering one coefficient for many
        # queries is several times faster than gathering whole frames); NaN for a flat
        # simplex, which then holds nothing.
        self._frame_rows: FloatArray = np.ascontiguousarray(
            np.where(self.flat[None, :], np.nan, self.frames.T)
        )
        self._neighbor_rows: IntArray = self.neighbors.ravel().copy()
        # Which faces of each simplex lie on the hull (no neighbour across them).
        self._hull_face: BoolArray = np.ascontiguousarray((self.neighbors < 0).T)

        forward, inverse, forward_one = hint_map or (_identity, _identity, _identity_one)
        self._hint_forward, self._hint_inverse = forward, inverse
        self._hint_forward_one = forward_one
        self._build_grid(given, cells_per_vertex * n)
        self._build_candidates(snap)

    # The triangulation as Python objects, for the scalar path: built on its first query
    # (a process that only asks batches never pays for them).

    @functools.cached_property
    def _py_simplices(self) -> list[tuple[int, ...]]:
        return list(map(tuple, self.simplices.tolist()))

    @functools.cached_property
    def _py_neighbors(self) -> list[tuple[int, ...]]:
        return list(map(tuple, self.neighbors.tolist()))

    @functools.cached_property
    def _py_frames(self) -> list[tuple[float, ...]]:
        return list(map(tuple, self.frames.tolist()))

    @functools.cached_property
    def _py_flat(self) -> list[bool]:
        return list(self.flat.tolist())

    @functools.cached_property
    def _py_proper(self) -> list[bool]:
        return list(self.proper.tolist())

    @functools.cached_property
    def _py_hull_face(self) -> list[tuple[bool, ...]]:
        return list(map(tuple, (self.neighbors < 0).tolist()))

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

    # -- the cell grid -------------------------------------------------------------------

    def _build_grid(self, vertices: FloatArray, target: int) -> None:
        """Per axis, a table from fine bins of the hint coordinate to cells, the cells
        uniform in the distribution of the vertices' hint coordinates; about ``target``
        cells in all, shared out by ``_cells_per_axis``."""
        d = self.dim
        hinted = self._hint_forward([vertices[:, a].copy() for a in range(d)])
        # Each vertex's rank on each axis (0..1 over the distinct values there), and the
        # median extent of the (non-flat) simplices in ranks along each axis.
        extents, intervals = [], []
        for h in hinted:
            knots = np.unique(h)
            ranks = np.searchsorted(knots, h) / max(len(knots) - 1, 1)
            spread = np.ptp(ranks[self.simplices[~self.flat]], axis=1)
            extents.append(float(np.median(spread)) if len(knots) > 1 and spread.size else 0.0)
            intervals.append(len(knots) - 1)
        self.cells_per_axis = _cells_per_axis(extents, intervals, min(target, _MAX_CELLS))
        self._strides = [int(np.prod(self.cells_per_axis[:a])) for a in range(d)]
        self._bin_lo: list[float] = []
        self._bin_scale: list[float] = []
        self._luts: list[npt.NDArray[np.int32]] = []
        # Per axis, each cell's extent in hint space (empty for cells no bin maps to).
        self._extents: list[tuple[FloatArray, FloatArray]] = []
        for axis in range(d):
            per_axis = self.cells_per_axis[axis]
            cells = np.arange(per_axis)
            knots = np.unique(hinted[axis])
            low, high = float(knots[0]), float(knots[-1])
            scale = _FINE_BINS / (high - low) if high > low else 0.0
            if scale > 0.0:
                centres = low + (np.arange(_FINE_BINS) + 0.5) / scale
                rank = np.interp(centres, knots, np.linspace(0.0, 1.0, len(knots)))
                lut = np.minimum(np.floor(rank * per_axis), per_axis - 1).astype(np.int64)
                cell_lo = low + np.searchsorted(lut, cells, side="left") / scale
                cell_hi = low + np.searchsorted(lut, cells, side="right") / scale
            else:  # one value on this axis: every point lies in cell 0, a point
                lut = np.zeros(_FINE_BINS, dtype=np.int64)
                cell_lo = np.where(cells == 0, low, np.nan)
                cell_hi = cell_lo.copy()
            self._bin_lo.append(low)
            self._bin_scale.append(scale)
            # Each table holds its cell index already multiplied by the axis's stride, so
            # a cell index is a sum (axis 0 varies fastest).
            self._luts.append((lut * self._strides[axis]).astype(np.int32))
            self._extents.append((cell_lo, cell_hi))
        self.cell_count = int(np.prod(self.cells_per_axis))
        # Memoryviews: the scalar path reads Python ints from the same buffers, no copies.
        self._py_luts = [lut.data for lut in self._luts]

    def _cell_axis(self, cells: IntArray, axis: int) -> IntArray:
        return cells // self._strides[axis] % self.cells_per_axis[axis]

    def _build_candidates(self, snap: Snap | None) -> None:
        """Each cell's candidates: the simplices strictly holding random sample points of
        the cell (moved by ``snap`` onto points queries take), most often found first, as
        flat arrays (``cell_candidates[cell_offsets[c]:cell_offsets[c + 1]]``)."""
        d = self.dim
        # Cells some query can reach: those of nonzero extent on every axis.
        cells = np.arange(self.cell_count)
        reachable = np.ones(self.cell_count, dtype=bool)
        for axis in range(d):
            cell_lo, cell_hi = self._extents[axis]
            usable = (cell_hi > cell_lo) | ((cell_hi == cell_lo) & (self._bin_scale[axis] == 0.0))
            reachable &= usable[self._cell_axis(cells, axis)]
        # Samples go cell by cell, so each of scipy's walks starts next to the last one's end.
        cells = np.repeat(cells[reachable], _SAMPLES_PER_CELL)
        rng = np.random.default_rng(0x5EED)
        hint = []
        for axis in range(d):
            cell_lo, cell_hi = self._extents[axis]
            at = self._cell_axis(cells, axis)
            hint.append(cell_lo[at] + (cell_hi[at] - cell_lo[at]) * rng.random(len(cells)))
        samples = self._hint_inverse(hint)
        if snap is not None:
            samples = snap(samples)
        usable = np.ones(len(cells), dtype=bool)
        for column in samples:
            usable &= np.isfinite(column)
        samples = [column[usable] for column in samples]
        # A sample that ``snap`` moved counts for the cell it has moved to.
        cells = self._cells_of(self._hint_forward(samples))
        columns = self._unit(samples)
        scipy_found = self._delaunay.find_simplex(np.stack(columns, axis=1), tol=_INSIDE_TOL)
        found = self._settle(columns, scipy_found.astype(np.int64))
        hit = found >= 0
        base = len(self.simplices)
        key, hits = np.unique(cells[hit] * base + found[hit], return_counts=True)
        cell_of, simplex_of = key // base, key % base
        order = np.lexsort((simplex_of, -hits, cell_of))
        self.cell_candidates: npt.NDArray[np.int32] = simplex_of[order].astype(np.int32)
        offsets = np.zeros(self.cell_count + 1, dtype=np.int64)
        np.cumsum(np.bincount(cell_of, minlength=self.cell_count), out=offsets[1:])
        self.cell_offsets: npt.NDArray[np.int32] = offsets.astype(np.int32)
        filled = offsets[1:] > offsets[:-1]
        # Where each cell's search starts: its first candidate, or, for a cell without any
        # (off the hull, or where the samples missed its few query points), the first
        # candidate of the nearest cell (in cell steps) that has one, from which it steps.
        start = np.zeros(self.cell_count, dtype=np.int64)
        if len(order):
            shape = tuple(reversed(self.cells_per_axis))  # C order: axis 0 varies fastest
            nearest = distance_transform_edt(
                ~filled.reshape(shape), return_distances=False, return_indices=True
            )
            near = np.ravel_multi_index(tuple(nearest), shape).ravel()
            start = self.cell_candidates[offsets[:-1][near]].astype(np.int64)
        self.cell_start: npt.NDArray[np.int32] = start.astype(np.int32)
        self._py_cell_start = self.cell_start.data
        self._py_offsets = self.cell_offsets.data
        self._py_candidates = self.cell_candidates.data

    def _settle(self, columns: Columns, found: IntArray, steps: int = 8) -> IntArray:
        """From simplices holding points within tolerance to those holding them strictly:
        a few steps across the most negative interior face; -1 for a point not settled."""
        found = found.copy()
        active = np.flatnonzero(found >= 0)
        cur = found[active]
        for _ in range(steps):
            if active.size == 0:
                break
            w = self._weights([c.take(active, mode="clip") for c in columns], cur)
            accepted, _, _ = self._accept(w, cur)
            found[active[accepted]] = cur[accepted]
            nxt = self._step(cur, w)
            go = ~accepted & (nxt >= 0)
            found[active[~accepted & ~go]] = -1
            active, cur = active[go], nxt[go]
        found[active] = -1
        return found

    def _cells_of(self, hint: Sequence[FloatArray]) -> IntArray:
        cell = np.zeros(len(hint[0]), dtype=np.int64)
        fine = np.empty(len(hint[0]))
        index = np.empty(len(hint[0]), dtype=np.int64)
        for axis in range(self.dim):
            np.subtract(hint[axis], self._bin_lo[axis], out=fine)
            fine *= self._bin_scale[axis]
            # Truncation toward zero, then bins past either end clipped to the end bins, as
            # ``_cell_one`` does (NaN, cast to the most negative integer, lands in bin 0).
            with np.errstate(invalid="ignore"):
                np.copyto(index, fine, casting="unsafe")
            cell += self._luts[axis].take(index, mode="clip")
        return cell

    def _cell_one(self, hint: Sequence[float]) -> int:
        cell = 0
        for axis in range(self.dim):
            fine = (hint[axis] - self._bin_lo[axis]) * self._bin_scale[axis]
            b = (
                int(fine)
                if 0.0 < fine < _FINE_BINS
                else (_FINE_BINS - 1 if fine >= _FINE_BINS else 0)
            )
            cell += self._py_luts[axis][b]
        return cell

    # -- batches ---------------------------------------------------------------------------

    def _unit(self, columns: Columns) -> list[FloatArray]:
        out = []
        for axis, column in enumerate(columns):
            u = column * self._unit_mul[axis]
            u += self._unit_add[axis]
            out.append(u)
        return out

    def _weights(self, unit: Sequence[FloatArray], simplex: IntArray) -> list[FloatArray]:
        """Barycentric weights of each point in its simplex, one array per corner.

        (Gathers here and below use ``mode="clip"`` on indices that are valid anyway: it
        skips numpy's bounds check, which costs more than the gather.)
        """
        d, rows = self.dim, self._frame_rows
        out = []
        term = np.empty(len(simplex))
        last = np.ones(len(simplex))
        for i in range(d):
            acc = rows[d * d + i].take(simplex, mode="clip")
            for j in range(d):
                rows[i * d + j].take(simplex, out=term, mode="clip")
                term *= unit[j]
                acc += term
            out.append(acc)
            last -= acc
        out.append(last)
        return out

    def _accept(
        self, weights: list[FloatArray], simplex: IntArray
    ) -> tuple[BoolArray, BoolArray, FloatArray]:
        """Which points their simplex strictly holds (every weight >= 0 up to rounding),
        which it holds only on a hull face (left to the exact search, so that refusals stay
        its decision), and each point's least weight."""
        low = weights[0]
        for w in weights[1:]:
            low = np.minimum(low, w)
        accepted = low >= -_STRICT_TOL
        across = np.zeros(len(low), dtype=bool)
        doubt = np.flatnonzero(accepted & (low < 0.0))
        if doubt.size:
            s = simplex.take(doubt)
            bad = np.zeros(doubt.size, dtype=bool)
            for k, w in enumerate(weights):
                bad |= (w.take(doubt) < 0.0) & self._hull_face[k].take(s)
            accepted[doubt[bad]] = False
            across[doubt[bad]] = True
        return accepted, across, low

    def _step(self, simplex: IntArray, weights: list[FloatArray]) -> IntArray:
        """The neighbour across the interior face each point lies furthest beyond (the
        first such face on ties); -1 where it lies beyond no interior face."""
        face = np.zeros(len(simplex), dtype=np.int64)
        low = np.full(len(simplex), np.inf)
        for k, w in enumerate(weights):
            w = np.where(self._hull_face[k].take(simplex, mode="clip"), np.inf, w)
            face[w < low] = k
            low = np.minimum(low, w)
        nxt: IntArray = self._neighbor_rows.take(simplex * (self.dim + 1) + face, mode="clip")
        nxt[~(low < 0.0)] = -1
        return nxt

    def search(self, columns: Columns) -> tuple[IntArray, list[FloatArray]]:
        """Simplex index (-1 outside) and raw weights (one array per corner) of each point.

        ``columns`` holds one coordinate array per axis. Weights of points outside are
        undefined; inside, they sum to 1 and are at least ``-_STRICT_TOL`` where the cell
        search decided, ``-_INSIDE_TOL`` where the exact search did (not yet clipped).
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
            for _ in range(_MAX_ROUNDS):
                walk = low.take(miss) >= -_INSIDE_TOL
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

    # -- the exact search ----------------------------------------------------------------

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
        found[order] = self._tri.find_simplex(points[order], tol=_INSIDE_TOL)
        again = (found < 0) | self.flat[np.maximum(found, 0)]
        if again.any():
            rows = np.flatnonzero(again)
            found[rows] = self._walk(points[rows], start[rows])
        inside = found >= 0
        if inside.any():
            w = self._barycentric(points[inside], found[inside])
            bad = w.min(axis=1) < -_INSIDE_TOL
            if bad.any():  # never expected: re-walk rather than return a non-convex weight
                rows = np.flatnonzero(inside)[bad]
                found[rows] = self._walk(points[rows], start[rows])
        return found

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

    def _walk(self, points: FloatArray, current: IntArray) -> IntArray:
        """Walk each point from ``current``; -1 once a hull face is crossed."""
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

    def _outside_hull(self, points: FloatArray) -> BoolArray:
        """Whether each unit-scaled point lies past a supporting plane of the measured hull."""
        excess = points @ self._hull[:, :-1].T + self._hull[:, -1]
        return np.asarray((excess > _HULL_TOL).any(axis=1), dtype=bool)

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

    # -- one point -------------------------------------------------------------------------

    def locate_one(
        self, point: Sequence[float]
    ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """Vertex indices and weights of the simplex holding ``point``, or None outside.

        The same rounds as ``search``, one point in plain float arithmetic, so both paths
        settle on the same simplex.
        """
        d = self.dim
        if d == 3:
            return self.locate_one_3d(point[0], point[1], point[2])
        mul, add = self._py_unit_mul, self._py_unit_add
        cell = self._cell_one(self._hint_forward_one(point))
        x = [point[a] * mul[a] + add[a] for a in range(d)]
        frames, flat, neighbors = self._py_frames, self._py_flat, self._py_neighbors
        hull, candidates = self._py_hull_face, self._py_candidates
        s = self._py_cell_start[cell]
        pos, stop = self._py_offsets[cell] + 1, self._py_offsets[cell + 1]
        for _ in range(_MAX_ROUNDS + 1):
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
                if low >= -_STRICT_TOL:
                    if low < 0.0 and any(v < 0.0 and h for v, h in zip(w, hull[s], strict=True)):
                        break  # held only on a hull face: the exact search decides
                    clipped = [v if v > 0.0 else 0.0 for v in w]
                    total = 0.0
                    for v in clipped:
                        total += v
                    return self._py_simplices[s], tuple(v / total for v in clipped)
            if w is not None and (low >= -_INSIDE_TOL or pos >= stop):
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
        top = _FINE_BINS
        f = (h0 - lo0) * sc0
        cell = lut0[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]
        f = (h1 - lo1) * sc1
        cell += lut1[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]
        f = (h2 - lo2) * sc2
        cell += lut2[int(f) if 0.0 < f < top else (top - 1 if f >= top else 0)]

        strict, near = -_STRICT_TOL, -_INSIDE_TOL
        s = starts[cell]
        pos, stop = offsets[cell] + 1, offsets[cell + 1]
        for _ in range(_MAX_ROUNDS + 1):
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
        d = self.dim
        cur = start
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
