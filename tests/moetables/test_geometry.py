"""Targets, token domains, expert ownership and the feasible region (R1, R2, R4, R5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moetables.errors import BundleError
from moetables.geometry import (
    ExpertGeometry,
    MoeTarget,
    balanced_local_assignments,
    linear_expert_map,
)


def test_it_accepts_full_ep_targets_and_names_their_folder() -> None:  # R1
    target = MoeTarget(tp=2, dp=2, ep=4, rank=3, sequence_parallel=True)
    assert target.deployment == "dp2_ep4_rank3_sp1"
    assert (target.dp_rank, target.tp_rank) == (1, 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"tp": 1, "dp": 2, "ep": 1, "rank": 0, "sequence_parallel": False}, "full expert"),
        ({"tp": 1, "dp": 2, "ep": 2, "rank": 2, "sequence_parallel": False}, "rank"),
        ({"tp": 2, "dp": 1, "ep": 2, "rank": 0, "sequence_parallel": True}, "sequence_parallel"),
        ({"tp": 1, "dp": 1, "ep": 1, "rank": 0, "sequence_parallel": None}, "explicitly"),
        ({"tp": 0, "dp": 1, "ep": 0, "rank": 0, "sequence_parallel": False}, "tp >= 1"),
    ],
)
def test_it_refuses_targets_outside_the_method(kwargs: dict, fragment: str) -> None:  # R1
    with pytest.raises(ValueError, match=fragment):
        MoeTarget(**kwargs)


def test_it_names_the_field_of_a_malformed_target() -> None:
    with pytest.raises(BundleError, match=r"meta\.yaml:x\.target"):
        MoeTarget.from_dict({"tp": 1, "dp": 1, "ep": 1, "rank": 0}, where="meta.yaml:x.target")


def test_it_maps_padded_counts_to_rows_without_sequence_parallelism() -> None:  # R2
    target = MoeTarget.for_rank(2, 2, 2)  # dp_rank 1
    domain = target.token_domains([8, 5])
    assert (domain.local_rows, domain.expert_rows) == (5, 13)


def test_it_maps_padded_counts_to_rows_with_sequence_parallelism() -> None:  # R2
    target = MoeTarget.for_rank(2, 2, 0, sequence_parallel=True)
    domain = target.token_domains([7, 5])
    # ceil(7/2)=4 local rows; experts see 2 * (4 + 3) rows.
    assert (domain.local_rows, domain.expert_rows) == (4, 14)


@given(st.integers(1, 512), st.integers(1, 16))
def test_it_places_experts_like_vllm_linear_placement(experts: int, ep: int) -> None:  # R4
    owned: list[int] = []
    for rank in range(ep):
        mapping = linear_expert_map(experts, ep, rank)
        local = [g for g, idx in enumerate(mapping) if idx >= 0]
        base, rem = divmod(experts, ep)
        assert len(local) == base + (rank < rem)
        assert local == list(range(local[0], local[0] + len(local))) if local else True
        assert [mapping[g] for g in local] == list(range(len(local)))
        owned.extend(local)
    assert owned == list(range(experts))


def test_it_bounds_local_assignments_by_the_feasible_region() -> None:  # R5
    g = ExpertGeometry(global_experts=8, top_k=4, local_experts=6)  # only 2 remote experts
    # every token has at least k-(E-L)=2 local choices
    assert g.assignment_bounds(tokens=3, active=2) == (6, 6)
    assert g.feasible(3, 2, 6)
    assert not g.feasible(3, 2, 5)
    assert not g.feasible(3, 7, 12)  # more active experts than local ones
    assert not g.all_remote_possible
    assert not g.feasible(3, 0, 0)


def test_it_collapses_the_assignment_axis_at_ep1() -> None:  # R5
    g = ExpertGeometry(global_experts=8, top_k=2, local_experts=8)
    assert g.collapsed
    assert g.assignment_bounds(5, 4) == (10, 10)
    assert not g.feasible(5, 1, 5)  # one expert cannot take two choices of a token


def test_it_takes_the_balanced_total_as_the_historical_tables_do() -> None:
    # Qwen3-30B-A3B at EP2: k=8, L=64, E=128, so 4 local pairs per token.
    assert [balanced_local_assignments(n, 8, 64, 128) for n in (1, 3, 4096)] == [4, 12, 16384]
    assert balanced_local_assignments(1, 8, 43, 128) == 3  # ceil(2.6875)


@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_it_keeps_every_balanced_total_feasible(
    tokens: int, top_k: int, data: st.DataObject
) -> None:
    experts = data.draw(st.integers(top_k, 64))
    local = data.draw(st.integers(1, experts))
    g = ExpertGeometry(experts, top_k, local)
    m = g.balanced_total(tokens)
    low_a = max(1, -(-m // tokens))
    assert g.feasible(tokens, min(local, m, max(low_a, 1)), m) or m < low_a
