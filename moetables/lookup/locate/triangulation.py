"""The triangulation a locator searches: scipy's Delaunay of the unit-scaled, slightly
perturbed vertices, one barycentric frame per simplex, the measured hull's planes, and the
containment tests every search shares (weights, acceptance, the step across a face).

Split from one 931-line module by owner (docs/architecture.md): this file owns the geometry;
`grid` the cell grid and each cell's candidates; `walk` the exact search; `search` the cell
search and the public `SimplexLocator`. The package docstring says how they work together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from scipy.spatial import ConvexHull, Delaunay

__all__ = [
    "BoolArray",
    "Columns",
    "FloatArray",
    "HintMap",
    "IntArray",
    "Snap",
    "Triangulation",
]

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
INSIDE_TOL = 1e-5
# The cell search accepts only a simplex holding the (nudged) point strictly, up to rounding.
STRICT_TOL = 1e-12
# Queries move this fraction of the way to the vertices' centroid before location, so a point
# on the measured hull lands inside it rather than on faces the perturbation may have shifted
# (answers move by about 1e-8 of the local variation, far below measurement precision).
NUDGE = 1e-8
MAX_STEPS = 512
# How far past a hull plane (in unit-scaled coordinates) a point still counts as on it.
HULL_TOL = 1e-9
# Cells of the grid per vertex, and at most (a cell costs 8 bytes and a little build time).
CELLS_PER_VERTEX = 96
MAX_CELLS = 1 << 18
# Fine bins per axis of the table mapping a hint coordinate to its cell (cells follow the
# vertices' distribution, so their edges need finer steps than the cells themselves).
FINE_BINS = 1 << 14
# Random sample points per cell, which find and order its candidates.
SAMPLES_PER_CELL = 2
# Rounds of the cell search (candidates and steps) before the exact search takes over.
MAX_ROUNDS = 64


class Triangulation:
    """A Delaunay triangulation of ``vertices`` (n x d, d >= 2) and its barycentric frames."""

    def __init__(self, vertices: FloatArray) -> None:
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
        # Queries map to unit coordinates, nudged, in one multiply-add per axis.
        self._unit_mul = (1.0 - NUDGE) / span
        self._unit_add = -lo * self._unit_mul + self._centre * NUDGE
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
            tri._transform = np.concatenate(  # type: ignore[attr-defined]
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

    # -- containment, for batches ----------------------------------------------------------

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
        accepted = low >= -STRICT_TOL
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

    def _outside_hull(self, points: FloatArray) -> BoolArray:
        """Whether each unit-scaled point lies past a supporting plane of the measured hull."""
        excess = points @ self._hull[:, :-1].T + self._hull[:, -1]
        return np.asarray((excess > HULL_TOL).any(axis=1), dtype=bool)
