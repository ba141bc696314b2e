"""ComponentTables: a bundle opened once, deployments selected and cached for the process."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from moetables.bundle import EXPERTS, Bundle, TableEntry, load_table, open_bundle
from moetables.bundle.model import WaveModel
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.geometry import MoeTarget
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.codes import CODE_NAMES, INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.queries import (
    FEW_QUERIES,
    INT64_MAX,
    INT64_MIN,
    Query,
    counts_problem,
    load_problem,
    local_coordinates_problem,
    parse_query,
    read_columns,
)
from moetables.lookup.segments import SegmentedExpertSurface, contract_kernel_switches
from moetables.lookup.surface import Coordinates, ExpertSurface
from moetables.triton_config import KernelShape, TritonConfig
from moetables.waves import LoadCharge, WaveGrid

if TYPE_CHECKING:
    from moetables.comm import Cluster
    from moetables.estimate import BatchEstimate, LayerEstimate

__all__ = ["BatchResult", "ComponentTables", "DeploymentTables"]

SCALAR_CACHE_SIZE = 65536

AnySurface = ExpertSurface | SegmentedExpertSurface | BalancedExpertSurface


@dataclass(frozen=True, slots=True)
class BatchResult:
    time_us: npt.NDArray[np.float64]  # NaN where refused
    code: npt.NDArray[np.int8]  # OK, OUT_OF_SUPPORT, INVALID


def _balanced_tiles_at(
    shape: KernelShape,
    tokens: npt.NDArray[np.int64],
    active: npt.NDArray[np.int64],
    pairs: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Row tiles of the balanced stimulus (`moetables.tiles.balanced_counts`: M over A experts
    as evenly as integers allow) at each (N, A, M), at the block vLLM picks at N; 0 where A = 0."""
    blocks = np.array([shape.config(int(x)).block_m for x in tokens.ravel().tolist()]).reshape(
        tokens.shape
    )
    safe = np.maximum(active, 1)
    base, extra = pairs // safe, pairs % safe
    tiles = (safe - extra) * (-(-base // blocks)) + extra * (-(-(base + 1) // blocks))
    out: npt.NDArray[np.int64] = np.where(active > 0, tiles, 0)
    return out


class _ScalarCache:
    """``time_us``'s bounded cache, which also takes per-expert counts as a list or an array:
    the cache keys on its arguments, so unhashable counts are keyed as the tuple they equal."""

    __slots__ = ("_cached", "cache_clear", "cache_info")

    def __init__(self, cached: Any) -> None:
        self._cached = cached
        self.cache_clear = cached.cache_clear
        self.cache_info = cached.cache_info

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        try:
            result: float = self._cached(*args, **kwargs)
            return result
        except TypeError:
            loads = kwargs.get("loads")
            if loads is None or isinstance(loads, (str, tuple)):
                raise
            try:
                kwargs["loads"] = tuple(int(c) for c in loads)
            except (TypeError, ValueError):
                raise QueryError(
                    f"loads must be a string or a list of per-expert counts, got {loads!r}"
                ) from None
            retried: float = self._cached(*args, **kwargs)
            return retried


def _mixed_blocks(mean: Any, mean_sq: Any, own: Any) -> Any:
    """Whether the vertices behind an interpolated answer ran a block size other than ``own``
    (log2 of vLLM's at the query's N), from the interpolated log2 block ``mean`` and its square:
    with nonnegative weights, E[x^2] = E[x]^2 only if every vertex with weight has one x."""
    return (np.abs(mean_sq - mean**2) > 1e-9) | (np.abs(mean - own) > 1e-9)


class DeploymentTables:
    """The loaded, validated table of one deployment rank with its curves and surfaces."""

    def __init__(self, root: Path, entry: TableEntry, *, coordinates: Coordinates = "raw") -> None:
        self.entry = entry
        self.target = entry.target
        self._coordinates: Coordinates = coordinates
        table = load_table(root, entry)
        where = f"{entry.target.deployment} tp{entry.target.tp}"
        self._local: dict[tuple[str, str], LocalCurve] = {}
        self._experts: dict[tuple[str, str], AnySurface] = {}
        # A kernel-step table (its contract records expert_sampling.kernel_steps) answers each
        # query from its own kernel segment in N (moetables.lookup.segments); historical
        # balanced tables keep their old interpolation (R42).
        self.kernel_switches = (
            contract_kernel_switches(entry.contract, entry.geometry, where)
            if entry.layout != "historical"
            else None
        )
        # The expert rows' (N, A, M), kept for the balanced-tile surface (issue 18), built lazily.
        self._expert_points: dict[str, tuple[npt.NDArray[np.int64], ...]] = {}
        self._tile_surfaces: dict[str, tuple[AnySurface, AnySurface, AnySurface]] = {}
        self._wave_grids: dict[WaveModel, WaveGrid] = {}
        for component in entry.components:
            for mode in entry.modes:
                rows = table.select(component, mode)
                label = f"{component}/{mode} [{where}]"
                if component != EXPERTS:
                    self._local[(component, mode)] = LocalCurve(
                        table.tokens[rows], table.time_us[rows], label
                    )
                    continue
                self._expert_points[mode] = (
                    table.tokens[rows],
                    table.activated_experts[rows],
                    table.local_assignments[rows],
                )
                if entry.layout == "historical":
                    self._experts[(component, mode)] = BalancedExpertSurface(
                        table.tokens[rows],
                        table.activated_experts[rows],
                        table.local_assignments[rows],
                        table.time_us[rows],
                        entry.geometry,
                        label=label,
                    )
                else:
                    self._experts[(component, mode)] = self._surface(
                        table.tokens[rows],
                        table.activated_experts[rows],
                        table.local_assignments[rows],
                        table.time_us[rows],
                        label,
                    )
        self.components = entry.components
        self.modes = entry.modes
        self.root = root
        # The bundle this rank came from: a layer estimate needs its sibling ranks.
        self.owner: ComponentTables | None = None
        # A bounded cache keyed by every coordinate (R40); errors are not cached.
        self.time_us = _ScalarCache(functools.lru_cache(maxsize=SCALAR_CACHE_SIZE)(self._time_us))

    def _surface(
        self,
        tokens: npt.NDArray[np.int64],
        active: npt.NDArray[np.int64],
        pairs: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        label: str,
    ) -> ExpertSurface | SegmentedExpertSurface:
        """The surface of a current-layout table's expert rows: one triangulation, or one per
        kernel segment where the contract records kernel steps."""
        if self.kernel_switches is not None:
            return SegmentedExpertSurface(
                tokens,
                active,
                pairs,
                values,
                self.entry.geometry,
                self.kernel_switches,
                label=label,
                coordinates=self._coordinates,
            )
        return ExpertSurface(
            tokens,
            active,
            pairs,
            values,
            self.entry.geometry,
            label=label,
            coordinates=self._coordinates,
        )

    def estimate(
        self,
        tokens_per_rank: Sequence[int],
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> LayerEstimate:
        """The MoE layer estimate of this rank's deployment (every rank of its TP/DP/SP) for
        one step's padded per-DP-rank token counts; see `moetables.estimate`."""
        owner = self.owner
        if owner is None:
            owner = self.owner = ComponentTables(self.root, coordinates=self._coordinates)
        t = self.target
        from moetables.estimate import own_deployment

        own_deployment(t, options)
        return owner.estimate(
            tokens_per_rank,
            tp=t.tp,
            dp=t.dp,
            sequence_parallel=t.sequence_parallel,
            policy=policy,
            cluster=cluster,
            mode=mode,
            **options,
        )

    def estimate_batch(
        self,
        tokens_per_rank: Any,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> BatchEstimate:
        """`estimate` for many steps at once: arrays per step (see `BatchEstimate`)."""
        owner = self.owner
        if owner is None:
            owner = self.owner = ComponentTables(self.root, coordinates=self._coordinates)
        t = self.target
        from moetables.estimate import own_deployment

        own_deployment(t, options)
        return owner.estimate_batch(
            tokens_per_rank,
            tp=t.tp,
            dp=t.dp,
            sequence_parallel=t.sequence_parallel,
            policy=policy,
            cluster=cluster,
            mode=mode,
            **options,
        )

    def _refuse_described_historical(self, loads: Any) -> None:
        """A historical table answers balanced queries only (R42): its publisher's rows hold
        no kernel shape to count tiles with, so a load description is outside what it covers."""
        if self.entry.layout != "historical" or loads is None:
            return
        if isinstance(loads, str) and loads == "balanced":
            return
        raise CoverageError(
            f"{self.entry.where}: a historical table answers balanced queries only (R42); "
            f"loads={loads if isinstance(loads, str) else 'per-expert counts'} needs a current "
            "table (its contract records the expert kernel's shape)"
        )

    @property
    def fitted_tile_cost_us(self) -> float | None:
        """The table's own row-tile cost (format 3's tile model, issue 18; format 4: the cost
        of its largest recorded block), or None: whether a load description can be answered
        without a caller's cost. Where the table records a cost per block size, the charge
        reads `tile_cost_at` instead."""
        models = self.entry.expert_loads.tile_only
        return models[0].tile_cost_us if models else None

    @property
    def tile_block_m(self) -> int:
        """The smallest vLLM block (rows) whose extra tiles a caller's one cost is charged at:
        the table's tile model's ``block_m`` (format 3; 64 for the FP8 table, whose kernel never
        runs 128-row blocks at E = 128); format 4: its largest recorded block (a caller's one
        number is not read as every block's cost); else `moetables.tiles.MODEL_BLOCK_M` (128)."""
        from moetables.tiles import MODEL_BLOCK_M

        models = self.entry.expert_loads.models
        return models[0].block_m if models else MODEL_BLOCK_M

    def tile_cost_at(self, block_m: int) -> float | None:
        """The table's recorded cost of an extra row tile where vLLM's block is ``block_m`` rows
        (issue 18; format 4 records one per block size, format 3 one for blocks of at least its
        ``block_m``), or None: nothing is charged there."""
        return self.entry.expert_loads.block_cost_us(block_m)

    def charge_at(self, block_m: int, tile_cost_us: float | None) -> LoadCharge | None:
        """The one place a load's charge is chosen (issue 18): a caller's ``tile_cost_us`` per
        tile where vLLM's block is at least `tile_block_m` rows; else the table's own model for
        that block: a cost per tile (formats 3, 4) or per weighted wave of the kernel's grid
        (format 5, `moetables.waves`); None: no charge at this block."""
        if tile_cost_us is not None:
            if block_m < self.tile_block_m:
                return None
            return LoadCharge("tiles", float(tile_cost_us))
        model = self.entry.expert_loads.block_model(block_m)
        if model is None:
            return None
        if isinstance(model, WaveModel):
            grid = self._wave_grids.get(model)
            if grid is None:
                from moetables.bundle.loads import wave_grid

                e = self.entry
                try:
                    grid = wave_grid(e.contract, model.programs_per_sm, model.sms, e.where)
                except BundleError as exc:
                    raise QueryError(str(exc)) from None
                self._wave_grids[model] = grid
            return LoadCharge("waves", model.wave_cost_us, grid)
        return LoadCharge("tiles", model.tile_cost_us)

    def tile_charge_us(self, block_m: int, tile_cost_us: float | None) -> float | None:
        """The cost per extra tile `charge_at` picks at this block; None where there is none or
        where the block is charged per wave (format 5)."""
        charge = self.charge_at(block_m, tile_cost_us)
        return charge.cost_us if charge is not None and charge.kind == "tiles" else None

    def charged_units(
        self, charge: LoadCharge, tokens: npt.ArrayLike, tiles: npt.ArrayLike
    ) -> npt.NDArray[np.float64]:
        """What ``charge`` counts for loads running ``tiles`` row tiles at ``tokens``: the tiles,
        or their weighted waves at the configuration's BLOCK_SIZE_N for each N."""
        t = np.asarray(tiles, dtype=np.float64)
        if charge.grid is None:
            return t
        shape = self.tile_shape()
        n = np.asarray(tokens, dtype=np.int64)
        block_n = np.array([shape.config(int(x)).block_n for x in n.ravel().tolist()])
        out = np.empty(t.size, dtype=np.float64)
        for bn in set(block_n.tolist()):
            at = block_n == bn
            out[at] = charge.grid.waves(t.ravel()[at], int(bn))
        return out.reshape(t.shape)

    def tile_shape(self) -> KernelShape:
        """The expert kernel's shape of this rank (local experts, whole expert width, dtype,
        vLLM device family), from the contract: what its configuration depends on (issue 18)."""
        from moetables.tiles import contract_kernel_shape

        e = self.entry
        try:
            return contract_kernel_shape(e.contract, e.geometry.local_experts, e.where)
        except ValueError as exc:
            raise QueryError(str(exc)) from None

    def _tile_surface(self, mode: str) -> tuple[AnySurface, AnySurface, AnySurface]:
        """The table's own points with the stimulus' row tiles in place of time: interpolated
        exactly as time is, it gives the balanced tiles the table embodies anywhere. With it,
        the log2 of each point's block size and its square, interpolated the same way: their
        spread says whether the vertices behind an answer all ran one block size."""
        surfaces = self._tile_surfaces.get(mode)
        if surfaces is not None:
            return surfaces
        from moetables.tiles import balanced_counts, row_tiles

        self._known(EXPERTS, mode)
        shape = self.tile_shape()
        n, a, m = self._expert_points[mode]
        blocks = np.array([shape.config(int(ni)).block_m for ni in n.tolist()], dtype=np.int64)
        tiles = np.array(
            [
                row_tiles(balanced_counts(int(mi), int(ai)), int(bi)) if ai > 0 and mi >= ai else 0
                for ai, mi, bi in zip(a.tolist(), m.tolist(), blocks.tolist(), strict=True)
            ],
            dtype=np.float64,
        )
        level = np.log2(blocks.astype(np.float64))
        old = self._experts[(EXPERTS, mode)]
        built: list[AnySurface] = []
        for values, what in ((tiles, "balanced tiles"), (level, "block"), (level**2, "block²")):
            label = f"{what} of {old.label}"
            if isinstance(old, BalancedExpertSurface):
                built.append(
                    BalancedExpertSurface(n, a, m, values, self.entry.geometry, label=label)
                )
            else:
                # The time surface's own points, in its rows' order: its triangulation (and
                # kernel segments) serve these values as a new build over them would.
                assert isinstance(old, (ExpertSurface, SegmentedExpertSurface))
                built.append(old.with_values(values, label=label))
        surfaces = self._tile_surfaces[mode] = (built[0], built[1], built[2])
        return surfaces

    def balanced_tiles(
        self, tokens: int, activated_experts: int, local_assignments: int, mode: str = "eager"
    ) -> float:
        """The row tiles the table's balanced stimulus embodies at (N, A, M), interpolated as
        the time is (issue 18); refused where the time is. Where the points behind the answer
        ran another block size than vLLM picks at N (a table without kernel steps, between
        points across a configuration switch), their tiles are of another size and say nothing
        of this N's: there the balanced stimulus' own tiles at (N, A, M) are the reference."""
        tiles, level, square = self._tile_surface(mode)
        value = tiles.time(tokens, activated_experts, local_assignments)
        mean = level.time(tokens, activated_experts, local_assignments)
        mean_sq = square.time(tokens, activated_experts, local_assignments)
        shape = self.tile_shape()
        if _mixed_blocks(mean, mean_sq, math.log2(shape.config(tokens).block_m)):
            return float(
                _balanced_tiles_at(
                    shape,
                    np.array([tokens]),
                    np.array([activated_experts]),
                    np.array([local_assignments]),
                )[0]
            )
        return value

    def balanced_tiles_batch(
        self,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike,
        local_assignments: npt.ArrayLike,
        mode: str = "eager",
    ) -> BatchResult:
        """`balanced_tiles` for arrays; refusals are per-row codes as in `batch`."""
        n = np.asarray(tokens, dtype=np.int64)
        a = np.asarray(activated_experts, dtype=np.int64)
        m = np.asarray(local_assignments, dtype=np.int64)
        tiles, level, square = self._tile_surface(mode)
        values, codes = tiles.batch(n, a, m)
        mean, _ = level.batch(n, a, m)
        mean_sq, _ = square.batch(n, a, m)
        shape = self.tile_shape()
        own = np.log2([float(shape.config(int(x)).block_m) for x in n.ravel().tolist()])
        own = own.reshape(n.shape)
        mixed = _mixed_blocks(mean, mean_sq, own) & (codes == OK)
        if mixed.any():
            values = np.where(mixed, _balanced_tiles_at(shape, n, a, m).astype(np.float64), values)
        return BatchResult(time_us=values, code=codes)

    def balanced_units_batch(
        self,
        charge: LoadCharge,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike,
        local_assignments: npt.ArrayLike,
        mode: str = "eager",
    ) -> BatchResult:
        """What ``charge`` counts for the table's balanced stimulus at (N, A, M): its tiles
        interpolated as the time is (`balanced_tiles_batch`), or its weighted waves at the
        query's own (N, A, M) and configuration. Waves are not interpolated between the table's
        points: points across a configuration switch count programs of other sizes (BLOCK_SIZE_N
        128 at 64-row blocks, 256 at 32-row), and their waves are not this N's."""
        if charge.grid is None:
            return self.balanced_tiles_batch(tokens, activated_experts, local_assignments, mode)
        n = np.asarray(tokens, dtype=np.int64)
        a = np.asarray(activated_experts, dtype=np.int64)
        m = np.asarray(local_assignments, dtype=np.int64)
        # Refused where the time (and the tiles) are.
        codes = self.balanced_tiles_batch(n, a, m, mode).code
        values = self.charged_units(charge, n, _balanced_tiles_at(self.tile_shape(), n, a, m))
        return BatchResult(time_us=np.where(codes == OK, values, np.nan), code=codes)

    def experts_time_us(
        self,
        tokens: int,
        activated_experts: int,
        local_assignments: int,
        *,
        loads: Any = "balanced",
        tile_cost_us: float | None = None,
        mode: str = "eager",
    ) -> float:
        """The expert component at (N, A, M) for a load description (issue 18).

        ``loads``: ``"balanced"`` (the table's answer, bit for bit), ``"uniform"`` (expected
        tiles of a multinomial over the A experts), ``"power_law(alpha)"`` (shares proportional
        to rank^-alpha) or explicit per-expert counts (A of them nonzero, adding up to M). The
        row tiles beyond the table's balanced ones are charged ``tile_cost_us`` each where
        vLLM's block is at least `tile_block_m` rows (the table's tile model's ``block_m``, else
        128; `moetables.tiles`); without ``tile_cost_us``, at the table's own cost for the block
        vLLM picks at N (`tile_cost_at`: format 3's one model, format 4's per block size),
        nothing where none is recorded. Any load but balanced needs a cost, given or recorded.
        """
        from moetables.tiles import TileError, load_tiles

        self._refuse_described_historical(loads)
        fitted = self.fitted_tile_cost_us
        problem = load_problem(
            EXPERTS, loads, tile_cost_us, fitted_cost_us=fitted
        ) or counts_problem(
            loads, activated_experts, local_assignments, tokens, self.entry.geometry.local_experts
        )
        if problem is not None:
            raise QueryError(problem)
        base = self.time_us(EXPERTS, tokens, activated_experts, local_assignments, mode)
        if loads is None or (isinstance(loads, str) and loads == "balanced"):
            return base
        if activated_experts == 0:
            # An all-remote row (A = M = 0, feasible: time_us answered it): no pair, no tile,
            # nothing to spread, so every description is the table's answer.
            return base
        config = self.tile_shape().config(tokens)
        bm = config.block_m
        charge = self.charge_at(bm, tile_cost_us)
        if charge is None:
            return base
        if charge.grid is not None:
            reference = charge.grid.waves(
                _balanced_tiles_at(
                    self.tile_shape(),
                    np.array([tokens]),
                    np.array([activated_experts]),
                    np.array([local_assignments]),
                ),
                config.block_n,
            )
            return base + charge.cost_us * (
                self._load_waves(
                    loads, tokens, activated_experts, local_assignments, config, charge
                )
                - float(reference[0])
            )
        try:
            tiles = load_tiles(loads, activated_experts, local_assignments, bm, tokens)
        except TileError as exc:
            raise QueryError(str(exc)) from None
        return base + float(charge.cost_us) * (
            tiles - self.balanced_tiles(tokens, activated_experts, local_assignments, mode)
        )

    @staticmethod
    def _load_waves(
        loads: Any, rows: int, active: int, pairs: int, config: TritonConfig, charge: LoadCharge
    ) -> float:
        """The weighted waves of a load description: explicit counts' own, a distribution's
        expected over its tile total's distribution (`moetables.waves.expected_waves`)."""
        from moetables.tiles import TileError, load_tiles, parse_loads
        from moetables.waves import expected_waves

        assert charge.grid is not None
        try:
            kind, param = parse_loads(loads)
            if kind in ("counts", "balanced"):
                tiles = load_tiles(loads, active, pairs, config.block_m, rows)
                return float(charge.grid.waves(tiles, config.block_n))
            alpha = 0.0 if kind == "uniform" else float(param)  # type: ignore[arg-type]
            return expected_waves(
                alpha, active, pairs, config.block_m, config.block_n, charge.grid, rows
            )
        except TileError as exc:
            raise QueryError(str(exc)) from None

    def _known(self, component: str, mode: str) -> None:
        if component not in self.components:
            raise QueryError(
                f"unknown component {component!r}; this table has {list(self.components)}"
            )
        if mode not in self.modes:
            raise QueryError(
                f"mode {mode!r} is not measured here; this table has {list(self.modes)}"
            )

    def _time_us(
        self,
        component: str,
        tokens: int,
        activated_experts: int = -1,
        local_assignments: int = -1,
        mode: str = "eager",
        *,
        loads: Any = None,
        tile_cost_us: float | None = None,
    ) -> float:
        """Microseconds for one query; QueryError if malformed, CoverageError if unmeasured.

        ``loads`` and ``tile_cost_us`` (issue 18; experts only) answer for a load description
        as `experts_time_us` does. The answer is cached with its arguments, so per-expert
        counts are given as a tuple here (a list is unhashable); `experts_time_us` takes any.
        """
        if loads is not None or tile_cost_us is not None:
            self._known(component, mode)
            if component == EXPERTS:
                self._refuse_described_historical(loads)
            problem = load_problem(
                component, loads, tile_cost_us, fitted_cost_us=self.fitted_tile_cost_us
            )
            if problem is not None:
                raise QueryError(problem)
            return self.experts_time_us(
                tokens,
                activated_experts,
                local_assignments,
                loads=loads,
                tile_cost_us=tile_cost_us,
                mode=mode,
            )
        try:
            surface = self._experts.get((component, mode))
        except TypeError:  # unhashable, so unknown: _known words the error
            surface = None
        if surface is not None:  # the hot path: a known component and mode, experts
            return surface.time(tokens, activated_experts, local_assignments)
        self._known(component, mode)
        problem = local_coordinates_problem(component, activated_experts, local_assignments)
        if problem is not None:
            raise QueryError(problem)
        if tokens < 1:
            raise QueryError(f"tokens must be at least 1, got {tokens}")
        return self._local[(component, mode)].time(tokens)

    def batch(
        self,
        component: str,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike | None = None,
        local_assignments: npt.ArrayLike | None = None,
        mode: str = "eager",
        *,
        loads: Any = None,
        tile_cost_us: float | None = None,
    ) -> BatchResult:
        """Vectorised lookups of one component and mode; refusals are per-row codes.

        ``loads`` (issue 18; experts only): one load description for every row, or a list of
        one per row (each a string or a list of per-expert counts); ``tile_cost_us`` as in
        `experts_time_us`. Each row is answered as `experts_time_us` answers it; a row whose
        counts miss its (A, M) is refused (INVALID). Balanced rows are today's answer.
        """
        if loads is not None or tile_cost_us is not None:
            return self._loaded_batch(
                component,
                tokens,
                activated_experts,
                local_assignments,
                mode,
                loads,
                tile_cost_us,
            )
        self._known(component, mode)
        n = np.asarray(tokens, dtype=np.int64)
        if component == EXPERTS:
            if activated_experts is None or local_assignments is None:
                raise QueryError("experts need activated_experts and local_assignments")
            a = np.asarray(activated_experts, dtype=np.int64)
            m = np.asarray(local_assignments, dtype=np.int64)
            if a.shape != n.shape or m.shape != n.shape:
                raise QueryError("tokens, activated_experts and local_assignments differ in length")
            values, codes = self._experts[(component, mode)].batch(n, a, m)
        else:
            values, codes = self._local[(component, mode)].batch(n)
        return BatchResult(time_us=values, code=codes)

    def _loaded_batch(
        self,
        component: str,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike | None,
        local_assignments: npt.ArrayLike | None,
        mode: str,
        loads: Any,
        tile_cost_us: float | None,
    ) -> BatchResult:
        """`batch` with a load description: the plain batch, then each row whose description
        is not balanced answered again by `experts_time_us` (the same value a scalar call
        gives, bit for bit)."""
        self._known(component, mode)
        if component == EXPERTS and not (isinstance(loads, str) and loads == "balanced"):
            if isinstance(loads, str) or loads is None:
                self._refuse_described_historical(loads)
            else:
                for d in loads:
                    self._refuse_described_historical(d)
        fitted = self.fitted_tile_cost_us
        result = self.batch(component, tokens, activated_experts, local_assignments, mode)
        rows = result.time_us.size
        if isinstance(loads, str):
            problem = load_problem(component, loads, tile_cost_us, fitted_cost_us=fitted)
            if problem is not None:
                raise QueryError(problem)
            if loads == "balanced":
                return result
            each: list[Any] = [loads] * rows
        elif loads is None:
            raise QueryError(
                load_problem(component, loads, tile_cost_us, fitted_cost_us=fitted)
                or "loads is required"
            )
        else:
            each = list(loads)
            if len(each) != rows:
                raise QueryError(
                    f"loads: one description per row or one for all; got {len(each)} for {rows} rows"
                )
            for d in each:
                if not isinstance(d, (str, Sequence)) or isinstance(d, (bytes, bytearray)):
                    raise QueryError(
                        "loads: each row's description is a string or a list of per-expert "
                        f"counts, got {d!r} (give one list of counts for one row as [[...]])"
                    )
                problem = load_problem(component, d, tile_cost_us, fitted_cost_us=fitted)
                if problem is not None:
                    raise QueryError(problem)
        values = result.time_us.ravel().copy()
        codes = result.code.ravel().copy()
        n = np.asarray(tokens, dtype=np.int64).ravel().tolist()
        a = np.asarray(activated_experts, dtype=np.int64).ravel().tolist()
        m = np.asarray(local_assignments, dtype=np.int64).ravel().tolist()
        for i, d in enumerate(each):
            if codes[i] != OK or (isinstance(d, str) and d == "balanced"):
                continue
            try:
                values[i] = self.experts_time_us(
                    n[i], a[i], m[i], loads=d, tile_cost_us=tile_cost_us, mode=mode
                )
            except QueryError:
                values[i], codes[i] = math.nan, INVALID
            except CoverageError:
                values[i], codes[i] = math.nan, OUT_OF_SUPPORT
        shape = result.time_us.shape
        return BatchResult(time_us=values.reshape(shape), code=codes.reshape(shape))

    def answer(self, queries: Sequence[Any]) -> list[dict[str, Any]]:
        """One answer per query, in order: ``{"time_us": x}`` or ``{"error": ..., "message": ...}``.

        Well-formed queries are read column by column and grouped by component and mode;
        anything else is parsed strictly, one by one. Each group is answered in one batch,
        and refused rows are asked again one by one only to word their message.
        """
        answers: list[dict[str, Any] | None] = [None] * len(queries)
        known = self._group_index()
        parts, rest = read_columns(queries, known)
        groups: dict[tuple[str, str], list[tuple[Any, Any, Any, Any]]] = {}
        for key, part in zip(known, parts, strict=True):
            if part is not None:
                groups[key] = [part]
        strict: dict[tuple[str, str], tuple[list[int], list[int], list[int], list[int]]] = {}
        wording: dict[int, Query] = {}  # rows whose refusal names coordinates no batch holds
        for i in rest:
            try:
                query = parse_query(queries[i])
                self._known(query.component, query.mode)
            except QueryError as exc:
                answers[i] = {"error": "invalid", "message": str(exc)}
                continue
            if query.loads is not None and query.loads != "balanced":
                answers[i] = self._one(query)  # a load description (issue 18): one by one
                continue
            coordinates = (query.tokens, query.activated_experts, query.local_assignments)
            if not all(INT64_MIN <= v <= INT64_MAX for v in coordinates):
                if query.component == EXPERTS or not INT64_MIN <= query.tokens <= INT64_MAX:
                    answers[i] = self._one(query)  # beyond what a batch can hold
                    continue
                # A local batch never reads the expert coordinates; a refusal still words them.
                coordinates = (query.tokens, -1, -1)
                wording[i] = query
            group = strict.setdefault((query.component, query.mode), ([], [], [], []))
            for column, value in zip(group, (i, *coordinates), strict=True):
                column.append(value)
        for key, columns in strict.items():
            if len(columns[0]) > FEW_QUERIES:
                rows_, n_, a_, m_ = (np.array(c, dtype=np.int64) for c in columns)
                groups.setdefault(key, []).append((rows_, n_, a_, m_))
            else:
                groups.setdefault(key, []).append(columns)
        for (component, mode), found in groups.items():
            if len(found) == 1:
                rows, n_col, a_col, m_col = found[0]
            else:  # in query order, as one batch
                rows, n_col, a_col, m_col = (np.concatenate(c) for c in zip(*found, strict=True))
                order = np.argsort(rows, kind="stable")
                rows, n_col, a_col, m_col = rows[order], n_col[order], a_col[order], m_col[order]
            values, codes = self._group(component, mode, n_col, a_col, m_col)
            if isinstance(codes, list):  # a few rows, in plain Python
                for i, n, a, m, value, code in zip(
                    rows, n_col, a_col, m_col, values, codes, strict=True
                ):
                    answers[i] = (
                        {"time_us": value}
                        if code == OK
                        else self._refusal(wording.get(i) or Query(component, mode, n, a, m), code)
                    )
                continue
            good = codes == OK
            answered = (
                zip(rows.tolist(), values.tolist(), strict=True)
                if good.all()
                else zip(rows[good].tolist(), values[good].tolist(), strict=True)
            )
            for i, value in answered:
                answers[i] = {"time_us": value}
            for j in np.flatnonzero(~good).tolist():
                i = int(rows[j])
                query = wording.get(i) or Query(
                    component, mode, int(n_col[j]), int(a_col[j]), int(m_col[j])
                )
                answers[i] = self._refusal(query, int(codes[j]))
        return [
            a if a is not None else {"error": "invalid", "message": "unanswered"} for a in answers
        ]

    def _group_index(self) -> dict[tuple[str, str], int]:
        """Each measured (component, mode), numbered (built once)."""
        index: dict[tuple[str, str], int] | None = self.__dict__.get("_groups")
        if index is None:
            pairs = [(c, m) for c in self.components for m in self.modes]
            index = self.__dict__["_groups"] = {key: g for g, key in enumerate(pairs)}
        return index

    def _group(
        self,
        component: str,
        mode: str,
        tokens: Any,
        activated_experts: Any,
        local_assignments: Any,
    ) -> tuple[Any, Any]:
        """Times and codes of one group of queries, as ``batch`` gives them: arrays, or lists
        for a few rows (given as lists).

        A few rows of a local component go through its curve's scalar path, which answers
        exactly as its batch does and costs less than setting up the arrays.
        """
        few = isinstance(tokens, list)
        if few and component != EXPERTS:
            curve = self._local[(component, mode)]
            values: list[float] = []
            codes: list[int] = []
            for n in tokens:
                try:
                    values.append(curve.time(n) if n >= 1 else math.nan)
                    codes.append(OK if n >= 1 else INVALID)
                except CoverageError:
                    values.append(math.nan)
                    codes.append(OUT_OF_SUPPORT)
            return values, codes
        result = (
            self.batch(component, tokens, activated_experts, local_assignments, mode=mode)
            if component == EXPERTS
            else self.batch(component, tokens, mode=mode)
        )
        if few:
            return result.time_us.tolist(), result.code.tolist()
        return result.time_us, result.code

    def _one(self, query: Query) -> dict[str, Any]:
        """A query answered by the scalar path alone."""
        try:
            if query.loads is not None:
                return {
                    "time_us": self.experts_time_us(
                        query.tokens,
                        query.activated_experts,
                        query.local_assignments,
                        loads=query.loads,
                        tile_cost_us=query.tile_cost_us,
                        mode=query.mode,
                    )
                }
            return {
                "time_us": self._time_us(
                    query.component,
                    query.tokens,
                    query.activated_experts,
                    query.local_assignments,
                    query.mode,
                )
            }
        except QueryError as exc:
            return {"error": "invalid", "message": str(exc)}
        except CoverageError as exc:
            return {"error": "out_of_support", "message": str(exc)}

    def _refusal(self, query: Query, code: int) -> dict[str, Any]:
        surface = self._experts.get((query.component, query.mode))
        if (
            code == OUT_OF_SUPPORT
            and isinstance(surface, (ExpertSurface, SegmentedExpertSurface))
            and (query.activated_experts, query.local_assignments) != (0, 0)
        ):
            # Batch and scalar locate alike (bit for bit), so the batch's refusal stands:
            # word it without walking the triangulation a second time.
            message = surface.outside_message(
                query.tokens, query.activated_experts, query.local_assignments
            )
            return {"error": "out_of_support", "message": message}
        try:
            self._time_us(
                query.component,
                query.tokens,
                query.activated_experts,
                query.local_assignments,
                query.mode,
            )
        except QueryError as exc:
            return {"error": "invalid", "message": str(exc)}
        except CoverageError as exc:
            return {"error": "out_of_support", "message": str(exc)}
        # The batch and scalar paths disagree only at the hull's rounding edge; keep the refusal.
        return {"error": CODE_NAMES.get(code, "invalid"), "message": "outside measured support"}


class ComponentTables:
    """A bundle opened for lookups. Deployments load once and stay cached with the process,
    as do deployments the bundle does not cover; a corrupt table raises every time (R43).
    """

    def __init__(self, bundle: str | Path | Bundle, *, coordinates: Coordinates = "raw") -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)
        self.coordinates: Coordinates = coordinates
        self._loaded: dict[tuple[int, int, int, bool], DeploymentTables] = {}
        self._absent: dict[tuple[int, int, int, bool], str] = {}
        self._lock = threading.Lock()

    def deployment(
        self, tp: int, dp: int, rank: int, sequence_parallel: bool = False
    ) -> DeploymentTables:
        key = (tp, dp, rank, sequence_parallel)
        found = self._loaded.get(key)
        if found is not None:
            return found
        if key in self._absent:
            raise CoverageError(self._absent[key])
        try:
            target = MoeTarget.for_rank(tp, dp, rank, sequence_parallel)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        with self._lock:
            found = self._loaded.get(key)
            if found is not None:
                return found
            entry = self.bundle.entry_for(target)
            if entry is None:
                have = ", ".join(
                    f"tp{e.target.tp}/{e.target.deployment}" for e in self.bundle.entries
                )
                message = (
                    f"no table for TP{tp}/DP{dp}/EP{tp * dp} rank {rank} "
                    f"sequence_parallel={sequence_parallel}; this bundle covers: {have}"
                )
                self._absent[key] = message
                raise CoverageError(message)
            tables = DeploymentTables(self.bundle.root, entry, coordinates=self.coordinates)
            tables.owner = self
            self._loaded[key] = tables
            return tables

    def estimate(
        self,
        tokens_per_rank: Sequence[int],
        *,
        tp: int,
        dp: int,
        sequence_parallel: bool = False,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> LayerEstimate:
        """One MoE layer in one step of the TP/DP(/SP) deployment: per rank rows, N, A, M,
        component times, compute, wait and transfer; the collectives; the layer time.

        ``options``: ``expert_counts`` (histogram), ``active_curve`` and ``load_shares``
        (custom), ``seed`` (random, captured), ``capture_sizes`` (graph mode), ``profile``, ``layer``
        and ``captured_expectation`` (captured: a `moetables.profiles.RoutingProfile`).
        """
        from moetables.estimate import check_estimate_options, estimator_for

        check_estimate_options(options, "estimate")
        return estimator_for(self, tp, dp, sequence_parallel).estimate(
            tokens_per_rank, policy=policy, cluster=cluster, mode=mode, **options
        )

    def estimate_batch(
        self,
        tokens_per_rank: Any,
        *,
        tp: int,
        dp: int,
        sequence_parallel: bool = False,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> BatchEstimate:
        """`estimate` for many steps: ``tokens_per_rank`` of shape (steps, dp)."""
        from moetables.estimate import check_estimate_options, estimator_for

        check_estimate_options(options, "estimate_batch")
        return estimator_for(self, tp, dp, sequence_parallel).estimate_batch(
            tokens_per_rank, policy=policy, cluster=cluster, mode=mode, **options
        )


# Re-exported for callers that switch on batch codes.
__all__ += ["INVALID", "OK", "OUT_OF_SUPPORT"]
