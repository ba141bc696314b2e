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
``MAX_ROUNDS`` rounds, one that would step out through the hull, and one held only on a hull
face go to the exact search, the visibility walk of before (scipy's compiled walk for
batches, plain float arithmetic for one point), which makes every refusal: crossing a hull
face means the point lies beyond a supporting plane of the convex hull, outside; so does a
point it holds only through its tolerance while past the measured hull's planes.
"""

from __future__ import annotations

from moetables.lookup.locate.search import SimplexLocator
from moetables.lookup.locate.triangulation import INSIDE_TOL, STRICT_TOL, HintMap, Snap

__all__ = ["INSIDE_TOL", "STRICT_TOL", "HintMap", "SimplexLocator", "Snap"]
