"""Routing profiles (issue 15 parts 1 and 3): the format's checks and the ``captured`` policy
(R41: a policy supplies A and M; R5: every point feasible)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.errors import QueryError
from moetables.profiles import (
    ProfileError,
    RoutingProfile,
    profile_from_json,
    read_profile,
    write_profile,
)
from moetables.routing import Deployment, route_batch

E, K = 16, 4


def zipf_router(steps: list[int], layers: int = 2, seed: int = 0, s: float = 1.2) -> np.ndarray:
    """A synthetic skewed router: per token the top-k of a Zipf bias (permuted per layer) plus
    Gumbel noise; (steps, layers, E) pair counts."""
    rng = np.random.default_rng(seed)
    bias = [-s * np.log(rng.permutation(E) + 1.0) for _ in range(layers)]
    out = np.zeros((len(steps), layers, E), dtype=np.int64)
    for i, n in enumerate(steps):
        for layer in range(layers):
            scores = bias[layer][None, :] + rng.gumbel(size=(n, E))
            picked = np.argpartition(-scores, K - 1, axis=1)[:, :K]
            out[i, layer] = np.bincount(picked.ravel(), minlength=E)
    return out


def make_profile(steps: list[int], **kw: int) -> RoutingProfile:
    return RoutingProfile.create(
        model={"name": "test/zipf", "global_experts": E, "top_k": K, "layers": [0, 5]},
        workload={
            "prompts_sha256": "0" * 64,
            "prompts": 3,
            "prompt_tokens": 10,
            "generated_tokens": 5,
        },
        step_tokens=steps,
        counts=zipf_router(steps, **kw),
        command="test",
        router="zipf",
        source="synthetic",
    )


STEPS = [64] * 40 + [8] * 40 + [200] * 10


@pytest.fixture(scope="module")
def profile() -> RoutingProfile:
    return make_profile(STEPS)


def test_it_round_trips_a_profile_through_its_file(tmp_path: Path, profile: RoutingProfile) -> None:
    path = write_profile(profile, tmp_path / "p.routing.npz")
    back = read_profile(path)
    assert back.meta == profile.meta
    assert np.array_equal(back.counts, profile.counts)
    assert read_profile(path.read_bytes()).steps == len(STEPS)
    inline = profile_from_json(json.loads(json.dumps(profile.to_json())))
    assert np.array_equal(inline.totals, profile.totals)


def _rewrite(path: Path, **arrays: np.ndarray) -> None:
    with np.load(path) as data:
        members = {k: data[k] for k in data.files}
    members.update(arrays)
    with path.open("wb") as fh:
        np.savez_compressed(fh, **members)


def test_it_names_the_field_of_a_corrupt_profile(tmp_path: Path, profile: RoutingProfile) -> None:
    path = write_profile(profile, tmp_path / "p.npz")
    counts = profile.counts.copy()
    counts[3, 1, 0] += 1
    _rewrite(path, counts=counts)
    with pytest.raises(ProfileError, match="counts: checksum mismatch"):
        read_profile(path)
    meta = dict(profile.meta, model=dict(profile.meta["model"], top_k="4"))
    _rewrite(
        path,
        counts=profile.counts,
        **{"profile.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)},
    )
    with pytest.raises(ProfileError, match=r"profile.json.model.top_k: must be an integer"):
        read_profile(path)
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with pytest.raises(ProfileError, match="not a routing profile"):
        read_profile(tmp_path / "x.npz")
    with pytest.raises(ProfileError, match="adds up to"):
        bad = profile.counts.copy()
        bad[0, 0, 0] -= 1
        RoutingProfile.create(
            model=profile.meta["model"],
            workload=profile.meta["workload"],
            step_tokens=profile.step_tokens,
            counts=bad,
        )
    with pytest.raises(ProfileError, match="a token picks an expert once"):
        RoutingProfile.create(
            model=dict(profile.meta["model"], layers=[0]),
            workload=profile.meta["workload"],
            step_tokens=[1],
            counts=[[[2, 2] + [0] * (E - 2)]],
        )
    raw = profile.to_json()
    raw["meta"] = dict(raw["meta"], schema="other")
    with pytest.raises(ProfileError, match="schema"):
        profile_from_json(raw)


def test_it_derives_exact_per_rank_loads_at_any_ep(profile: RoutingProfile) -> None:
    stats = profile.rank_statistics(4, layer=5)
    assert stats.local_assignments.shape == (len(STEPS), 4)
    assert (stats.local_assignments.sum(axis=1) == np.array(STEPS) * K).all()
    c = profile.counts[:, 1, :]
    assert (stats.local_assignments[:, 2] == c[:, 8:12].sum(axis=1)).all()
    assert (stats.activated_experts[:, 2] == (c[:, 8:12] > 0).sum(axis=1)).all()
    assert profile.rank_statistics(2).tokens.shape == (2 * len(STEPS),)
    assert (profile.imbalance() > 1.5).all()
    with pytest.raises(ProfileError, match="layer 3 is not in this profile"):
        profile.rank_statistics(2, layer=3)


def _mean_of(batch_m: np.ndarray) -> np.ndarray:
    return batch_m.mean(axis=0)


def test_it_reproduces_the_profiles_per_rank_statistics_at_a_captured_n(
    profile: RoutingProfile,
) -> None:
    """At an N the profile captured, draws are the captured steps themselves: the per-rank
    (A, M) distribution is the profile's."""
    d = Deployment(1, 2, False, E, K)
    got = route_batch(d, [[32, 32]] * 400, "captured", profile=profile, layer=5, seed=3)
    stats = profile.rank_statistics(2, layer=5)
    at = stats.tokens == 64
    captured_pairs = {tuple(row) for row in stats.local_assignments[at]}
    assert {tuple(row) for row in got.local_assignments} <= captured_pairs
    for rank in range(2):
        want_m = stats.local_assignments[at, rank].mean()
        want_a = stats.activated_experts[at, rank].mean()
        sd_m = stats.local_assignments[at, rank].std() / np.sqrt(400) + 1e-9
        assert abs(got.local_assignments[:, rank].mean() - want_m) < 5 * sd_m + 0.5
        assert abs(got.activated_experts[:, rank].mean() - want_a) < 0.5
    # Skewed, unlike balanced: one rank carries clearly more than N*k/2 on average.
    balanced = route_batch(d, [[32, 32]], "balanced")
    assert abs(got.local_assignments.mean(axis=0) - balanced.local_assignments[0]).max() > 10


def test_it_keeps_the_layer_shares_at_an_uncaptured_n(profile: RoutingProfile) -> None:
    """Between captured sizes, tokens pick experts with the captured step's chances: per-rank
    M keeps the layer's shares (means within sampling error)."""
    d = Deployment(1, 4, False, E, K)
    n = 30  # not captured: drawn from steps of 64 and 200 rows
    got = route_batch(d, [[10, 5, 10, 5]] * 300, "captured", profile=profile, layer=0, seed=1)
    assert (got.local_assignments.sum(axis=1) == n * K).all()
    stats = profile.rank_statistics(4, layer=0)
    big = stats.tokens > n
    shares = (stats.local_assignments[big] / stats.tokens[big, None]).mean(axis=0) / K
    np.testing.assert_allclose(got.local_assignments.mean(axis=0) / (n * K), shares, atol=0.03)
    # Above every captured step: the whole-run shares, still conserving pairs.
    above = route_batch(d, [[100, 100, 100, 100]], "captured", profile=profile, seed=0)
    assert above.local_assignments.sum() == 400 * K


def test_it_gives_the_expectation_at_a_captured_n(profile: RoutingProfile) -> None:
    d = Deployment(1, 2, False, E, K)
    got = route_batch(
        d, [[4, 4], [100, 100]], "captured", profile=profile, layer=5, captured_expectation=True
    )
    stats = profile.rank_statistics(2, layer=5)
    at = stats.tokens == 8
    assert abs(got.local_assignments[0] - stats.local_assignments[at].mean(axis=0)).max() <= 1
    assert abs(got.activated_experts[0] - stats.activated_experts[at].mean(axis=0)).max() <= 1
    assert got.local_assignments[1].sum() == 200 * K
    again = route_batch(
        d, [[4, 4]], "captured", profile=profile, layer=5, captured_expectation=True, seed=9
    )
    assert np.array_equal(again.local_assignments[0], got.local_assignments[0])


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 2, 3, 4, 8]),
    st.lists(st.integers(1, 300), min_size=1, max_size=4),
    st.integers(0, 2**31),
    st.sampled_from([None, 0, 5]),
    st.booleans(),
)
def test_it_gives_feasible_conserving_points_for_any_step(
    ep: int, tokens: list[int], seed: int, layer: int | None, expectation: bool
) -> None:
    """R5: any N, any EP size, either draw: feasible (checked inside), pairs conserved, seeded."""
    profile = _PROFILE
    d = Deployment(1, ep, False, E, K)
    step = [tokens[i % len(tokens)] for i in range(ep)]
    a = route_batch(
        d,
        [step],
        "captured",
        profile=profile,
        layer=layer,
        seed=seed,
        captured_expectation=expectation,
    )
    assert a.local_assignments.sum() == sum(step) * K
    b = route_batch(
        d,
        [step],
        "captured",
        profile=profile,
        layer=layer,
        seed=seed,
        captured_expectation=expectation,
    )
    assert np.array_equal(a.local_assignments, b.local_assignments)


_PROFILE = make_profile(STEPS)


def test_it_refuses_a_profile_that_does_not_fit(profile: RoutingProfile) -> None:
    with pytest.raises(QueryError, match="the profile routes E=16 top-4"):
        route_batch(Deployment(1, 2, False, 32, K), [[4, 4]], "captured", profile=profile)
    with pytest.raises(QueryError, match="needs a routing profile"):
        route_batch(Deployment(1, 2, False, E, K), [[4, 4]], "captured")
    with pytest.raises(QueryError, match="layer 7 is not in the profile"):
        route_batch(Deployment(1, 2, False, E, K), [[4, 4]], "captured", profile=profile, layer=7)
    with pytest.raises(QueryError, match="belong to the captured policy"):
        route_batch(Deployment(1, 2, False, E, K), [[4, 4]], "balanced", profile=profile)


def test_it_picks_experts_with_exactly_the_captured_chances() -> None:
    """Between captured sizes each expert's count is Binomial(N, chance): mean N p and
    variance N p (1 - p), every token's k experts distinct (no count above N)."""
    from moetables.routing import captured_counts

    big = make_profile([400] * 3)  # the draws at N=50 take one of these steps' chances
    layer = 0
    n, draws = 50, 4000
    got = captured_counts(big, layer, np.full(draws, n, dtype=np.int64), seed=11)
    assert (got.sum(axis=1) == n * K).all() and got.max() <= n
    # Which step each draw used is random; per step the chances are counts / 400.
    p = big.counts[:, layer, :] / 400.0  # (3, E)
    mean_p = p.mean(axis=0)
    var = n * mean_p * (1 - mean_p) + n * n * p.var(axis=0)  # the mixture over the 3 steps
    np.testing.assert_allclose(got.mean(axis=0), n * mean_p, atol=4 * np.sqrt(var.max() / draws))
    np.testing.assert_allclose(got.var(axis=0), var, rtol=0.15, atol=0.05)


def test_it_refuses_hostile_members(tmp_path: Path, profile: RoutingProfile) -> None:
    """Pickled objects, extra members, nested JSON and an oversized unpack are refused, named."""
    path = write_profile(profile, tmp_path / "p.npz")
    with pytest.raises(ProfileError, match="unpacks to more than 100 bytes"):
        read_profile(path, max_unpacked=100)
    _rewrite(path, counts=np.array([object()], dtype=object))
    with pytest.raises(ProfileError, match=r"counts.*unreadable"):
        read_profile(path)
    path = write_profile(profile, tmp_path / "q.npz")
    _rewrite(path, extra=np.zeros(1))
    with pytest.raises(ProfileError, match="members must be exactly"):
        read_profile(path)
    path = write_profile(profile, tmp_path / "r.npz")
    nested = np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8)
    _rewrite(path, **{"profile.json": nested})
    with pytest.raises(ProfileError, match=r"profile.json: not valid JSON|must be a JSON object"):
        read_profile(path)
