"""Lookups: deployment selection, caches, local curves, expert surfaces (R39, R40, R42, R43)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.bundle import write_bundle
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.geometry import ExpertGeometry, MoeTarget
from moetables.lookup import INVALID, OK, OUT_OF_SUPPORT, ComponentTables
from moetables.lookup.surface import ExpertSurface
from tests.moetables.conftest import expert_points, log_affine, make_spec, raw_affine

HIST = "tp1/moe_components/1bab816900f45218fbe1a37b885878164202f9e55f26772cc7390736e0b9b535"


def rows_of(path: Path) -> list[list[str]]:
    return [line.split(",") for line in path.read_text().splitlines()[1:]]


def test_it_returns_every_stored_row_verbatim(current_bundle: Path) -> None:  # R40
    tables = ComponentTables(current_bundle)
    deployment = tables.deployment(1, 2, 0)
    for component, mode, n, a, m, t in rows_of(
        current_bundle / "tp1" / deployment.entry.table_path.split("tp1/", 1)[1]
    ):
        assert deployment.time_us(component, int(n), int(a), int(m), mode) == float(t)
        batch = deployment.batch(component, [int(n)], [int(a)], [int(m)], mode)
        assert batch.code[0] == OK and batch.time_us[0] == float(t)


def test_it_interpolates_a_raw_affine_surface_exactly_inside(current_bundle: Path) -> None:  # R40
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    g = deployment.entry.geometry
    checked = 0
    for n in (3, 5, 12, 40):
        for a in (1, 2, 5, 7):
            low, high = g.assignment_bounds(n, a)
            for m in {low, high, (low + high) // 2}:
                if not g.feasible(n, a, m):
                    continue
                try:
                    value = deployment.time_us("experts", n, a, m)
                except CoverageError:
                    continue  # outside the hull of this coarse grid: refused, never guessed
                assert value == pytest.approx(raw_affine(n, a, m), rel=1e-6)
                checked += 1
    assert checked > 20


def test_it_can_triangulate_in_log_coordinates(tmp_path: Path) -> None:
    spec = make_spec(MoeTarget.for_rank(1, 2, 0), time_fn=log_affine)
    write_bundle(tmp_path / "b", {"hardware": "T", "model": "t/m", "variant": "bf16"}, [spec])
    deployment = ComponentTables(tmp_path / "b", coordinates="log").deployment(1, 2, 0)
    assert deployment.time_us("experts", 12, 3, 30) == pytest.approx(
        log_affine(12, 3, 30), rel=1e-6
    )


def test_it_refuses_queries_beyond_measured_tokens(current_bundle: Path) -> None:  # R40
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    with pytest.raises(CoverageError, match="outside the measured support"):
        deployment.time_us("experts", 65, 4, 130)
    with pytest.raises(CoverageError, match="outside measured"):
        deployment.time_us("gate_routing", 65)
    result = deployment.batch("experts", [65, 64], [4, 4], [130, 128])
    assert result.code.tolist() == [OUT_OF_SUPPORT, OK]


def test_it_calls_infeasible_points_invalid(current_bundle: Path) -> None:  # R5
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    with pytest.raises(QueryError, match="infeasible"):
        deployment.time_us("experts", 4, 2, 9)  # M > N*min(k, A)
    assert deployment.batch("experts", [4], [9], [9]).code[0] == INVALID  # A > L = 8


def test_it_answers_all_remote_points_from_their_own_curve(current_bundle: Path) -> None:
    deployment = ComponentTables(current_bundle).deployment(1, 2, 1)
    assert deployment.time_us("experts", 3, 0, 0) == pytest.approx(1.0 + 0.02 * 3)
    local = ComponentTables(current_bundle).deployment(1, 1, 0)
    with pytest.raises(QueryError, match="E-L >= k"):
        local.time_us("experts", 3, 0, 0)  # at EP1 no choice can be remote


def test_it_removes_the_dependent_axis_at_ep1(current_bundle: Path) -> None:  # R40
    deployment = ComponentTables(current_bundle).deployment(1, 1, 0)
    surface = deployment._experts[("experts", "eager")]
    assert isinstance(surface, ExpertSurface) and surface.dimension == 2
    # M = N*k exactly on the measured plane, between grid rows
    assert deployment.time_us("experts", 5, 4, 20) == pytest.approx(raw_affine(5, 4, 20), rel=1e-6)


def test_it_caches_absent_deployments_but_not_corrupt_ones(current_bundle: Path) -> None:  # R43
    tables = ComponentTables(current_bundle)
    with pytest.raises(CoverageError, match="no table for TP2/DP1"):
        tables.deployment(2, 1, 0)
    assert (2, 1, 0, False) in tables._absent
    with pytest.raises(CoverageError):
        tables.deployment(2, 1, 0)
    table = next((current_bundle / "tp1/moe_components").glob("dp2_ep2_rank1_sp0/components.csv"))
    table.write_bytes(table.read_bytes() + b"\n")
    for _ in range(2):
        with pytest.raises(BundleError, match="checksum mismatch"):
            tables.deployment(1, 2, 1)
    assert (1, 2, 1, False) not in tables._absent
    assert tables.deployment(1, 2, 0) is tables.deployment(1, 2, 0)


def test_it_answers_mixed_query_lists_in_order(current_bundle: Path) -> None:
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    answers = deployment.answer(
        [
            {"component": "gate_routing", "tokens": 1},
            {"component": "experts", "tokens": 2, "activated_experts": 1, "local_assignments": 2},
            {"component": "experts", "tokens": 2},
            {"component": "wrapper", "tokens": 2},
            {"component": "gate_routing", "tokens": 1, "mode": "graph"},
            {"component": "finalize_copy", "tokens": 100},
            "nonsense",
        ]
    )
    assert answers[0] == {"time_us": 2.01}
    assert answers[1] == {"time_us": raw_affine(2, 1, 2)}
    assert [a.get("error") for a in answers[2:]] == [
        "invalid",
        "invalid",
        "invalid",
        "out_of_support",
        "invalid",
    ]
    assert "activated_experts is required" in answers[2]["message"]


def test_it_agrees_between_batch_and_scalar_calls(current_bundle: Path) -> None:
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    rng = np.random.default_rng(7)
    n = rng.integers(1, 70, 400)
    a = rng.integers(0, 9, 400)
    m = rng.integers(0, 70, 400)
    batch = deployment.batch("experts", n, a, m)
    for i in range(400):
        try:
            value = deployment.time_us("experts", int(n[i]), int(a[i]), int(m[i]))
            # The two paths may pick different simplices sharing a face; the answers then
            # differ only by the 1e-7 perturbation of near-flat simplices.
            assert batch.code[i] == OK and batch.time_us[i] == pytest.approx(value, rel=1e-7)
        except QueryError:
            assert batch.code[i] == INVALID
        except CoverageError:
            assert batch.code[i] == OUT_OF_SUPPORT


# -- the historical reader (R42) --------------------------------------------------------


def test_it_reads_historical_tables_as_their_publisher_did(shared_copy: Path) -> None:
    deployment = ComponentTables(shared_copy).deployment(1, 2, 0)
    # a stored row, and the midpoint of two stored A values on the same N row
    assert deployment.time_us("experts", 3, 6, 12) == 55.358999999999995
    assert deployment.time_us("experts", 3, 7, 12) == pytest.approx(
        (55.358999999999995 + 71.5355) / 2
    )
    # between N rows 4 (A 4..16) and 6: a segment joining equal A values is preferred
    mid = deployment.time_us("experts", 5, 6, 20)
    assert mid == pytest.approx((55.29600000000001 + 56.5115) / 2)
    assert deployment.time_us("gate_routing", 1, mode="graph") > 0


def test_it_refuses_unbalanced_historical_queries(shared_copy: Path) -> None:
    deployment = ComponentTables(shared_copy).deployment(1, 2, 0)
    with pytest.raises(CoverageError, match="balanced assignment totals only"):
        deployment.time_us("experts", 5, 6, 19)
    with pytest.raises(CoverageError, match="outside the measured range"):
        deployment.time_us("experts", 5000, 6, 20000)
    with pytest.raises(CoverageError, match="outside measured"):
        deployment.time_us("gate_routing", 4096)


# -- properties of the triangulated surface ------------------------------------------------


def _surface(time_fn) -> tuple[ExpertSurface, dict[tuple[int, int, int], float]]:  # type: ignore[no-untyped-def]
    g = ExpertGeometry.for_target(16, 4, MoeTarget.for_rank(1, 2, 0))
    points = expert_points(g, [1, 2, 4, 8, 16, 32, 64])
    stored = {p: time_fn(*p) for p in points}
    arr = np.array(points, dtype=np.int64)
    surface = ExpertSurface(
        arr[:, 0], arr[:, 1], arr[:, 2], np.array([stored[p] for p in points]), g, label="t"
    )
    return surface, stored


_RUGGED, _RUGGED_STORED = _surface(
    lambda n, a, m: 1.0 + ((n * 7919 + a * 104729 + m * 13) % 997) / 10
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_it_uses_at_most_four_vertices_with_nonnegative_weights(
    n: int, a: int, data: st.DataObject
) -> None:
    surface = _RUGGED
    low, high = surface.geometry.assignment_bounds(n, a)
    m = data.draw(st.integers(low, max(low, high)))
    if not surface.geometry.feasible(n, a, m) or (n, a, m) in _RUGGED_STORED:
        return
    point = surface._transform(np.array([n], float), np.array([a], float), np.array([m], float))
    reduced = (point - surface._mean) @ surface._basis.T
    assert surface._locator is not None
    located = surface._locator.locate_one(tuple(float(v) for v in reduced[0]))
    if located is None:
        with pytest.raises(CoverageError):
            surface.time(n, a, m)
        return
    vertices, weights = located
    assert len(vertices) <= 4
    assert all(w >= 0 for w in weights) and math.isclose(sum(weights), 1.0)
    value = surface.time(n, a, m)
    corner_times = [float(surface._times[v]) for v in vertices]
    assert min(corner_times) - 1e-9 <= value <= max(corner_times) + 1e-9


def _between_reference(low, high, f, active):  # type: ignore[no-untyped-def]
    """The publisher's rule, enumerated in full: every segment and every triangle."""
    candidates = []
    for a_act, a_t in low:
        for b_act, b_t in high:
            if abs((1 - f) * a_act + f * b_act - active) <= 1e-9:
                candidates.append(
                    ((abs(b_act - a_act), 0, -1, a_act, b_act), (1 - f) * a_t + f * b_t)
                )
    for side, (own, other) in enumerate(((low, high), (high, low))):
        mass = 1 - f if side == 0 else f
        for (a_act, a_t), (b_act, b_t) in itertools.pairwise(own):
            for c_act, c_t in other:
                eff = (active - (1 - mass) * c_act) / mass
                if not a_act - 1e-9 <= eff <= b_act + 1e-9:
                    continue
                mix = min(1.0, max(0.0, (eff - a_act) / (b_act - a_act)))
                spread = max(a_act, b_act, c_act) - min(a_act, b_act, c_act)
                candidates.append(
                    (
                        (spread, b_act - a_act, side, a_act, c_act),
                        mass * ((1 - mix) * a_t + mix * b_t) + (1 - mass) * c_t,
                    )
                )
    return min(candidates, key=lambda c: c[0])[1] if candidates else None


def test_it_prunes_the_historical_search_without_changing_an_answer(
    shared_copy: Path,
) -> None:  # R42
    from moetables.lookup.balanced import BalancedExpertSurface

    for rank in (0, 1):
        deployment = ComponentTables(shared_copy).deployment(1, 2, rank)
        for mode in ("eager", "graph"):
            surface = deployment._experts[("experts", mode)]
            assert isinstance(surface, BalancedExpertSurface)
            grid = surface.grid
            checked = 0
            for lo, hi in itertools.pairwise(grid):
                for n in sorted({lo + 1, (lo + hi) // 2, hi - 1} - {lo, hi}):
                    f = (n - lo) / (hi - lo)
                    for a in range(1, 65):
                        got = BalancedExpertSurface._between(
                            surface.rows[lo], surface.rows[hi], f, a
                        )
                        assert got == _between_reference(surface.rows[lo], surface.rows[hi], f, a)
                        checked += got is not None
            assert checked > 500


def test_it_answers_the_same_when_a_batch_is_split_over_threads(
    current_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moetables.lookup import surface as surface_module

    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    rng = np.random.default_rng(11)
    n, a, m = rng.integers(1, 70, 3000), rng.integers(1, 9, 3000), rng.integers(1, 300, 3000)
    serial = deployment.batch("experts", n, a, m)
    monkeypatch.setattr(surface_module, "_PARALLEL_ROWS", 16)
    monkeypatch.setattr(surface_module, "_pool_size", lambda: 3)
    split = deployment.batch("experts", n, a, m)
    assert np.array_equal(serial.code, split.code)
    # a point on a face shared by two simplices may be placed in either: equal to rounding
    assert np.allclose(serial.time_us, split.time_us, rtol=1e-7, atol=0.0, equal_nan=True)
