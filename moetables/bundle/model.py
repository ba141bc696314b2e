"""The in-memory shape of a bundle: its entries (one per deployment rank) and their tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from moetables.geometry import ExpertGeometry, MoeTarget

__all__ = [
    "BLOCK_MODELS_FORMAT_VERSION",
    "BLOCK_TILE_MODEL_SCHEMA",
    "COLUMNS",
    "CONSERVED_COMPONENTS",
    "CONTRACT_SCHEMAS",
    "CURRENT_FORMAT_VERSION",
    "CURRENT_FORMAT_VERSIONS",
    "CURRENT_SCHEMA",
    "EXPERTS",
    "EXPERT_LOAD_ROWS",
    "HISTORICAL_SCHEMA",
    "LOCAL_COMPONENTS",
    "METHOD_TOLERANCE",
    "MODES",
    "SUPPLEMENT_FIELDS",
    "SUPPLEMENT_KEY",
    "SUPPLEMENT_MEASURED",
    "TILE_MODEL_SCHEMAS",
    "WAVE_MODELS_FORMAT_VERSION",
    "WAVE_MODEL_SCHEMA",
    "Bundle",
    "ComponentTable",
    "ExpertLoads",
    "Layout",
    "QualityFile",
    "QualityRefs",
    "TableEntry",
    "TileModel",
    "WaveModel",
]

CURRENT_SCHEMA = "moe-components"
# Format versions of the current layout this reader knows: 2 adds quality evidence files, 3 the
# per-entry ``expert_loads`` record (issue 18: the rows' load distribution, a fitted tile model),
# 4 the per-block-size tile models (``expert_loads.tile_models``: one cost per vLLM block size).
# 5 the per-block wave models (``tile_models`` items of ``WAVE_MODEL_SCHEMA``: a cost per wave of
# the kernel's grid over the SMs, where a cost per tile does not hold).
CURRENT_FORMAT_VERSIONS = (1, 2, 3, 4, 5)
CURRENT_FORMAT_VERSION = 2
LOADS_FORMAT_VERSION = 3
BLOCK_MODELS_FORMAT_VERSION = 4
WAVE_MODELS_FORMAT_VERSION = 5
# The per-expert load distributions an expert row may be measured under. Every table so far
# holds the acquisition stimulus' balanced histogram; another name is refused, never read as it.
EXPERT_LOAD_ROWS = ("balanced",)
# Tile models this reader applies (moetables.tiles: vLLM's row tiles, a cost per extra tile).
TILE_MODEL_SCHEMAS = ("row-tiles-v1",)
# Format 4's per-block model: its cost holds where vLLM's block is exactly ``block_m`` rows (a
# v1 model's, where it is at least ``block_m``: a different charge, so a different name, R30).
BLOCK_TILE_MODEL_SCHEMA = "row-tiles-per-block-v1"
# Format 5's per-block wave model (moetables.waves): where vLLM's block is exactly ``block_m``
# rows, each weighted wave of the kernel's grid beyond the balanced histogram's costs
# ``wave_cost_us``. Not a cost per tile, so not a tile schema (R30).
WAVE_MODEL_SCHEMA = "row-waves-per-block-v1"
# Method/schema versions of current contracts this reader knows (R30: a semantic method
# change gets a new name, and an unknown one is refused rather than read as this one).
CONTRACT_SCHEMAS = ("moe-components-contract-v1",)
# What a contract's ``supplementary_conservation`` must say of conservation traces measured
# separately from the table (``python -m acquisition conserve``): the reader refuses less.
SUPPLEMENT_KEY = "supplementary_conservation"
SUPPLEMENT_FIELDS = ("measured", "measured_at", "command_line", "device_name", "written_by")
SUPPLEMENT_MEASURED = "separately from the table"
# The method's B/2B tolerance; a contract allowing more is exploratory.
METHOD_TOLERANCE = 0.03
HISTORICAL_SCHEMA = "moe-components-v1"
COLUMNS = ("component", "mode", "tokens", "activated_experts", "local_assignments", "time_us")
EXPERTS = "experts"
# Components timed on a rank's own rows; they carry A = M = -1 in the table.
# ``dispatch_quant`` (modular DP+EP with FP8 activations): the native prepare's quantization of
# a rank's own rows before the all-gather. Appended last so that no existing order changes.
LOCAL_COMPONENTS = ("gate_routing", "finalize_copy", "wrapper", "dispatch_quant")
COMPONENTS = (*LOCAL_COMPONENTS[:1], EXPERTS, *LOCAL_COMPONENTS[1:])
# The components of conservation evidence files (format 2): their columns are fixed, so a
# component added later never changes the header of files already published.
CONSERVED_COMPONENTS = ("gate_routing", EXPERTS, "finalize_copy", "wrapper")
MODES = ("eager", "graph")

Layout = Literal["current", "historical"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class QualityFile:
    """A quality evidence file an entry names (format 2): bundle-relative path and digest."""

    path: str
    sha256: str


@dataclass(frozen=True, slots=True)
class QualityRefs:
    """What an entry's ``quality`` mapping names (format 2), read by `moetables.bundle.quality`."""

    stability: QualityFile
    conservation: QualityFile | None
    conservation_absent: str | None
    # ``conservation.supplementary: true``: the traced forwards were measured later, in a
    # separate run, for a table published without them; the contract's
    # ``supplementary_conservation`` says when, how and on what (SUPPLEMENT_FIELDS).
    conservation_supplementary: bool = False


@dataclass(frozen=True, slots=True)
class TileModel:
    """A table's fitted row-tile model (format 3): each row tile the expert kernel runs beyond
    the table's balanced tiles costs ``tile_cost_us``, where vLLM's block is ``block_m`` rows
    (moetables.tiles, for ``vllm_version``). ``evidence`` names the measurement it is fitted on."""

    schema: str
    vllm_version: str
    block_m: int
    tile_cost_us: float
    evidence: QualityFile | None


@dataclass(frozen=True, slots=True)
class WaveModel:
    """A per-block wave model (format 5, issue 18): where vLLM's block is exactly ``block_m``
    rows, each weighted wave of the expert kernel's grid (``programs_per_sm`` resident programs
    on each of ``sms`` SMs; `moetables.waves`) beyond the table's balanced waves costs
    ``wave_cost_us``. ``evidence`` names the measurement it is fitted on."""

    schema: str
    vllm_version: str
    block_m: int
    wave_cost_us: float
    programs_per_sm: int
    sms: int
    evidence: QualityFile | None


@dataclass(frozen=True, slots=True)
class ExpertLoads:
    """What an entry says of its expert rows' per-expert loads (format 3; older: balanced)."""

    rows: str = "balanced"
    tile_model: TileModel | None = None
    # Format 4 (``tile_models``): one model per vLLM block size, each charged where vLLM's block
    # is exactly its ``block_m``; never together with ``tile_model``.
    tile_models: tuple[TileModel | WaveModel, ...] = ()

    def block_cost_us(self, block_m: int) -> float | None:
        """The recorded cost of an extra row tile where vLLM's block is ``block_m`` rows, or
        None where nothing is recorded for that block (the tile charge then adds nothing).
        A format-3 model covers every block of at least its ``block_m`` rows; a format-4 one
        exactly its own."""
        model = self.block_model(block_m)
        return model.tile_cost_us if isinstance(model, TileModel) else None

    def block_model(self, block_m: int) -> TileModel | WaveModel | None:
        """The model charged where vLLM's block is ``block_m`` rows (format 3's one model for
        every block of at least its ``block_m``; format 4/5's own), or None."""
        if self.tile_model is not None:
            return self.tile_model if block_m >= self.tile_model.block_m else None
        return next((m for m in self.tile_models if m.block_m == block_m), None)

    @property
    def tile_only(self) -> tuple[TileModel, ...]:
        """The models that cost per tile, largest block first (no wave model)."""
        return tuple(m for m in self.models if isinstance(m, TileModel))

    @property
    def models(self) -> tuple[TileModel | WaveModel, ...]:
        """Every recorded model (format 3's one or format 4's per block), largest block first."""
        found = (self.tile_model,) if self.tile_model is not None else self.tile_models
        return tuple(sorted(found, key=lambda m: -m.block_m))


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One deployment rank's table as the bundle's metadata declares it.

    ``table_path`` is relative to the bundle root, POSIX style, already checked to stay inside.
    """

    layout: Layout
    target: MoeTarget
    table_path: str
    contract: dict[str, Any]
    coverage: dict[str, Any]
    table_sha256: str
    components: tuple[str, ...]
    modes: tuple[str, ...]
    geometry: ExpertGeometry
    contract_id: str | None = None
    format_version: int = 1
    quality: QualityRefs | None = None
    expert_loads: ExpertLoads = field(default_factory=ExpertLoads)

    @property
    def tolerance(self) -> float:
        conditioning = self.contract.get("expert_conditioning")
        raw = (
            conditioning.get("quality_relative_tolerance")
            if isinstance(conditioning, dict)
            else None
        )
        return float(raw) if isinstance(raw, int | float) else METHOD_TOLERANCE

    @property
    def exploratory(self) -> bool:
        """Measured with a looser B/2B tolerance than the method's 3 %: not for name lookups."""
        return self.contract.get("quality") == "exploratory" or self.tolerance > METHOD_TOLERANCE

    @property
    def where(self) -> str:
        """How error messages name this entry."""
        return f"{self.table_path} [{self.target.deployment} tp{self.target.tp}]"


@dataclass(frozen=True, slots=True)
class ComponentTable:
    """The rows of one components.csv, column-wise, in file order."""

    component: npt.NDArray[np.str_]
    mode: npt.NDArray[np.str_]
    tokens: IntArray
    activated_experts: IntArray
    local_assignments: IntArray
    time_us: FloatArray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, component: str, mode: str) -> npt.NDArray[np.bool_]:
        chosen: npt.NDArray[np.bool_] = (self.component == component) & (self.mode == mode)
        return chosen

    def rows(self) -> list[tuple[str, str, int, int, int, float]]:
        """(component, mode, N, A, M, time_us) per row in file order, as Python scalars (the
        writer's ``Row``): what tools that rewrite or compare tables work with."""
        return [
            (str(c), str(m), int(n), int(a), int(p), float(t))
            for c, m, n, a, p, t in zip(
                self.component,
                self.mode,
                self.tokens,
                self.activated_experts,
                self.local_assignments,
                self.time_us,
                strict=True,
            )
        ]


@dataclass(slots=True)
class Bundle:
    """An opened bundle: its root metadata and the entries it declares.

    ``missing_files`` lists files the root metadata names (other profile categories, for
    instance) that are absent: reported, never invented.
    """

    root: Path
    layout: Layout
    meta: dict[str, Any]
    entries: tuple[TableEntry, ...]
    missing_files: tuple[str, ...] = field(default=())

    @property
    def hardware(self) -> str | None:
        value = self.meta.get("hardware")
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        value = self.meta.get("model")
        return value if isinstance(value, str) else None

    @property
    def variant(self) -> str | None:
        value = self.meta.get("variant")
        return value if isinstance(value, str) else None

    def entry_for(self, target: MoeTarget) -> TableEntry | None:
        for entry in self.entries:
            if entry.target.key == target.key:
                return entry
        return None
