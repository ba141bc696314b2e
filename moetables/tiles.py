"""Row tiles of vLLM's Triton expert kernel: how per-expert loads become kernel work (issue 18).

vLLM's ``fused_moe_kernel`` runs each local expert's pairs in tiles of ``BLOCK_SIZE_M`` rows: the
token sort (``moe_align_block_size``) pads every expert's pair count up to a multiple of the block
size, and the kernel launches one program per padded row tile (and per N tile). So the kernel's
work is the number of row tiles, ``sum_e ceil(count_e / BLOCK_SIZE_M)``, not the number of pairs:
an expert with 129 pairs costs a whole tile more than one with 128. The acquisition's balanced
stimulus gives every active expert M/A pairs (as evenly as integers allow); a router's counts
scatter, and the scatter costs tiles.

The kernel's configuration (and so the block size) for a shape is `moetables.triton_config`'s,
the table the planner's kernel-step rule reads too: vLLM 0.26.0's tuned H200 file for (local
experts E, expert width N, dtype, block shape), nearest key to the kernel's token rows M, else
``get_default_config``. ``M`` is the number of token rows the expert kernel sees
(``hidden_states.size(0)``: the gathered rows N of the method's vocabulary), not the pair count.
Without an expert map and with ``N * top_k * 4 <= E_global`` the sort is skipped and every pair
is its own block (``naive_block_assignment``).

Expected tiles under a load *distribution* use each expert's marginal count distribution, kept
inside what a load at (N, A, M) can be: every one of the ``a`` active experts holds at least one
pair, and none more than the ``n`` rows (a token picks an expert once). So count_e = 1 + Y_e
with Y_e ~ Binomial(m - a, q_e), capped at n; an expert whose expected count would pass n is
held at n and the shares of the others renormalised over the pairs left (water-filling, until
none passes). Without these bounds a steep power law put nearly every pair on one expert and
left others empty, a load no router can produce, and charged fewer tiles than the balanced
histogram's A. The marginals ignore that a draw's counts add up to m (an approximation; exact
for independent pairs), and E[ceil(X/b)] = sum_{j>=0} P(X > j*b).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from scipy import stats

from moetables.triton_config import (
    VLLM_VERSION,
    KernelShape,
    TritonConfigError,
    config_dtype,
    default_config,
    device_family,
)

__all__ = [
    "MAX_TILE_COST_US",
    "MODEL_BLOCK_M",
    "VLLM_VERSION",
    "TileCount",
    "TileError",
    "TileFit",
    "TimedLoad",
    "balanced_counts",
    "block_size_m",
    "bounded_marginals",
    "contract_expert_width",
    "contract_kernel_shape",
    "default_block_m",
    "device_family",
    "expected_row_tiles",
    "fit_tile_cost",
    "kernel_row_tiles",
    "load_tiles",
    "naive_assignment",
    "parse_loads",
    "power_law_shares",
    "row_tiles",
    "tile_pmfs",
    "valid_tile_cost",
]

# Without a table's own model, tiles of this many rows only are charged: there the kernel is
# compute-bound and a tile costs about the same everywhere (docs/benchmarks.md, "Per-expert load
# spread"); smaller blocks stream each expert's weights per tile, a cost the table already
# carries through A. A table's tile model may name a smaller block (`block_m`) where its own
# evidence fits one cost: the FP8 table's 64-row blocks ("FP8 expert time follows tiles").
MODEL_BLOCK_M = 128


# A row tile is microseconds of kernel work: a caller's cost above this is a unit mistake, and
# near float's limit it would overflow the answer to inf (no JSON number).
MAX_TILE_COST_US = 1e6


def valid_tile_cost(cost: Any) -> bool:
    """Whether ``cost`` is a number of microseconds a row tile can cost: 0 to `MAX_TILE_COST_US`."""
    return (
        not isinstance(cost, bool)
        and isinstance(cost, (int, float))
        and 0 <= cost <= MAX_TILE_COST_US
    )


class TileError(ValueError):
    """A shape or a load description the tile model cannot answer (named in the message)."""


def default_block_m(
    rows: int, dtype: str | None = None, block_shape: Sequence[int] | None = None
) -> int:
    """``get_default_config(M, ...)['BLOCK_SIZE_M']`` of vLLM 0.26.0 (CUDA, not batch-invariant).

    ``rows`` is the kernel's M (token rows). bf16/fp16 and fp8 per-tensor: 16 up to 32 rows, 32 up
    to 96, 64 up to 512, 128 beyond. Block-quantized fp8 (``block_shape`` given): 16 up to 64, else 64.
    """
    if rows < 1:
        raise TileError(f"rows must be >= 1, got {rows}")
    block = _block(block_shape)
    try:
        return default_config(rows, 1, _key_dtype(dtype), block).block_m
    except TritonConfigError as exc:
        raise TileError(str(exc)) from None


def block_size_m(
    rows: int,
    local_experts: int,
    width: int,
    *,
    dtype: str | None = None,
    block_shape: Sequence[int] | None = None,
    device: str = "NVIDIA_H200",
) -> int:
    """``try_get_optimal_moe_config(...)['BLOCK_SIZE_M']`` for a shape (vLLM 0.26.0).

    ``local_experts`` is the first dimension of the rank's w2 (E in the config file name),
    ``width`` its last (the expert width; whole under expert parallelism, N in the file name),
    ``dtype`` the config dtype (None or bf16/fp16 for unquantized, ``fp8_w8a8``), ``rows`` the
    token rows the kernel sees. ``device`` names the config family (vLLM maps every H200 variant
    to ``NVIDIA_H200``). A shape without an embedded tuned file gets vLLM's default config (on
    the H200 exactly what vLLM does: all its H200 files are embedded).
    """
    if rows < 1:
        raise TileError(f"rows must be >= 1, got {rows}")
    try:
        shape = KernelShape(device, local_experts, width, _key_dtype(dtype), _block(block_shape))
        return shape.config(rows).block_m
    except TritonConfigError as exc:
        raise TileError(str(exc)) from None


def _key_dtype(dtype: str | None) -> str | None:
    return None if dtype in (None, "bf16", "bfloat16", "fp16", "float16") else dtype


def _block(block_shape: Sequence[int] | None) -> tuple[int, int] | None:
    if block_shape is None:
        return None
    if len(block_shape) != 2:
        raise TileError(f"block_shape must be [N, K], got {list(block_shape)}")
    return int(block_shape[0]), int(block_shape[1])


def row_tiles(counts: Sequence[int] | npt.ArrayLike, block_m: int) -> int:
    """Row tiles the kernel runs: ``sum_e ceil(count_e / block_m)`` (``moe_align_block_size``)."""
    if block_m < 1:
        raise TileError(f"block_m must be >= 1, got {block_m}")
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 1:
        raise TileError(f"counts must be one-dimensional, got shape {c.shape}")
    if (c < 0).any():
        raise TileError("counts must be >= 0")
    return int(((c + block_m - 1) // block_m).sum())


def kernel_row_tiles(
    counts: Sequence[int] | npt.ArrayLike, block_m: int, *, naive: bool = False
) -> int:
    """Row tiles including vLLM's ``naive_block_assignment`` (every pair its own tile)."""
    return int(np.asarray(counts, dtype=np.int64).sum()) if naive else row_tiles(counts, block_m)


def naive_assignment(rows: int, top_k: int, global_experts: int, *, expert_map: bool) -> bool:
    """``_prepare_expert_assignment``'s test: no expert map and ``rows * top_k * 4 <= E_global``."""
    return (not expert_map) and rows * top_k * 4 <= global_experts


def balanced_counts(pairs: int, active: int) -> npt.NDArray[np.int64]:
    """The acquisition stimulus' local histogram: ``pairs`` over ``active`` experts as evenly as
    integers allow (the first ``pairs % active`` experts get one more)."""
    if active < 1 or pairs < active:
        raise TileError(f"need pairs >= active >= 1, got pairs={pairs}, active={active}")
    base, extra = divmod(pairs, active)
    out = np.full(active, base, dtype=np.int64)
    out[:extra] += 1
    return out


def power_law_shares(active: int, alpha: float) -> npt.NDArray[np.float64]:
    """Expert shares proportional to rank^-alpha (alpha = 0: uniform)."""
    if active < 1:
        raise TileError(f"active must be >= 1, got {active}")
    if not math.isfinite(alpha) or alpha < 0:
        raise TileError(f"power-law alpha must be finite and >= 0, got {alpha}")
    w = np.arange(1, active + 1, dtype=np.float64) ** (-alpha)
    out: npt.NDArray[np.float64] = w / w.sum()
    return out


def expected_row_tiles(
    pairs: int,
    shares: Sequence[float] | npt.ArrayLike,
    block_m: int,
    *,
    rows: int | None = None,
) -> float:
    """E[sum_e ceil(X_e / b)] of ``pairs`` pairs over the experts of nonzero share, each holding
    at least one pair and at most ``rows`` (default: no cap beyond ``pairs``): the module's
    bounded marginals."""
    groups = tile_pmfs(_shares_key(shares), pairs, pairs if rows is None else rows, block_m)
    return float(sum(count * float(pmf @ np.arange(pmf.size)) for pmf, count in groups))


def _shares_key(shares: Sequence[float] | npt.ArrayLike) -> tuple[float, ...]:
    p = np.asarray(shares, dtype=np.float64)
    if (
        p.ndim != 1
        or p.size == 0
        or (p < 0).any()
        or not math.isclose(float(p.sum()), 1.0, rel_tol=1e-9)
    ):
        raise TileError("shares must be a non-empty one-dimensional distribution summing to 1")
    return tuple(float(x) for x in p[p > 0])


def bounded_marginals(
    shares: Sequence[float], pairs: int, rows: int
) -> tuple[int, npt.NDArray[np.float64], npt.NDArray[np.int64], int]:
    """The experts held at ``rows`` pairs (how many), and for the others their distinct shares
    of the pairs left, how many experts have each, and those pairs (``pairs`` less one per
    active expert and the held experts' ``rows - 1`` extra): the module's water-filling."""
    p = np.asarray(shares, dtype=np.float64)
    active = p.size
    if active < 1 or rows < 1 or not active <= pairs <= active * rows:
        raise TileError(
            f"need {active} active experts <= {pairs} pairs <= {active} x {rows} rows "
            "(each active expert holds 1 to N pairs)"
        )
    free = np.ones(active, dtype=bool)
    left = pairs - active
    while True:
        q = p * free
        q /= q.sum()
        held = free & (1.0 + left * q >= rows)
        if not held.any():
            break
        free &= ~held
        left -= int(held.sum()) * (rows - 1)
        if not free.any():
            break
    saturated = active - int(free.sum())
    if not free.any():
        return saturated, np.zeros(0), np.zeros(0, dtype=np.int64), 0
    unique, times = np.unique(q[free], return_counts=True)
    return saturated, unique, times.astype(np.int64), left


@functools.lru_cache(maxsize=65536)
def tile_pmfs(
    shares: tuple[float, ...], pairs: int, rows: int, block_m: int
) -> tuple[tuple[npt.NDArray[np.float64], int], ...]:
    """Per group of experts with equal bounded marginals, the distribution of one expert's row
    tiles (index = tiles) and the group's size; kept, as lookups repeat their shapes."""
    if block_m < 1 or pairs < 0:
        raise TileError(f"need block_m >= 1 and pairs >= 0, got {block_m}, {pairs}")
    saturated, free_shares, times, left = bounded_marginals(shares, pairs, rows)
    groups: list[tuple[npt.NDArray[np.float64], int]] = []
    top = -(-rows // block_m)  # the most tiles an expert can run
    if saturated:
        held = np.zeros(top + 1)
        held[top] = 1.0
        groups.append((held, saturated))
    if free_shares.size:
        # P(X > j b) for X = min(1 + Y, rows): 1 at j = 0, P(Y > j b - 1) below the cap, 0 at it.
        edges = np.arange(top + 1, dtype=np.float64) * block_m
        above = np.where(
            edges[None, :] >= rows,
            0.0,
            stats.binom.sf(edges[None, :] - 1.0, left, free_shares[:, None]),
        )
        above[:, 0] = 1.0
        pmfs = np.concatenate(
            (np.zeros((free_shares.size, 1)), above[:, :-1] - above[:, 1:]), axis=1
        )
        groups += [
            (np.clip(pmf, 0.0, None), int(count))
            for pmf, count in zip(pmfs, times.tolist(), strict=True)
        ]
    return tuple(groups)


@dataclass(frozen=True)
class TileCount:
    """The kernel's tiling of one load: block size, tiles run, and the balanced tiles at (A, M)."""

    block_m: int
    tiles: float
    balanced_tiles: int

    @property
    def extra_tiles(self) -> float:
        return self.tiles - self.balanced_tiles


def contract_expert_width(contract: Mapping[str, Any], where: str = "this table") -> int:
    """The expert width (intermediate size, before tensor parallelism) a contract records."""
    geometry = contract.get("geometry")
    found = geometry.get("expert_intermediate_size") if isinstance(geometry, Mapping) else None
    if found is None:
        found = contract.get("expert_intermediate_size")
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise TileError(
            f"{where}: the contract records no expert_intermediate_size, so the expert kernel's "
            "row tiles cannot be counted"
        )
    return found


def contract_kernel_shape(
    contract: Mapping[str, Any], local_experts: int, where: str = "this table"
) -> KernelShape:
    """The expert kernel's shape of a table (issue 18): its device family, local experts, whole
    expert width (full expert parallelism keeps experts whole at any TP) and quantization, as
    the contract records them; the configuration is then `moetables.triton_config`'s."""
    width = contract_expert_width(contract, where)
    geometry = contract.get("geometry")
    geometry = geometry if isinstance(geometry, Mapping) else {}
    quantization = geometry.get("quantization")
    block = geometry.get("weight_block_size")
    dtype = str(geometry.get("dtype") or "bf16")
    try:
        kernel_dtype, block_shape = config_dtype(
            dtype,
            str(quantization) if quantization else None,
            _block(block) if isinstance(block, Sequence) else None,
        )
        return KernelShape(
            device_family(str(contract.get("hardware", ""))),
            local_experts,
            width,
            kernel_dtype,
            block_shape,
        )
    except TritonConfigError as exc:
        raise TileError(f"{where}: {exc}") from None


# A sign is read too, so that a negative alpha is refused as such (power_law_shares), not as an
# unknown description.
_POWER_LAW = re.compile(r"^power_law\(\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*\)$")

LoadSpec = str | Sequence[int]


def parse_loads(loads: Any) -> tuple[str, float | tuple[int, ...] | None]:
    """A load description: ``"balanced"``, ``"uniform"``, ``"power_law(alpha)"`` or explicit
    per-expert counts (a list of integers >= 0). Returns (kind, parameter)."""
    if isinstance(loads, str):
        if loads in ("balanced", "uniform"):
            return loads, None
        match = _POWER_LAW.match(loads.strip())
        if match:
            alpha = float(match.group(1))
            power_law_shares(1, alpha)  # validates alpha
            return "power_law", alpha
        raise TileError(
            f"loads must be 'balanced', 'uniform', 'power_law(alpha)' or per-expert counts, got {loads!r}"
        )
    if isinstance(loads, Sequence) and not isinstance(loads, (bytes, bytearray)):
        counts = []
        for c in loads:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
                raise TileError(f"loads: per-expert counts must be integers >= 0, got {c!r}")
            counts.append(int(c))
        if not counts:
            raise TileError("loads: per-expert counts must not be empty")
        return "counts", tuple(counts)
    raise TileError(
        f"loads must be a string or a list of per-expert counts, got {type(loads).__name__}"
    )


def load_tiles(loads: Any, active: int, pairs: int, block_m: int, rows: int) -> float:
    """The row tiles (expected, for a distribution) of ``pairs`` pairs on ``active`` experts
    of a kernel that sees ``rows`` token rows (a distribution's experts hold at most that many;
    explicit counts are held to it by `moetables.lookup.queries.counts_problem`)."""
    kind, param = parse_loads(loads)
    if kind == "balanced":
        return float(row_tiles(balanced_counts(pairs, active), block_m))
    if kind == "counts":
        assert isinstance(param, tuple)
        c = np.asarray(param, dtype=np.int64)
        if int(c.sum()) != pairs or int((c > 0).sum()) != active:
            raise TileError(
                f"loads: the per-expert counts hold {int(c.sum())} pairs on {int((c > 0).sum())} "
                f"experts, the query {pairs} pairs on {active}"
            )
        return float(row_tiles(c, block_m))
    alpha = 0.0 if kind == "uniform" else float(param)  # type: ignore[arg-type]
    return _expected_tiles(alpha, active, pairs, block_m, rows)


@functools.lru_cache(maxsize=65536)
def _expected_tiles(alpha: float, active: int, pairs: int, block_m: int, rows: int) -> float:
    """`expected_row_tiles` of a power law (alpha = 0: uniform), kept by its five numbers (a
    lookup repeats them; the shares tuple of `tile_pmfs`' own key costs more to hash)."""
    return expected_row_tiles(pairs, power_law_shares(active, alpha), block_m, rows=rows)


class TimedLoad(Protocol):
    """A timed load of the expert kernel (``moetables.bundle.loads.LoadSpreadRow``)."""

    @property
    def tokens(self) -> int: ...
    @property
    def block_m(self) -> int: ...
    @property
    def tiles(self) -> int: ...
    @property
    def b2_us(self) -> float: ...
    @property
    def stable(self) -> bool: ...


@dataclass(frozen=True)
class TileFit:
    """``tile_cost_us``: the within-N least-squares slope of time on row tiles."""

    tile_cost_us: float
    records: int
    groups: int


def fit_tile_cost(
    rows: Sequence[TimedLoad], *, block_m: int = MODEL_BLOCK_M, exact: bool = False
) -> TileFit:
    """The cost of a row tile from loads timed at the same N (issue 18).

    Only stable records (B and 2B arms within 3 %) whose block is at least ``block_m`` rows
    count; each N is its own group (its balanced and spread loads differ in tiles only, the
    rows and pairs being the same), and the slope is the pooled within-group least squares of
    the 2B time on the tiles: sum (x - mean_N x)(y - mean_N y) / sum (x - mean_N x)^2.
    ``exact``: only records whose block is exactly ``block_m`` rows (a per-block model, bundle
    format 4).
    """
    groups: dict[int, list[TimedLoad]] = {}
    for r in rows:
        if r.stable and (r.block_m == block_m if exact else r.block_m >= block_m):
            groups.setdefault(r.tokens, []).append(r)
    sxy = sxx = 0.0
    used = 0
    kept = 0
    for rs in groups.values():
        if len(rs) < 2:
            continue
        x = np.array([r.tiles for r in rs], dtype=np.float64)
        y = np.array([r.b2_us for r in rs], dtype=np.float64)
        dx = x - x.mean()
        sxy += float(dx @ (y - y.mean()))
        sxx += float(dx @ dx)
        used += len(rs)
        kept += 1
    if sxx <= 0:
        which = "" if exact else ">= "
        raise TileError(f"no N with loads of different tiles at blocks of {which}{block_m} rows")
    return TileFit(sxy / sxx, used, kept)
