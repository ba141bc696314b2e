"""Issue 18: the Triton expert kernel's block size and row tiles, as vLLM 0.26.0 computes them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.tiles import (
    TileError,
    balanced_counts,
    block_size_m,
    default_block_m,
    expected_row_tiles,
    naive_assignment,
    power_law_shares,
    row_tiles,
)


def test_it_follows_vllms_default_config_thresholds() -> None:
    """Issue 18: get_default_config's bf16 BLOCK_SIZE_M steps at 32, 96 and 512 rows."""
    assert [default_block_m(m) for m in (1, 32, 33, 96, 97, 512, 513, 4096)] == [
        16,
        16,
        32,
        32,
        64,
        64,
        128,
        128,
    ]
    assert default_block_m(64, "fp8_w8a8", (128, 128)) == 16
    assert default_block_m(65, "fp8_w8a8", (128, 128)) == 64


def test_it_uses_the_tuned_h200_file_for_128_local_experts_and_the_default_for_64() -> None:
    """Issue 18: TP1 (E=128, N=768) has a tuned H200 file, EP2 (E=64) falls back to the default."""
    assert block_size_m(4096, 128, 768) == 128
    assert block_size_m(300, 128, 768) == 32  # nearest tuned key 256
    assert block_size_m(384, 128, 768) == 32  # tie between 256 and 512: the smaller key
    assert block_size_m(600, 128, 768) == 64
    assert block_size_m(600, 64, 768) == 128
    assert block_size_m(2048, 64, 768) == 128


def test_it_counts_padded_row_tiles() -> None:
    """Issue 18: 129 pairs cost one tile more than 128 at a 128-row block."""
    assert row_tiles([128, 128], 128) == 2
    assert row_tiles([129, 127], 128) == 3
    assert row_tiles([0, 0, 1], 16) == 1
    assert naive_assignment(4, 8, 128, expert_map=False)
    assert not naive_assignment(4, 8, 128, expert_map=True)


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.integers(1, 20000),
    active=st.integers(1, 128),
    block=st.sampled_from([16, 32, 64, 128]),
)
def test_it_never_beats_the_balanced_tiles(pairs: int, active: int, block: int) -> None:
    """Issue 18: balanced counts minimise the tiles over any split of the same pairs on the same experts."""
    if pairs < active:
        with pytest.raises(TileError):
            balanced_counts(pairs, active)
        return
    bal = balanced_counts(pairs, active)
    assert int(bal.sum()) == pairs and bal.max() - bal.min() <= 1
    skew = bal.copy()
    skew[0] += skew[1:].sum() - (active - 1) if active > 1 else 0
    skew[1:] = 1 if active > 1 else skew[1:]
    assert int(skew.sum()) == pairs
    assert row_tiles(skew, block) >= row_tiles(bal, block) >= max(active, math.ceil(pairs / block))


def routed_tile_totals(
    n: int, alpha: float, *, block_m: int, draws: int, seed: int, experts: int = 128, k: int = 8
) -> np.ndarray:
    """Row tiles of loads routed as scripts/h200_load_spread.py routes them: each of ``n`` tokens
    picks ``k`` distinct experts with weight rank^-alpha (Gumbel top-k); only draws in which
    every expert is active are kept (the query's A = experts)."""
    rng = np.random.default_rng(seed)
    logw = np.log(power_law_shares(experts, alpha))
    kept: list[int] = []
    for _ in range(draws):
        picks = np.argpartition(-(logw + rng.gumbel(size=(n, experts))), k - 1, axis=1)[:, :k]
        counts = np.bincount(picks.ravel(), minlength=experts)
        if (counts > 0).all():
            kept.append(int((-(-counts // block_m)).sum()))
    assert len(kept) >= draws // 20, "too few draws with every expert active"
    return np.array(kept)


@pytest.mark.parametrize(
    ("n", "alpha", "block_m"), [(384, 0.0, 32), (384, 0.6, 32), (1024, 1.2, 64), (2048, 0.6, 64)]
)
def test_expected_tiles_follow_routed_tokens(n: int, alpha: float, block_m: int) -> None:
    """Issue 18: the bounded marginals (each active expert 1 to N pairs) against the timed
    process: within 0.6 % where unbounded binomials were up to 3.6 % off (1,024 rows, alpha
    1.2: 217.6 tiles for a routed 210.0; bounded 211.0)."""
    drawn = routed_tile_totals(n, alpha, block_m=block_m, draws=300, seed=5).mean()
    got = expected_row_tiles(8 * n, power_law_shares(128, alpha), block_m, rows=n)
    assert got == pytest.approx(drawn, rel=0.006)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.2, 3.0, 5.0, 20.0])
@pytest.mark.parametrize(("rows", "active", "pairs", "block_m"), [
    (1024, 128, 8192, 64), (1024, 64, 4096, 64), (200, 8, 1600, 16), (2048, 8, 16384, 64),
    (40, 30, 300, 16), (300, 2, 600, 128),
])  # fmt: skip
def test_no_distribution_runs_fewer_tiles_than_any_load_can(
    alpha: float, rows: int, active: int, pairs: int, block_m: int
) -> None:
    """Issue 18 (a steep power law was charged below balanced): every active expert runs a
    tile and no expert holds more than N pairs, so the expected tiles are at least
    max(A, ceil(M / b)) and at most A x ceil(N / b); where every expert must hold N pairs
    (M = N x A) the one feasible load is balanced's."""
    got = expected_row_tiles(pairs, power_law_shares(active, alpha), block_m, rows=rows)
    assert max(active, math.ceil(pairs / block_m)) - 1e-9 <= got
    assert got <= active * math.ceil(rows / block_m) + 1e-9
    if pairs == rows * active:
        assert got == pytest.approx(row_tiles(balanced_counts(pairs, active), block_m))


def test_it_expects_more_tiles_under_random_than_balanced_loads() -> None:
    """Issue 18: 8192 pairs on 64 experts, 128-row blocks: balanced 64 tiles, uniform draws about 96."""
    uniform = expected_row_tiles(8192, np.full(64, 1 / 64), 128)
    assert 90 < uniform < 100
    rng = np.random.default_rng(0)
    draws = [
        row_tiles(np.bincount(rng.integers(0, 64, 8192), minlength=64), 128) for _ in range(200)
    ]
    assert abs(float(np.mean(draws)) - uniform) < 1.5
    assert expected_row_tiles(8192, power_law_shares(64, 1.2), 128) > uniform


def test_it_names_bad_input() -> None:
    """Issue 18: bad input raises a TileError naming the problem."""
    with pytest.raises(TileError, match="block_m"):
        row_tiles([1], 0)
    with pytest.raises(TileError, match="alpha"):
        power_law_shares(8, -1.0)
    with pytest.raises(TileError, match="sum"):
        expected_row_tiles(10, [0.5, 0.4], 16)
