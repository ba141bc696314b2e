"""Routing stimuli meet (N, A, M) exactly with k distinct global experts per token (R20)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from acquisition.protocol.stimulus import StimulusError, routing_stimulus
from moetables.geometry import ExpertGeometry, linear_expert_map


@st.composite
def points(draw: st.DrawFn) -> tuple[ExpertGeometry, list[int], int, int, int]:
    experts = draw(st.integers(1, 40))
    top_k = draw(st.integers(1, min(8, experts)))
    ep = draw(st.integers(1, min(8, experts)))
    rank = draw(st.integers(0, ep - 1))
    mapping = linear_expert_map(experts, ep, rank)
    geometry = ExpertGeometry(experts, top_k, sum(1 for e in mapping if e >= 0))
    tokens = draw(st.integers(1, 64))
    if geometry.all_remote_possible and draw(st.booleans()):
        return geometry, mapping, tokens, 0, 0
    c = max(0, top_k - geometry.remote_experts)
    low_a, high_a = max(1, c), min(geometry.local_experts, tokens * top_k)
    assume(low_a <= high_a)
    active = draw(st.integers(low_a, high_a))
    low, high = geometry.assignment_bounds(tokens, active)
    assume(low <= high)
    return geometry, mapping, tokens, active, draw(st.integers(low, high))


@given(point=points(), seed=st.integers(0, 2**16), offset=st.integers(0, 50))
def test_the_stimulus_meets_the_point_exactly(
    point: tuple[ExpertGeometry, list[int], int, int, int], seed: int, offset: int
) -> None:
    geometry, mapping, n, a, m = point
    stimulus = routing_stimulus(geometry, mapping, n, a, m, seed=seed)
    for candidate in (stimulus, stimulus.rotated(mapping, offset)):
        ids = candidate.topk_ids
        assert ids.shape == (n, geometry.top_k)
        assert ((ids >= 0) & (ids < geometry.global_experts)).all()
        assert all(len(set(row)) == geometry.top_k for row in ids.tolist())  # distinct top-k
        local = np.asarray(mapping)[ids]
        assert int((local >= 0).sum()) == m  # exact M
        counts = np.bincount(local[local >= 0], minlength=geometry.local_experts)
        assert int((counts > 0).sum()) == a  # exact A
        if a:
            active = counts[counts > 0]
            assert active.max() - active.min() <= 1  # balanced histogram
    weights = stimulus.topk_weights
    assert weights.dtype == np.float32 and (weights > 0).all()
    assert np.allclose(weights.sum(axis=1), 1.0, atol=1e-5)


def test_it_is_reproducible_for_a_seed() -> None:
    geometry = ExpertGeometry(16, 4, 8)
    mapping = linear_expert_map(16, 2, 0)
    first = routing_stimulus(geometry, mapping, 8, 3, 10, seed=7)
    again = routing_stimulus(geometry, mapping, 8, 3, 10, seed=7)
    assert np.array_equal(first.topk_ids, again.topk_ids)
    assert np.array_equal(first.topk_weights, again.topk_weights)


def test_rotation_moves_work_to_other_local_experts() -> None:
    geometry = ExpertGeometry(16, 2, 8)
    mapping = linear_expert_map(16, 2, 1)  # local experts are globals 8..15
    stimulus = routing_stimulus(geometry, mapping, 4, 2, 8)
    local_before = {int(g) for g in stimulus.topk_ids.ravel() if mapping[g] >= 0}
    local_after = {int(g) for g in stimulus.rotated(mapping, 2).topk_ids.ravel() if mapping[g] >= 0}
    assert local_before == {8, 9} and local_after == {10, 11}


def test_it_refuses_infeasible_points() -> None:
    geometry = ExpertGeometry(8, 2, 8)  # EP1: M must be N*k
    with pytest.raises(StimulusError, match="infeasible"):
        routing_stimulus(geometry, list(range(8)), 4, 2, 5)


def _dealt_row_by_row(
    n: int, k: int, a: int, m: int, local_globals: np.ndarray, remote_globals: np.ndarray
) -> np.ndarray:
    """The dealing as first written, one row at a time: what every shipped table met."""
    per_token = [m // n + (1 if i < m % n else 0) for i in range(n)] if m else [0] * n
    ids = np.empty((n, k), dtype=np.int64)
    pair = remote_cursor = 0
    for row, count in enumerate(per_token):
        local_slots = [(pair + j) % a for j in range(count)]
        pair += count
        remote_slots = [(remote_cursor + j) % remote_globals.size for j in range(k - count)]
        remote_cursor += k - count
        ids[row, :count] = local_globals[local_slots]
        ids[row, count:] = remote_globals[remote_slots]
    return ids


@given(point=points())
def test_the_array_dealing_equals_the_row_by_row_one(
    point: tuple[ExpertGeometry, list[int], int, int, int],
) -> None:
    """Issue 19: the stimulus is built faster, never differently (resume and old tables)."""
    from acquisition.protocol.stimulus import _dealt_ids, _local_globals

    geometry, mapping, n, a, m = point
    table = np.asarray(mapping, dtype=np.int64)
    local, remote = _local_globals(table), np.flatnonzero(table < 0)
    expected = _dealt_row_by_row(n, geometry.top_k, a, m, local, remote)
    np.testing.assert_array_equal(_dealt_ids(n, geometry.top_k, a, m, local, remote), expected)


def test_the_shipped_grid_points_are_dealt_as_before() -> None:
    """Qwen3-30B-A3B (E=128, k=8) on TP1/DP1 and both DP2/EP2 ranks, up to 2048 tokens."""
    from acquisition.protocol.stimulus import _dealt_ids, _local_globals

    for ep, rank in ((1, 0), (2, 0), (2, 1)):
        table = np.asarray(linear_expert_map(128, ep, rank), dtype=np.int64)
        local, remote = _local_globals(table), np.flatnonzero(table < 0)
        geometry = ExpertGeometry(128, 8, local.size)
        for n in (1, 3, 64, 2048):
            for a in (0, 1, 7, 64):
                for m in {0, a, 3 * a, n * 8 // 2, n * 8}:
                    if not geometry.feasible(n, a, m):
                        continue
                    expected = _dealt_row_by_row(n, 8, a, m, local, remote)
                    np.testing.assert_array_equal(_dealt_ids(n, 8, a, m, local, remote), expected)
