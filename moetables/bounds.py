"""Physical lower bounds on an expert row's time, from its contract (issue 20, item 5).

An expert row at (N, A, M) reads the weights of its A active local experts at least once and
multiplies M token rows through each gated MLP. Neither can go faster than the GPU's peak:

- memory bound: A x (bytes of one expert's gate/up and down projections, plus their weight
  scales where the contract records block-quantized weights) / peak bandwidth;
- compute bound: 2 x M x (weight elements of one expert) / dense tensor-core peak of the
  weights' dtype (the FP8 rate for float8 weights), which for a gated MLP of hidden H and
  width I is 2 x M x H x 3I.

A measured row below either is a measurement error (weights served from cache, a router that did
not route as planned), never a fast kernel. The geometry and dtypes come from the contract of
either layout; what the historical layout does not record is assumed and said so (``notes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.bundle.model import EXPERTS, Bundle, ComponentTable, TableEntry
from moetables.errors import BundleError
from moetables.hardware import HardwareSpec, hardware_spec

__all__ = [
    "BoundViolation",
    "ExpertBounds",
    "ExpertWeights",
    "entry_bounds",
    "expert_weights",
    "table_violations",
    "tightest",
]

# Bytes per element of the weight dtypes contracts name.
_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
}

FloatArray = npt.NDArray[np.float64]


def _dtype(raw: Any, *, where: str) -> str:
    if not isinstance(raw, str):
        raise BundleError(where, f"must name a dtype, got {raw!r}")
    name = raw.removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise BundleError(where, f"unknown weight dtype {raw!r}; known: {sorted(_DTYPE_BYTES)}")
    return name


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive_int(raw: Any, *, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise BundleError(where, f"must be a positive integer, got {raw!r}")
    return raw


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One local expert's weights as the contract describes them.

    ``elements`` counts the gate/up (w13) and down (w2) projection weights of one expert at its
    physical width; ``notes`` says what was read and what had to be assumed.
    """

    hidden: int
    intermediate: int
    dtype: str
    elements: int
    local_experts: int
    notes: tuple[str, ...]
    # Block-quantized weights (FP8): bytes of one expert's weight scales, read with its weights.
    scale_bytes: int = 0

    @property
    def bytes_per_expert(self) -> int:
        return self.elements * _DTYPE_BYTES[self.dtype] + self.scale_bytes


@dataclass(frozen=True, slots=True)
class ExpertBounds:
    """The two lower bounds of one table's expert rows on one GPU."""

    weights: ExpertWeights
    hardware: HardwareSpec

    def memory_us(self, active: npt.ArrayLike) -> FloatArray:
        """Reading A experts' weights once at peak bandwidth, microseconds."""
        a = np.asarray(active, dtype=np.float64)
        out: FloatArray = (
            a * self.weights.bytes_per_expert / self.hardware.memory_bandwidth_bytes_per_s * 1e6
        )
        return out

    def compute_us(self, pairs: npt.ArrayLike) -> FloatArray:
        """M token rows through one expert's weights at the dense tensor-core peak."""
        m = np.asarray(pairs, dtype=np.float64)
        rate = self.hardware.dense_flops(self.weights.dtype)
        out: FloatArray = 2.0 * m * self.weights.elements / rate * 1e6
        return out


@dataclass(frozen=True, slots=True)
class BoundViolation:
    """An expert row measured faster than physics allows."""

    table: str
    mode: str
    tokens: int
    active: int
    pairs: int
    time_us: float
    memory_us: float
    compute_us: float

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        return (self.table, self.mode, self.tokens, self.active, self.pairs)

    def __str__(self) -> str:
        return (
            f"{self.table} {self.mode} experts N={self.tokens} A={self.active} M={self.pairs}: "
            f"{self.time_us:.2f} us is below the memory bound {self.memory_us:.2f} us "
            f"or the compute bound {self.compute_us:.2f} us"
        )


def _layout_elements(layout: Any, local: int, *, where: str) -> tuple[int, int, int] | None:
    """(elements per expert, hidden, width) from recorded w13/w2 shapes, or None if absent."""
    if not isinstance(layout, dict):
        return None
    w13, w2 = layout.get("w13"), layout.get("w2")
    if not (isinstance(w13, dict) and isinstance(w2, dict)):
        return None
    raw13: Any = w13.get("shape")
    raw2: Any = w2.get("shape")
    ok = (
        isinstance(raw13, list)
        and isinstance(raw2, list)
        and len(raw13) == 3
        and len(raw2) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw13 + raw2)
    )
    if not ok:
        raise BundleError(f"{where}.expert_layout", f"w13/w2 shapes are malformed: {raw13}, {raw2}")
    s13 = [int(v) for v in raw13]
    s2 = [int(v) for v in raw2]
    # vLLM's layout: w13 [L, 2I, H] (gate and up stacked), w2 [L, H, I].
    if s13[0] != local or s2[0] != local:
        raise BundleError(
            f"{where}.expert_layout", f"holds {s13[0]} and {s2[0]} experts, the rank owns {local}"
        )
    hidden, width = s13[2], s2[2]
    if s2[1] != hidden or s13[1] != 2 * width:
        raise BundleError(
            f"{where}.expert_layout",
            f"w13 {s13} and w2 {s2} are not a gated MLP's [L, 2I, H] and [L, H, I]",
        )
    return s13[1] * s13[2] + s2[1] * s2[2], hidden, width


def _check_recorded_bytes(recorded: Any, weights: ExpertWeights, *, where: str) -> tuple[str, ...]:
    name = "contract.expert_weight_bytes"
    """The contract's own byte count must not be smaller than the weights it describes."""
    if recorded is None:
        return ()
    total = _positive_int(recorded, where=where)
    computed = weights.local_experts * weights.bytes_per_expert
    if total < computed:
        raise BundleError(
            where,
            f"records {total} bytes, fewer than the {computed} bytes of {weights.local_experts} "
            f"experts of {weights.elements} {weights.dtype} weights",
        )
    if total == computed:
        return (f"{name} = {total} bytes agrees with the geometry and dtype",)
    return (
        f"{name} = {total} bytes exceeds the {computed} bytes of weights and recorded scales "
        "(padding or unrecorded state); the bound counts the weights and recorded scales",
    )


def _current_weights(entry: TableEntry) -> ExpertWeights:
    c = entry.contract
    where = f"{entry.where} contract"
    local = entry.geometry.local_experts
    geometry = c.get("geometry")
    if not isinstance(geometry, dict):
        raise BundleError(f"{where}.geometry", "is required to bound the expert rows")
    hidden = _positive_int(geometry.get("expert_hidden_size"), where=f"{where}.geometry")
    width = _positive_int(geometry.get("expert_intermediate_size"), where=f"{where}.geometry")
    backend = _mapping(c.get("backend"))
    dtypes = _mapping(backend.get("dtypes"))
    notes: list[str] = []
    if "expert_weights" in dtypes:
        dtype = _dtype(dtypes["expert_weights"], where=f"{where}.backend.dtypes.expert_weights")
        notes.append(f"weights {dtype} (backend.dtypes.expert_weights)")
    else:
        dtype = _dtype(geometry.get("dtype"), where=f"{where}.geometry.dtype")
        notes.append(f"weights {dtype} (geometry.dtype; the backend records no weight dtype)")
    elements = 3 * hidden * width
    layout = _layout_elements(backend.get("expert_layout"), local, where=f"{where}.backend")
    if layout is not None:
        if layout[1:] != (hidden, width):
            raise BundleError(
                f"{where}.backend.expert_layout",
                f"physical H={layout[1]}, I={layout[2]} differ from geometry H={hidden}, I={width}",
            )
        elements = layout[0]
        notes.append(f"gated MLP from backend.expert_layout: w13 [2I={2 * width}, H={hidden}]")
    else:
        notes.append(f"gated MLP assumed (H={hidden}, I={width}): no physical layout recorded")
    scale_bytes = _scale_bytes(backend, local, where=f"{where}.backend")
    if scale_bytes:
        notes.append(
            f"{scale_bytes} bytes of weight scales per expert (backend.expert_layout "
            "w13_scale/w2_scale, backend.dtypes.weight_scales)"
        )
    weights = ExpertWeights(hidden, width, dtype, elements, local, tuple(notes), scale_bytes)
    extra = _check_recorded_bytes(
        c.get("expert_weight_bytes"), weights, where=f"{where}.expert_weight_bytes"
    )
    return ExpertWeights(hidden, width, dtype, elements, local, (*notes, *extra), scale_bytes)


def _scale_bytes(backend: dict[str, Any], local: int, *, where: str) -> int:
    """Per-expert bytes of the weight scales a block-quantized layout records (0 if none)."""
    layout = _mapping(backend.get("expert_layout"))
    shapes = [_mapping(layout.get(name)).get("shape") for name in ("w13_scale", "w2_scale")]
    if all(shape is None for shape in shapes):
        return 0
    dtype = _dtype(_mapping(backend.get("dtypes")).get("weight_scales"), where=f"{where}.dtypes")
    total = 0
    for shape in shapes:
        ok = (
            isinstance(shape, list)
            and len(shape) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
        )
        if not ok or shape[0] != local:  # type: ignore[index]
            raise BundleError(
                f"{where}.expert_layout", f"weight scale shapes are malformed: {shapes}"
            )
        total += int(shape[1]) * int(shape[2])  # type: ignore[index]
    return total * _DTYPE_BYTES[dtype]


def _historical_weights(entry: TableEntry) -> ExpertWeights:
    c = entry.contract
    where = f"{entry.where} contract"
    local = entry.geometry.local_experts
    region = _mapping(c.get("expert_region"))
    hidden = _positive_int(
        c.get("hidden_dim", region.get("hidden_dim")), where=f"{where}.hidden_dim"
    )
    width = _positive_int(
        c.get("intermediate_size", region.get("intermediate_size")),
        where=f"{where}.intermediate_size",
    )
    dtype = _dtype(
        region.get("weight_dtype", c.get("input_dtype")),
        where=f"{where}.expert_region.weight_dtype",
    )
    notes = [
        f"weights {dtype} (expert_region.weight_dtype), H={hidden}, I={width} (hidden_dim, "
        "intermediate_size)",
        "gated MLP assumed (w13 [2I, H], w2 [H, I]): the historical layout records no weight "
        f"shapes; its activation is {c.get('activation')!r}, which vLLM's TritonExperts runs as "
        "SiLU-and-mul",
    ]
    weights = ExpertWeights(hidden, width, dtype, 3 * hidden * width, local, tuple(notes))
    extra = _check_recorded_bytes(
        c.get("expert_weight_bytes"), weights, where=f"{where}.expert_weight_bytes"
    )
    return ExpertWeights(hidden, width, dtype, weights.elements, local, (*notes, *extra))


def expert_weights(entry: TableEntry) -> ExpertWeights:
    """One local expert's weights, read from either layout's contract."""
    if entry.layout == "historical":
        return _historical_weights(entry)
    return _current_weights(entry)


def _recorded_device(entry: TableEntry) -> str | None:
    c = entry.contract
    gpu = c.get("gpu")
    if isinstance(gpu, dict) and isinstance(gpu.get("name"), str):
        return str(gpu["name"])
    provenance = c.get("provenance")
    if isinstance(provenance, dict) and isinstance(provenance.get("device_name"), str):
        return str(provenance["device_name"])
    return None


def entry_bounds(bundle: Bundle, entry: TableEntry) -> ExpertBounds:
    """The bounds of one entry: the contract's weights on the bundle's hardware.

    The contract's own hardware label and device name, where recorded, must agree with the
    bundle's; an unknown GPU is a ``KeyError`` (no figures, no bounds).
    """
    label = bundle.hardware
    own = entry.contract.get("hardware")
    if isinstance(own, str) and own != label:
        raise BundleError(
            f"{entry.where} contract.hardware", f"is {own!r}, the bundle says {label!r}"
        )
    return ExpertBounds(expert_weights(entry), hardware_spec(label, _recorded_device(entry)))


def table_violations(
    bounds: ExpertBounds, entry: TableEntry, table: ComponentTable
) -> list[BoundViolation]:
    """Every expert row (any mode) below its memory or compute bound."""
    rows = table.component == EXPERTS
    memory = bounds.memory_us(table.activated_experts)
    compute = bounds.compute_us(table.local_assignments)
    below = rows & ((table.time_us < memory) | (table.time_us < compute))
    found: list[BoundViolation] = []
    for i in np.flatnonzero(below):
        found.append(
            BoundViolation(
                table=entry.table_path,
                mode=str(table.mode[i]),
                tokens=int(table.tokens[i]),
                active=int(table.activated_experts[i]),
                pairs=int(table.local_assignments[i]),
                time_us=float(table.time_us[i]),
                memory_us=float(memory[i]),
                compute_us=float(compute[i]),
            )
        )
    return found


def tightest(bounds: ExpertBounds, active: int, pairs: int, time_us: float) -> float:
    """The larger bound over the measured time: 1.0 means the row runs at the GPU's peak."""
    bound = max(float(bounds.memory_us(active)), float(bounds.compute_us(pairs)))
    return bound / time_us if time_us > 0 and math.isfinite(time_us) else math.inf
