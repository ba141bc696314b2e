"""The cell grid of a locator: cells laid over the vertices in a hint space the caller
chooses, and per cell a short list of candidate simplices, most often found first.

Sampling orders the search and nothing else: the cell search (`search`) accepts only a simplex
holding the query strictly, so no choice made here can change an answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.ndimage import distance_transform_edt

from moetables.lookup.locate.triangulation import (
    CELLS_PER_VERTEX,
    FINE_BINS,
    INSIDE_TOL,
    MAX_CELLS,
    SAMPLES_PER_CELL,
    Columns,
    FloatArray,
    HintMap,
    IntArray,
    Snap,
    Triangulation,
)

__all__ = ["CellGrid"]


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


class CellGrid(Triangulation):
    """The triangulation with its cell grid and each cell's candidate simplices."""

    def __init__(
        self,
        vertices: FloatArray,
        *,
        cells_per_vertex: int = CELLS_PER_VERTEX,
        hint_map: HintMap | None = None,
        snap: Snap | None = None,
    ) -> None:
        super().__init__(vertices)
        forward, inverse, forward_one = hint_map or (_identity, _identity, _identity_one)
        self._hint_forward, self._hint_inverse = forward, inverse
        self._hint_forward_one = forward_one
        self._build_grid(vertices, cells_per_vertex * len(vertices))
        self._build_candidates(snap)

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
        self.cells_per_axis = _cells_per_axis(extents, intervals, min(target, MAX_CELLS))
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
            scale = FINE_BINS / (high - low) if high > low else 0.0
            if scale > 0.0:
                centres = low + (np.arange(FINE_BINS) + 0.5) / scale
                rank = np.interp(centres, knots, np.linspace(0.0, 1.0, len(knots)))
                lut = np.minimum(np.floor(rank * per_axis), per_axis - 1).astype(np.int64)
                cell_lo = low + np.searchsorted(lut, cells, side="left") / scale
                cell_hi = low + np.searchsorted(lut, cells, side="right") / scale
            else:  # one value on this axis: every point lies in cell 0, a point
                lut = np.zeros(FINE_BINS, dtype=np.int64)
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
        cells = np.repeat(cells[reachable], SAMPLES_PER_CELL)
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
        scipy_found = self._delaunay.find_simplex(np.stack(columns, axis=1), tol=INSIDE_TOL)
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
            b = int(fine) if 0.0 < fine < FINE_BINS else (FINE_BINS - 1 if fine >= FINE_BINS else 0)
            cell += self._py_luts[axis][b]
        return cell
