"""Waves of vLLM's expert kernel grid over the GPU's SMs (issue 18, 32-row blocks).

vLLM 0.26.0's ``invoke_fused_moe_triton_kernel`` launches, per GEMM, one program per (row tile,
N tile); programs whose row tile is past ``num_tokens_post_padded`` return at once, so the *live*
programs are ``tiles x cdiv(N_out, BLOCK_SIZE_N)``: N_out is ``2 x intermediate`` for the gate/up
GEMM (w13) and ``hidden`` for the down GEMM (w2). With ``r`` programs resident per SM on ``S``
SMs, each GEMM runs ``ceil(live / (S r))`` waves of about equally long programs. A w2 program
does ``K = intermediate`` of MMA work where a w13 one does ``K = hidden``, so a w2 wave counts
``intermediate / hidden`` of a w13 wave: the *weighted waves* of a load are

    ceil(tiles n13 / (S r)) + (intermediate / hidden) ceil(tiles n2 / (S r)).

Where this holds (the bf16 TP1 kernel at vLLM's tuned 32-row blocks on the H200:
``docs/benchmarks.md``, "Waves, not tiles, at 32-row blocks"), the expert time above the
balanced histogram's is one cost per extra weighted wave, not per extra tile: 132 row tiles fill
whole waves of both GEMMs at r = 2 and cost nothing extra, 133 spill one wave of each.

A wave count is a step function of the tiles, so the expected waves of a load *distribution*
(uniform, power law) are not the waves of its expected tiles: `expected_waves` takes them over
the distribution of the tile total (binomial marginals, as the expected tiles are taken).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from moetables.tiles import TileError, TimedLoad, power_law_shares, tile_pmfs

__all__ = [
    "LoadCharge",
    "WaveFit",
    "WaveGrid",
    "expected_waves",
    "fit_wave_cost",
]


@dataclass(frozen=True, slots=True)
class WaveGrid:
    """The kernel grid's geometry: ``sms`` SMs with ``programs_per_sm`` resident programs each;
    the expert's ``hidden`` and ``intermediate`` sizes fix both GEMMs' N_out and the w2 weight."""

    sms: int
    programs_per_sm: int
    hidden: int
    intermediate: int

    def __post_init__(self) -> None:
        if min(self.sms, self.programs_per_sm, self.hidden, self.intermediate) < 1:
            raise TileError(f"a wave grid needs positive sizes, got {self}")

    def n_tiles(self, block_n: int) -> tuple[int, int]:
        """N tiles of the w13 and w2 GEMMs at ``BLOCK_SIZE_N = block_n``."""
        if block_n < 1:
            raise TileError(f"block_n must be >= 1, got {block_n}")
        return -(-2 * self.intermediate // block_n), -(-self.hidden // block_n)

    @property
    def w2_weight(self) -> float:
        return self.intermediate / self.hidden

    def waves(self, tiles: npt.ArrayLike, block_n: int) -> npt.NDArray[np.float64]:
        """Weighted waves of ``tiles`` row tiles (any shape; fractional tiles are read as the
        live programs they would be, which only the interpolated balanced reference has)."""
        n13, n2 = self.n_tiles(block_n)
        slots = float(self.sms * self.programs_per_sm)
        t = np.asarray(tiles, dtype=np.float64)
        out: npt.NDArray[np.float64] = np.ceil(t * n13 / slots) + self.w2_weight * np.ceil(
            t * n2 / slots
        )
        return out


@dataclass(frozen=True, slots=True)
class LoadCharge:
    """How a table charges a load's expert-kernel work beyond its balanced histogram's at one
    vLLM block size (issue 18): ``kind`` ``"tiles"`` (``cost_us`` per extra row tile) or
    ``"waves"`` (``cost_us`` per extra weighted wave of ``grid``)."""

    kind: str
    cost_us: float
    grid: WaveGrid | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("tiles", "waves") or (self.kind == "waves") != (self.grid is not None):
            raise ValueError(f"a load charge is tiles, or waves with a grid; got {self}")


@functools.lru_cache(maxsize=16384)
def expected_waves(
    alpha: float,
    active: int,
    pairs: int,
    block_m: int,
    block_n: int,
    grid: WaveGrid,
    rows: int,
) -> float:
    """The expected weighted waves of ``pairs`` pairs over ``active`` experts with power-law
    shares (alpha = 0: uniform) in a kernel of ``rows`` token rows, kept: lookups repeat them.

    The distribution of the tile total is the convolution of the experts' tile distributions
    (taken as one product of their Fourier transforms), each expert's the bounded marginal of
    `moetables.tiles.tile_pmfs` (at least one pair, at most ``rows``), as the expected tiles
    take it (so the two agree). Independent marginals overstate the spread of the total a little
    (a draw's counts add up to ``pairs``)."""
    if active < 1 or pairs < active or block_m < 1:
        raise TileError(f"need pairs >= active >= 1 and block_m >= 1, got {pairs}, {active}")
    shares = tuple(float(x) for x in power_law_shares(active, alpha))
    groups = tile_pmfs(shares, pairs, rows, block_m)
    ones = [(np.clip(_trim(pmf), 0.0, None), count) for pmf, count in groups]
    # The convolution of every expert's distribution as one product of their transforms (each
    # group's raised to its number of experts), on a grid long enough for the largest total.
    size = 1 + sum((o.size - 1) * int(c) for o, c in ones)
    n = 1 << max(size - 1, 1).bit_length()
    spectrum = np.ones(n // 2 + 1, dtype=np.complex128)
    for one, count in ones:
        spectrum *= np.fft.rfft(one, n) ** int(count)
    total = np.clip(np.fft.irfft(spectrum, n)[:size], 0.0, None)
    waves = grid.waves(np.arange(total.size), block_n)
    return float((total * waves).sum() / total.sum())


# Probabilities below this are dropped from the tails of a tile distribution (far below what
# moves an expected wave count).
PMF_FLOOR = 1e-15


def _trim(pmf: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The PMF without its upper tail below `PMF_FLOOR` (its index is the tile count)."""
    keep = np.flatnonzero(pmf > PMF_FLOOR)
    return pmf[: int(keep[-1]) + 1] if keep.size else pmf


@dataclass(frozen=True)
class WaveFit:
    """``wave_cost_us``: the within-N least-squares slope of time on weighted waves."""

    wave_cost_us: float
    records: int
    groups: int


def fit_wave_cost(
    rows: Sequence[TimedLoad], *, block_m: int, grid: WaveGrid, block_n_at: dict[int, int]
) -> WaveFit:
    """The cost of a weighted wave from loads timed at the same N, as
    `moetables.tiles.fit_tile_cost` fits a tile's: stable records of exactly ``block_m``-row
    blocks, each N its own group, the pooled within-group slope of the 2B time on the waves.
    ``block_n_at``: the kernel configuration's BLOCK_SIZE_N at each record's N."""
    groups: dict[int, list[TimedLoad]] = {}
    for r in rows:
        if r.stable and r.block_m == block_m:
            groups.setdefault(r.tokens, []).append(r)
    sxy = sxx = 0.0
    used = kept = 0
    for n, rs in groups.items():
        if len(rs) < 2:
            continue
        x = grid.waves([r.tiles for r in rs], block_n_at[n])
        y = np.array([r.b2_us for r in rs], dtype=np.float64)
        dx = x - x.mean()
        sxy += float(dx @ (y - y.mean()))
        sxx += float(dx @ dx)
        used += len(rs)
        kept += 1
    if sxx <= 0 or not math.isfinite(sxy):
        raise TileError(f"no N with loads of different waves at {block_m}-row blocks")
    return WaveFit(sxy / sxx, used, kept)
