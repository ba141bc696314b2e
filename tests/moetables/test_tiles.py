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
