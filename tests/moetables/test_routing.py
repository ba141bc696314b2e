"""Routing policies: one step's padded DP counts to every EP rank's (rows, N, A, M) (R2, R5, R41)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.errors import QueryError
from moetables.geometry import MoeTarget
from moetables.routing import Deployment, route, route_batch


@st.composite
def deployments(draw: st.DrawFn) -> Deployment:
    tp = draw(st.integers(1, 3))
    dp = draw(st.integers(1, 3))
    sp = draw(st.booleans()) if tp > 1 and dp > 1 else False
    top_k = draw(st.integers(1, 8))
    experts = draw(st.integers(max(top_k, tp * dp), 64))
    return Deployment(tp, dp, sp, experts, top_k)


@st.composite
def steps(draw: st.DrawFn) -> tuple[Deployment, list[int]]:
    d = draw(deployments())
    return d, draw(st.lists(st.integers(1, 400), min_size=d.dp, max_size=d.dp))


def _feasible(d: Deployment, n: int, a: int, m: int, rank: int) -> bool:
    return d.geometry(rank).feasible(n, a, m)


@settings(max_examples=60, deadline=None)
@given(steps(), st.sampled_from(["balanced", "round_robin", "random"]), st.integers(0, 2**31))
def test_it_gives_every_rank_a_feasible_point_with_the_token_domains(
    step: tuple[Deployment, list[int]], policy: str, seed: int
) -> None:
    """R5 feasibility and R2 token domains for every counting and expected-load policy."""
    d, counts = step
    routed = route(d, counts, policy, seed=seed)
    assert len(routed.ranks) == d.ep
    for r in routed.ranks:
        domain = MoeTarget.for_rank(d.tp, d.dp, r.rank, d.sequence_parallel).token_domains(counts)
        assert (r.local_rows, r.tokens) == (domain.local_rows, domain.expert_rows)
        assert _feasible(d, r.tokens, r.activated_experts, r.local_assignments, r.rank)


@settings(max_examples=60, deadline=None)
@given(steps(), st.sampled_from(["round_robin", "random"]), st.integers(0, 2**31))
def test_it_conserves_pairs_for_counting_policies(
    step: tuple[Deployment, list[int]], policy: str, seed: int
) -> None:
    """R41: RR and RAND count their selected pairs, so the ranks' M add up to N x k."""
    d, counts = step
    routed = route(d, counts, policy, seed=seed)
    n = routed.ranks[0].tokens
    assert sum(r.local_assignments for r in routed.ranks) == n * d.top_k
    for r in routed.ranks:
        assert r.expert_counts is not None
        assert sum(r.expert_counts) == r.local_assignments
        assert sum(1 for c in r.expert_counts if c) == r.activated_experts


@settings(max_examples=60, deadline=None)
@given(steps())
def test_it_rounds_balanced_loads_up_by_less_than_a_pair_per_rank(
    step: tuple[Deployment, list[int]],
) -> None:
    """R41: BALANCED keeps the rounded expected load ceil(N*k*L/E) of each rank."""
    d, counts = step
    routed = route(d, counts, "balanced")
    n = routed.ranks[0].tokens
    total = sum(r.local_assignments for r in routed.ranks)
    assert n * d.top_k <= total < n * d.top_k + d.ep
    for r in routed.ranks:
        local = d.geometry(r.rank).local_experts
        assert r.local_assignments == math.ceil(n * d.top_k * local / d.global_experts)
        assert r.activated_experts == min(local, r.local_assignments)


@settings(max_examples=40, deadline=None)
@given(steps(), st.integers(0, 2**31))
def test_it_routes_random_steps_reproducibly_from_a_seed(
    step: tuple[Deployment, list[int]], seed: int
) -> None:
    d, counts = step
    first = route(d, counts, "random", seed=seed)
    again = route(d, counts, "random", seed=seed)
    assert first == again
    # A batch's step 0 is the single step with the same seed.
    batch = route_batch(d, [counts, counts], "random", seed=seed)
    assert batch.step(0, d) == first


def test_it_draws_different_routings_from_different_seeds() -> None:
    d = Deployment(1, 2, False, 128, 8)
    a = route(d, [300, 300], "random", seed=1)
    b = route(d, [300, 300], "random", seed=2)
    assert a.ranks[0].expert_counts != b.ranks[0].expert_counts


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(8, 64),
    st.integers(1, 2000),
    st.sampled_from(["balanced", "round_robin", "random"]),
)
def test_it_collapses_to_m_equals_n_k_at_ep1(k: int, e: int, n: int, policy: str) -> None:
    """R5: at EP1 every choice is local, so M = N x k whatever the policy."""
    d = Deployment(1, 1, False, e, min(k, e))
    (r,) = route(d, [n], policy, seed=7).ranks
    assert r.local_assignments == n * d.top_k
    assert r.tokens == r.local_rows == n


def test_it_maps_a_histogram_through_each_ranks_expert_map() -> None:
    """R4/R41: exact A and M per rank from global counts under linear placement."""
    d = Deployment(1, 2, False, 8, 2)
    counts = [3, 0, 1, 0, 2, 2, 0, 2]  # 10 pairs = N x k with N = 5
    r0, r1 = route(d, [2, 3], "histogram", expert_counts=counts).ranks
    assert (r0.activated_experts, r0.local_assignments, r0.expert_counts) == (2, 4, (3, 0, 1, 0))
    assert (r1.activated_experts, r1.local_assignments, r1.expert_counts) == (3, 6, (2, 2, 0, 2))


@pytest.mark.parametrize(
    ("counts", "words"),
    [
        ([3, 0, 1, 0, 2, 2, 0], "one entry per global expert (8)"),
        ([3, 0, 1, 0, 2, 2, 0, 3], "add up to 11 pairs but the step has N x k = 5 x 2 = 10"),
        ([6, 0, 0, 0, 2, 2, 0, 0], "expert 0 has 6 pairs but only N=5 rows"),
        ([3, 0, 1, 0, 2, 2, -1, 3], "expert 6 has a negative count"),
    ],
)
def test_it_refuses_an_inconsistent_histogram(counts: list[int], words: str) -> None:
    d = Deployment(1, 2, False, 8, 2)
    with pytest.raises(QueryError, match=words.replace("(", r"\(").replace(")", r"\)")):
        route(d, [2, 3], "histogram", expert_counts=counts)


def test_it_takes_a_custom_curve_and_load_shares() -> None:
    """R41: CUSTOM keeps rounded loads; A follows the user's curve, split by ownership."""
    d = Deployment(1, 2, False, 128, 8)
    routed = route(
        d, [100, 100], "custom", active_curve=[[1, 8], [1000, 120]], load_shares=[0.75, 0.25]
    )
    r0, r1 = routed.ranks
    assert (r0.local_assignments, r1.local_assignments) == (1200, 400)
    global_active = 8 + (120 - 8) * (200 - 1) / 999
    assert r0.activated_experts == round(global_active / 2)
    assert r0.expert_counts is None  # a curve gives no per-expert histogram


def test_it_never_extrapolates_a_custom_curve() -> None:
    d = Deployment(1, 2, False, 128, 8)
    with pytest.raises(QueryError, match=r"N=2000 is outside the active-expert curve's range"):
        route(d, [1000, 1000], "custom", active_curve=[[1, 8], [1000, 120]])


def test_it_names_the_rank_of_an_infeasible_custom_share() -> None:
    """A share above what a rank's experts can take (N x min(k, L) = 40 pairs) is refused."""
    d = Deployment(1, 2, False, 8, 6)  # 4 local experts per rank
    with pytest.raises(QueryError, match=r"rank 0 gets N=10 A=4 M=60, which no routing"):
        route(d, [5, 5], "custom", active_curve=[[1, 8], [100, 8]], load_shares=[1.0, 0.0])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"policy": "zipf"}, "unknown routing policy 'zipf'"),
        ({"policy": "histogram"}, "needs the step's global per-expert pair counts"),
        ({"policy": "custom"}, "needs an active-expert curve"),
        ({"policy": "balanced", "expert_counts": [1] * 16}, "belong to the histogram policy"),
    ],
)
def test_it_refuses_unknown_or_incomplete_policies(kwargs: dict, words: str) -> None:
    d = Deployment(1, 2, False, 16, 2)
    with pytest.raises(QueryError, match=words):
        route(d, [3, 4], **kwargs)


def test_it_refuses_an_idle_dp_rank_and_a_wrong_count_list() -> None:
    d = Deployment(1, 2, False, 16, 2)
    with pytest.raises(QueryError, match="DP rank 1 has 0 tokens"):
        route(d, [3, 0])
    with pytest.raises(QueryError, match=r"one padded token count per DP rank \(2\)"):
        route(d, [3, 4, 5])


def test_it_routes_a_batch_as_its_steps() -> None:
    d = Deployment(2, 2, True, 32, 4)
    counts = np.array([[1, 7], [30, 31], [64, 2]])
    batch = route_batch(d, counts, "round_robin")
    for i, row in enumerate(counts.tolist()):
        assert batch.step(i, d) == route(d, row, "round_robin")
