"""The cell-candidate point locator against the exact search it replaced (R40).

Synthetic tables here exist only inside tests; their times come from formulas stated below,
never from a measurement.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.geometry import ExpertGeometry, MoeTarget
from moetables.lookup import OK
from moetables.lookup.locate import INSIDE_TOL, STRICT_TOL, SimplexLocator
from moetables.lookup.surface import ExpertSurface
from tests.moetables.conftest import expert_points


def geometric(top: int, factor: float) -> list[int]:
    values, x = {1, top}, 1.0
    while x < top:
        values.add(round(x))
        x *= factor
    return sorted(v for v in values if 1 <= v <= top)


def rugged(n: int, a: int, m: int) -> float:
    """Far from affine: a point interpolated in the wrong simplex shows in its value."""
    return 1.0 + ((n * 7919 + a * 104729 + m * 13) % 997) / 10


def plan_surface(coordinates: str = "raw", experts: int = 32, top_k: int = 4) -> ExpertSurface:
    """A plan-shaped table (N geometric by sqrt 2, A by sqrt 2, M by 2 plus its bounds and
    the balanced total), by default E=32, k=4 at EP2: the slivers of the real grids, at
    test size."""
    g = ExpertGeometry.for_target(experts, top_k, MoeTarget.for_rank(1, 2, 0))
    rows = []
    for n in geometric(256, math.sqrt(2)):
        for a in sorted(set(geometric(g.local_experts, math.sqrt(2))) | {g.top_k}):
            low, high = g.assignment_bounds(n, a)
            if low > high:
                continue
            for m in sorted(set(geometric(high, 2.0)) | {low, high, g.balanced_total(n)}):
                if g.feasible(n, a, m):
                    rows.append((n, a, m))
    arr = np.array(rows, dtype=np.int64)
    times = np.array([rugged(*r) for r in rows])
    return ExpertSurface(
        arr[:, 0],
        arr[:, 1],
        arr[:, 2],
        times,
        g,
        label="plan",
        coordinates=coordinates,  # type: ignore[arg-type]
    )


_PLAN = plan_surface()


def integer_queries(surface: ExpertSurface, count: int, seed: int) -> np.ndarray:
    """Feasible integer (N, A, M), log-uniform (infeasible draws dropped), a share of them
    on M's bounds, and some N past the measured support (outside the hull)."""
    g = surface.geometry
    rng = np.random.default_rng(seed)
    top = surface.support[1]
    n = np.exp(rng.uniform(0, math.log(top * 1.3), count)).astype(np.int64).clip(1)
    a = np.exp(rng.uniform(0, math.log(g.local_experts), count)).astype(np.int64)
    a = np.minimum(a.clip(1, g.local_experts), n * g.top_k)
    low = np.maximum(a, n * max(0, g.top_k - g.remote_experts))
    high = n * np.minimum(g.top_k, a)
    keep = low <= high
    n, a, low, high = n[keep], a[keep], low[keep], high[keep]
    m = np.exp(rng.uniform(np.log(low), np.log(high) + 1e-12)).astype(np.int64).clip(low, high)
    edge = rng.random(len(m))
    m = np.where(edge < 0.1, low, np.where(edge > 0.9, high, m))
    return np.stack([n, a, m], axis=1)


def reduced(surface: ExpertSurface, queries: np.ndarray) -> np.ndarray:
    q = queries.astype(np.float64)
    return surface._transform(q[:, 0], q[:, 1], q[:, 2]) - surface._mean


def geometric_points(locator: SimplexLocator, count: int, seed: int) -> np.ndarray:
    """Points in the locator's own coordinates: inside simplices, on their facets, edges
    and vertices, and just outside the hull (vertices pushed away from the centroid)."""
    rng = np.random.default_rng(seed)
    corners = locator.vertices * locator.scale_span + locator.scale_lo
    simplex = locator.simplices[rng.integers(0, len(locator.simplices), count)]
    weights = rng.dirichlet(np.ones(locator.dim + 1), count)
    kind = rng.integers(0, 4, count)
    for zeros, rows in ((1, kind == 1), (2, kind == 2), (locator.dim, kind == 3)):
        # facets, edges (3-D) and vertices: weights of some corners set to zero
        for i in np.flatnonzero(rows):
            weights[i, rng.permutation(locator.dim + 1)[:zeros]] = 0.0
            weights[i] /= weights[i].sum()
    inside = np.einsum("ij,ijk->ik", weights, corners[simplex])
    centre = corners.mean(axis=0)
    pushed = corners[rng.integers(0, len(corners), count // 4)]
    scale = np.exp(rng.uniform(math.log(1e-9), math.log(1e-2), (len(pushed), 1)))
    outside = pushed + (pushed - centre) * scale
    return np.concatenate([inside, outside])


def raw_weights(locator: SimplexLocator, points: np.ndarray, simplex: np.ndarray) -> np.ndarray:
    """Weights of each (nudged, unit-scaled) point in the given simplex, before clipping."""
    unit = np.stack(locator._unit([points[:, a] for a in range(locator.dim)]), axis=1)
    return locator._barycentric(unit, simplex)


def check_against_walk(locator: SimplexLocator, points: np.ndarray) -> None:
    found, weights = locator.locate(points)
    walked, _ = locator.locate_by_walk(points)
    unit = np.stack(locator._unit([points[:, a] for a in range(locator.dim)]), axis=1)
    outside = locator._outside_hull(unit)
    # Refusals stay refusals, and nothing past the measured hull is answered: a point only
    # the walk answers lies past the hull, held through the walk's tolerance.
    assert not (found[walked < 0] >= 0).any()
    assert not outside[found >= 0].any()
    assert outside[(walked >= 0) & (found < 0)].all()
    both = np.flatnonzero((found >= 0) & (walked >= 0))
    mine = raw_weights(locator, points[both], found[both])
    theirs = raw_weights(locator, points[both], walked[both])
    # Where the walk's simplex holds the point with room to spare, it is the only one that
    # does: the same simplex. Elsewhere the point lies on a boundary between simplices and
    # each holds it (the new one strictly, up to rounding, unless the exact search decided).
    clear = theirs.min(axis=1) >= 1e-9
    assert np.array_equal(found[both][clear], walked[both][clear])
    assert (mine.min(axis=1) >= -INSIDE_TOL).all()
    assert (theirs.min(axis=1) >= -INSIDE_TOL).all()
    held = theirs.min(axis=1) >= 0.0
    assert (mine.min(axis=1)[held] >= -STRICT_TOL).all()
    # At most d+1 vertices, nonnegative weights summing to one (R40).
    inside = found >= 0
    assert weights.shape[1] == locator.dim + 1
    assert (weights[inside] >= 0.0).all()
    assert np.allclose(weights[inside].sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (weights[~inside] == 0.0).all()


def test_it_finds_the_simplex_the_walk_finds_on_geometric_points() -> None:  # R40
    """Inside, on facets, edges and vertices, and just outside the hull."""
    locator = _PLAN._locator
    assert locator is not None
    check_against_walk(locator, geometric_points(locator, 20_000, seed=1))


def test_it_finds_the_simplex_the_walk_finds_on_integer_queries() -> None:  # R40, R5
    """Queries as simulators send them: integers, many on measured planes and M's bounds."""
    locator = _PLAN._locator
    assert locator is not None
    check_against_walk(locator, reduced(_PLAN, integer_queries(_PLAN, 20_000, seed=2)))


def test_it_finds_the_simplex_the_walk_finds_in_log_coordinates() -> None:  # R40
    surface = plan_surface("log")
    assert surface._locator is not None
    check_against_walk(surface._locator, reduced(surface, integer_queries(surface, 10_000, 3)))
    check_against_walk(surface._locator, geometric_points(surface._locator, 5_000, seed=4))


def test_it_finds_the_simplex_the_walk_finds_with_a_floor_on_pairs() -> None:  # R40, R5
    """E=12, k=8 at EP2: 6 remote experts, so every token places at least 2 choices here
    (M >= 2N), a lower bound on M the cell grid's coordinates follow."""
    surface = plan_surface(experts=12, top_k=8)
    assert surface._locator is not None
    assert surface.geometry.top_k - surface.geometry.remote_experts == 2
    check_against_walk(surface._locator, reduced(surface, integer_queries(surface, 10_000, 8)))


def ep1_surface() -> ExpertSurface:
    """EP1: M = N*k removes an axis; the locator then works in the plane's own basis."""
    g = ExpertGeometry.for_target(16, 4, MoeTarget.for_rank(1, 1, 0))
    points = expert_points(g, geometric(128, math.sqrt(2)))
    arr = np.array(points, dtype=np.int64)
    return ExpertSurface(
        arr[:, 0], arr[:, 1], arr[:, 2], np.array([rugged(*p) for p in points]), g, label="t"
    )


def test_it_finds_the_simplex_the_walk_finds_in_two_dimensions() -> None:  # R40
    surface = ep1_surface()
    assert surface.dimension == 2 and surface._locator is not None
    check_against_walk(surface._locator, geometric_points(surface._locator, 10_000, seed=5))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(1, 16), st.data())
def test_it_agrees_with_the_walk_on_any_integer_query(
    n: int, a: int, data: st.DataObject
) -> None:  # R40
    g = _PLAN.geometry
    low, high = g.assignment_bounds(n, a)
    if low > high:
        return
    m = data.draw(st.integers(max(1, low - 2), high + 2))
    locator = _PLAN._locator
    assert locator is not None
    check_against_walk(locator, reduced(_PLAN, np.array([[n, a, m]])))


def test_it_answers_the_same_without_any_candidates() -> None:  # R40
    """Correctness never depends on the sampling: with every cell's candidate list emptied
    and every search starting from simplex 0, the answers are the same."""
    surface = plan_surface()
    locator = surface._locator
    assert locator is not None
    queries = integer_queries(surface, 5_000, seed=6)
    points = reduced(surface, queries)
    found, _ = locator.locate(points)
    scalar = [locator.locate_one(tuple(p)) for p in points[:500]]
    locator.cell_offsets[:] = 0
    locator.cell_start[:] = 0
    again, _ = locator.locate(points)
    assert np.array_equal(again >= 0, found >= 0)
    # Searches now run long and many end in the exact search, which accepts a simplex
    # holding the point within its tolerance: where that one holds it with room to spare,
    # it is the simplex found before; elsewhere both hold the point.
    inside = np.flatnonzero(found >= 0)
    weights_again = raw_weights(locator, points[inside], again[inside])
    clear = weights_again.min(axis=1) >= 1e-9
    assert np.array_equal(again[inside][clear], found[inside][clear])
    assert (weights_again.min(axis=1) >= -INSIDE_TOL).all()
    assert [locator.locate_one(tuple(p)) is None for p in points[:500]] == [
        s is None for s in scalar
    ]


@pytest.mark.parametrize("make", [plan_surface, ep1_surface], ids=["3-D", "EP1 2-D"])
def test_it_answers_batches_and_single_queries_alike(make) -> None:  # type: ignore[no-untyped-def]  # R40
    """Batch, one query at a time, and any split of a batch: the same number, bit for bit
    (the cell search accepts only a simplex holding the point strictly, so no path picks
    another)."""
    surface = make()
    queries = integer_queries(surface, 4_000, seed=7)
    assert len(queries) > 500
    n, a, m = queries[:, 0], queries[:, 1], queries[:, 2]
    values, codes = surface.batch(n, a, m)
    halves = [
        surface.batch(n[i : i + 333], a[i : i + 333], m[i : i + 333]) for i in range(0, 4_000, 333)
    ]
    assert np.array_equal(np.concatenate([h[0] for h in halves]), values, equal_nan=True)
    for i in range(len(queries)):
        if codes[i] == OK:
            assert surface.time(int(n[i]), int(a[i]), int(m[i])) == values[i]


def test_it_keeps_candidate_lists_well_formed() -> None:
    locator = _PLAN._locator
    assert locator is not None
    offsets, candidates = locator.cell_offsets, locator.cell_candidates
    assert offsets[0] == 0 and offsets[-1] == len(candidates)
    assert (np.diff(offsets) >= 0).all()
    assert len(offsets) == locator.cell_count + 1 == math.prod(locator.cells_per_axis) + 1
    assert ((candidates >= 0) & (candidates < len(locator.simplices))).all()
    assert not locator.flat[candidates].any()
    assert ((locator.cell_start >= 0) & (locator.cell_start < len(locator.simplices))).all()
    # no simplex twice in one cell
    for c in range(0, locator.cell_count, 97):
        own = candidates[offsets[c] : offsets[c + 1]]
        assert len(set(own.tolist())) == len(own)


@pytest.mark.parametrize("coordinates", ["raw", "log"])
def test_it_returns_stored_rows_verbatim_and_refuses_past_the_hull(coordinates: str) -> None:  # R40
    surface = plan_surface(coordinates)
    keys = surface._keys
    n, a, m = keys >> 42, (keys >> 21) & ((1 << 21) - 1), keys & ((1 << 21) - 1)
    values, codes = surface.batch(n, a, m)
    assert (codes == OK).all() and np.array_equal(values, surface._key_times)
    top = surface.support[1]
    past = surface.batch(np.array([top + 1, top + 50]), np.array([2, 4]), np.array([4, 8]))
    assert past[1].tolist() == [1, 1] and np.isnan(past[0]).all()
