"""What a table says of its expert rows' per-expert loads (format 3, issue 18).

Every expert row of every table so far was measured under the acquisition stimulus' balanced
histogram (M/A pairs per active expert). Format 3 says so per entry and may add the table's
fitted row-tile model, with the measurement it is fitted on beside the table:

    expert_loads:
      rows: balanced
      tile_model:
        schema: row-tiles-v1
        vllm_version: 0.26.0
        block_m: 128
        tile_cost_us: 1.612
        evidence: {file: moe_components/<deployment>/load_spread.csv, sha256: ...}

``load_spread.csv`` holds one row per timed load: the point (N, A, M), the distribution and
draw, vLLM's block size and the row tiles the kernel ran, the counts' summary, and the B and 2B
arms' medians. The reader re-fits ``tile_cost_us`` from it (`moetables.tiles.fit_tile_cost`)
and refuses a bundle whose recorded cost is not the fit of its own evidence.

Bundles of format 1 and 2 and the historical layout read as ``rows: balanced`` without a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetables.bundle.model import (
    BLOCK_TILE_MODEL_SCHEMA,
    EXPERT_LOAD_ROWS,
    LOADS_FORMAT_VERSION,
    TILE_MODEL_SCHEMAS,
    WAVE_MODEL_SCHEMA,
    WAVE_MODELS_FORMAT_VERSION,
    ExpertLoads,
    TableEntry,
    TileModel,
    WaveModel,
)
from moetables.bundle.quality import (
    csv_rows,
    float_cell,
    int_cell,
    quality_file_ref,
    read_checked_text,
)
from moetables.errors import BundleError

__all__ = [
    "LOAD_SPREAD_COLUMNS",
    "LOAD_SPREAD_FILE",
    "LoadSpreadRow",
    "fit_wave_model",
    "format_load_spread",
    "load_spread_evidence",
    "parse_expert_loads",
    "read_load_spread",
    "tile_model_record",
    "tile_models_record",
    "wave_grid",
]

LOAD_SPREAD_FILE = "load_spread.csv"
LOAD_SPREAD_COLUMNS = (
    "tokens",
    "activated_experts",
    "local_assignments",
    "distribution",
    "seed",
    "block_m",
    "tiles",
    "max_count",
    "cv",
    "b_us",
    "b2_us",
)
# A record's two arms (ITERS and 2 x ITERS calls) must agree this closely to be fitted on.
STABLE = 0.03
# The recorded cost is the fit rounded to the nanosecond.
COST_DIGITS = 3


@dataclass(frozen=True, slots=True)
class LoadSpreadRow:
    """One timed load of the expert kernel at a table point: what ran and how long."""

    tokens: int
    activated_experts: int
    local_assignments: int
    distribution: str
    seed: int
    block_m: int
    tiles: int
    max_count: int
    cv: float
    b_us: float
    b2_us: float

    @property
    def stable(self) -> bool:
        return abs(self.b2_us / self.b_us - 1.0) <= STABLE


def format_load_spread(rows: Iterable[LoadSpreadRow]) -> bytes:
    """CSV bytes, ordered by point, distribution and draw, LF line endings."""
    out = [",".join(LOAD_SPREAD_COLUMNS)]
    for r in sorted(
        rows,
        key=lambda r: (r.tokens, r.activated_experts, r.local_assignments, r.distribution, r.seed),
    ):
        if "," in r.distribution or not r.distribution:
            raise ValueError(f"a distribution name cannot hold a comma: {r.distribution!r}")
        for value in (r.b_us, r.b2_us):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"times must be finite and positive, got {value!r}")
        out.append(
            ",".join(
                [
                    str(int(r.tokens)),
                    str(int(r.activated_experts)),
                    str(int(r.local_assignments)),
                    r.distribution,
                    str(int(r.seed)),
                    str(int(r.block_m)),
                    str(int(r.tiles)),
                    str(int(r.max_count)),
                    repr(float(r.cv)),
                    repr(float(r.b_us)),
                    repr(float(r.b2_us)),
                ]
            )
        )
    return ("\n".join(out) + "\n").encode()


def read_load_spread(text: str, where: str) -> list[LoadSpreadRow]:
    rows = []
    for number, cells in csv_rows(text, LOAD_SPREAD_COLUMNS, where):
        at = f"{where}:{number}"
        row = LoadSpreadRow(
            tokens=int_cell(cells, "tokens", at),
            activated_experts=int_cell(cells, "activated_experts", at),
            local_assignments=int_cell(cells, "local_assignments", at),
            distribution=cells["distribution"],
            seed=int_cell(cells, "seed", at),
            block_m=int_cell(cells, "block_m", at),
            tiles=int_cell(cells, "tiles", at),
            max_count=int_cell(cells, "max_count", at),
            cv=float_cell(cells, "cv", at),
            b_us=float_cell(cells, "b_us", at, positive=True),
            b2_us=float_cell(cells, "b2_us", at, positive=True),
        )
        if min(row.tokens, row.activated_experts, row.block_m, row.tiles) < 1 or (
            row.local_assignments < row.activated_experts
        ):
            raise BundleError(at, "holds an impossible point, block size or tile count")
        rows.append(row)
    if not rows:
        raise BundleError(where, "holds no records")
    return rows


def parse_expert_loads(root: Path, tp: int, raw: Any, *, version: int, where: str) -> ExpertLoads:
    """An entry's ``expert_loads`` (format 3; absent: balanced rows, no model). Format 4 may
    give ``tile_models`` (one per vLLM block size) in place of ``tile_model``."""
    if raw is None:
        return ExpertLoads()
    if version < LOADS_FORMAT_VERSION:
        raise BundleError(where, "expert_loads needs format_version 3")
    if not isinstance(raw, dict):
        raise BundleError(where, "must be a mapping with rows and optionally tile_model")
    known = {"rows", "tile_model"} | ({"tile_models"} if version >= 4 else set())
    unknown = set(raw) - known
    if unknown:
        raise BundleError(
            where,
            f"unknown keys {sorted(unknown)}; it takes {', '.join(sorted(known))}"
            + ("" if version >= 4 else " (tile_models needs format_version 4)"),
        )
    rows = raw.get("rows")
    if rows not in EXPERT_LOAD_ROWS:
        raise BundleError(
            f"{where}.rows",
            f"must be one of {list(EXPERT_LOAD_ROWS)}, got {rows!r}: rows measured under another "
            "load are never read as balanced ones",
        )
    model = raw.get("tile_model")
    models = raw.get("tile_models")
    if model is not None and models is not None:
        raise BundleError(
            where, "gives both tile_model and tile_models: one charge per table, not two"
        )
    if models is not None:
        mwhere = f"{where}.tile_models"
        if not isinstance(models, list) or not models:
            raise BundleError(mwhere, "must be a non-empty list of per-block models")
        parsed = tuple(
            _parse_wave_model(root, tp, m, version, f"{mwhere}[{i}]")
            if isinstance(m, dict) and m.get("schema") == WAVE_MODEL_SCHEMA
            else _parse_model(root, tp, m, BLOCK_TILE_MODEL_SCHEMA, f"{mwhere}[{i}]")
            for i, m in enumerate(models)
        )
        blocks = [m.block_m for m in parsed]
        if len(set(blocks)) != len(blocks):
            raise BundleError(mwhere, f"names a block size twice: {blocks}; one cost per block")
        return ExpertLoads(rows=str(rows), tile_models=parsed)
    if model is None:
        return ExpertLoads(rows=str(rows))
    return ExpertLoads(
        rows=str(rows),
        tile_model=_parse_model(root, tp, model, TILE_MODEL_SCHEMAS[0], f"{where}.tile_model"),
    )


def _parse_model(root: Path, tp: int, model: Any, schema_wanted: str, mwhere: str) -> TileModel:
    """One tile model mapping: its schema must be ``schema_wanted`` (format 3's ``tile_model``
    is row-tiles-v1, format 4's ``tile_models`` items row-tiles-per-block-v1: R30, the two
    charge different blocks and are never read as each other)."""
    if not isinstance(model, dict):
        raise BundleError(mwhere, "must be a mapping")
    schema = model.get("schema")
    if schema != schema_wanted:
        known = sorted({*TILE_MODEL_SCHEMAS, BLOCK_TILE_MODEL_SCHEMA, WAVE_MODEL_SCHEMA})
        raise BundleError(
            f"{mwhere}.schema",
            f"unknown tile model {schema!r} here; it must be {schema_wanted!r} (this reader "
            f"knows {known})",
        )
    version_text = model.get("vllm_version")
    if not isinstance(version_text, str) or not version_text:
        raise BundleError(
            f"{mwhere}.vllm_version", "must name the vLLM version whose tiles it counts"
        )
    from moetables.tiles import VLLM_VERSION

    if version_text != VLLM_VERSION:
        raise BundleError(
            f"{mwhere}.vllm_version",
            f"is {version_text}; moetables.tiles counts vLLM {VLLM_VERSION}'s tiles",
        )
    block = model.get("block_m")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise BundleError(f"{mwhere}.block_m", f"must be an integer >= 1, got {block!r}")
    cost = model.get("tile_cost_us")
    if (
        isinstance(cost, bool)
        or not isinstance(cost, (int, float))
        or not (math.isfinite(cost) and cost >= 0)
    ):
        raise BundleError(f"{mwhere}.tile_cost_us", f"must be a finite number >= 0, got {cost!r}")
    evidence = (
        quality_file_ref(root, tp, model["evidence"], where=f"{mwhere}.evidence")
        if model.get("evidence") is not None
        else None
    )
    if evidence is None:
        raise BundleError(
            f"{mwhere}.evidence", "is required: a fitted cost names what it is fitted on"
        )
    return TileModel(str(schema), version_text, int(block), float(cost), evidence)


WAVE_MODEL_KEYS = frozenset(
    {"schema", "vllm_version", "block_m", "wave_cost_us", "programs_per_sm", "sms", "evidence"}
)


def _parse_wave_model(
    root: Path, tp: int, model: dict[str, Any], version: int, mwhere: str
) -> WaveModel:
    """A format-5 ``tile_models`` item of `WAVE_MODEL_SCHEMA`: a cost per weighted wave of the
    kernel's grid (`moetables.waves`) where vLLM's block is exactly ``block_m`` rows."""
    if version < WAVE_MODELS_FORMAT_VERSION:
        raise BundleError(
            f"{mwhere}.schema",
            f"{WAVE_MODEL_SCHEMA} needs format_version {WAVE_MODELS_FORMAT_VERSION}",
        )
    unknown = set(model) - WAVE_MODEL_KEYS
    if unknown:
        raise BundleError(
            mwhere, f"unknown keys {sorted(unknown)}; it takes {sorted(WAVE_MODEL_KEYS)}"
        )
    cost = model.get("wave_cost_us")
    if (
        isinstance(cost, bool)
        or not isinstance(cost, (int, float))
        or not (math.isfinite(cost) and cost >= 0)
    ):
        raise BundleError(f"{mwhere}.wave_cost_us", f"must be a finite number >= 0, got {cost!r}")
    # The shared fields (vLLM version, block, evidence) are read as a tile model's are.
    tile = _parse_model(
        root,
        tp,
        {**model, "schema": WAVE_MODEL_SCHEMA, "tile_cost_us": model.get("wave_cost_us")},
        WAVE_MODEL_SCHEMA,
        mwhere,
    )
    for key in ("programs_per_sm", "sms"):
        value = model.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BundleError(f"{mwhere}.{key}", f"must be an integer >= 1, got {value!r}")
    return WaveModel(
        WAVE_MODEL_SCHEMA,
        tile.vllm_version,
        tile.block_m,
        tile.tile_cost_us,
        int(model["programs_per_sm"]),
        int(model["sms"]),
        tile.evidence,
    )


def load_spread_evidence(root: Path, entry: TableEntry) -> tuple[LoadSpreadRow, ...] | None:
    """The entry's tile-model evidence, checksummed, and each model's fit checked against its
    recorded cost (a per-block model on the records of exactly its block); None when the entry
    has no model."""
    models = entry.expert_loads.models
    if not models:
        return None
    from moetables.tiles import TileError, fit_tile_cost

    files: dict[Any, list[LoadSpreadRow]] = {}  # per evidence reference (path and checksum)
    for model in models:
        ref = model.evidence
        if ref is None:
            continue
        rows = files.get(ref) or read_load_spread(read_checked_text(root, ref), ref.path)
        files[ref] = rows
        if isinstance(model, WaveModel):
            _check_wave_fit(entry, model, rows, ref.path)
            continue
        exact = model.schema == BLOCK_TILE_MODEL_SCHEMA
        try:
            fit = fit_tile_cost(rows, block_m=model.block_m, exact=exact)
        except TileError as exc:
            raise BundleError(ref.path, f"fits no tile cost: {exc}") from None
        if round(fit.tile_cost_us, COST_DIGITS) != model.tile_cost_us:
            field = "tile_model" if not exact else f"tile_models[block_m={model.block_m}]"
            raise BundleError(
                f"{entry.where}:expert_loads.{field}.tile_cost_us",
                f"is {model.tile_cost_us}, but its evidence {ref.path} fits "
                f"{round(fit.tile_cost_us, COST_DIGITS)}",
            )
    return tuple(r for rows in files.values() for r in rows)


def wave_grid(contract: Mapping[str, Any], programs_per_sm: int, sms: int, where: str) -> Any:
    """The `moetables.waves.WaveGrid` of a wave model on a table: the model's SMs and residency,
    the contract's expert hidden (``expert_hidden_size``, else ``hidden_size``) and intermediate
    sizes."""
    from moetables.tiles import TileError, contract_expert_width
    from moetables.waves import WaveGrid

    geometry = contract.get("geometry")
    geometry = geometry if isinstance(geometry, Mapping) else {}
    hidden = geometry.get("expert_hidden_size", geometry.get("hidden_size"))
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise BundleError(where, "a wave model needs the contract's geometry.expert_hidden_size")
    try:
        width = contract_expert_width(contract, where)
    except TileError as exc:
        raise BundleError(where, str(exc)) from None
    return WaveGrid(sms, programs_per_sm, hidden, width)


def fit_wave_model(
    contract: Mapping[str, Any],
    local_experts: int,
    rows: Sequence[LoadSpreadRow],
    *,
    block_m: int,
    programs_per_sm: int,
    sms: int,
    where: str,
) -> float:
    """The wave cost (us per weighted wave) fitted on ``rows`` of exactly ``block_m``-row blocks
    of a table with this contract, rounded as recorded (`moetables.waves.fit_wave_cost`)."""
    from moetables.tiles import TileError, contract_kernel_shape
    from moetables.waves import fit_wave_cost

    try:
        shape = contract_kernel_shape(contract, local_experts, where)
        block_n = {r.tokens: shape.config(r.tokens).block_n for r in rows}
        fit = fit_wave_cost(
            rows,
            block_m=block_m,
            grid=wave_grid(contract, programs_per_sm, sms, where),
            block_n_at=block_n,
        )
    except TileError as exc:
        raise BundleError(where, f"fits no wave cost: {exc}") from None
    return round(fit.wave_cost_us, COST_DIGITS)


def _check_wave_fit(
    entry: TableEntry, model: WaveModel, rows: list[LoadSpreadRow], path: str
) -> None:
    """Refit a wave model's cost on its evidence and refuse one that is not that fit."""
    fit = fit_wave_model(
        entry.contract,
        entry.geometry.local_experts,
        rows,
        block_m=model.block_m,
        programs_per_sm=model.programs_per_sm,
        sms=model.sms,
        where=path,
    )
    if fit != model.wave_cost_us:
        raise BundleError(
            f"{entry.where}:expert_loads.tile_models[block_m={model.block_m}].wave_cost_us",
            f"is {model.wave_cost_us}, but its evidence {path} fits {fit}",
        )


def tile_model_record(
    rows: Iterable[LoadSpreadRow], *, block_m: int, evidence: dict[str, str]
) -> dict[str, Any]:
    """The ``expert_loads`` mapping of an entry whose tile cost is fitted on ``rows``."""
    from moetables.tiles import VLLM_VERSION, fit_tile_cost

    fit = fit_tile_cost(list(rows), block_m=block_m)
    return {
        "rows": "balanced",
        "tile_model": {
            "schema": TILE_MODEL_SCHEMAS[0],
            "vllm_version": VLLM_VERSION,
            "block_m": block_m,
            "tile_cost_us": round(fit.tile_cost_us, COST_DIGITS),
            "evidence": dict(evidence),
        },
    }


def tile_models_record(
    rows: Iterable[LoadSpreadRow],
    *,
    blocks: Iterable[int],
    evidence: dict[str, str],
    waves: Mapping[int, tuple[int, int]] | None = None,
    contract: Mapping[str, Any] | None = None,
    local_experts: int | None = None,
) -> dict[str, Any]:
    """The ``expert_loads`` mapping (format 4) of an entry with one cost per vLLM block size in
    ``blocks``, each fitted on ``rows`` of exactly that block (all rows in one evidence file).
    ``waves``: {block_m: (programs_per_sm, sms)} for the blocks charged per wave instead
    (format 5; fitted with the table's ``contract`` and ``local_experts``)."""
    from moetables.tiles import VLLM_VERSION, fit_tile_cost

    rows = list(rows)
    models: list[dict[str, Any]] = []
    for block in sorted(set(blocks) | set(waves or {}), reverse=True):
        if waves and block in waves:
            if contract is None or local_experts is None:
                raise ValueError("a wave model is fitted with the table's contract")
            r, sms = waves[block]
            cost = fit_wave_model(
                contract,
                local_experts,
                rows,
                block_m=block,
                programs_per_sm=r,
                sms=sms,
                where=evidence.get("file", "load_spread.csv"),
            )
            models.append(
                {
                    "schema": WAVE_MODEL_SCHEMA,
                    "vllm_version": VLLM_VERSION,
                    "block_m": block,
                    "wave_cost_us": cost,
                    "programs_per_sm": r,
                    "sms": sms,
                    "evidence": dict(evidence),
                }
            )
            continue
        fit = fit_tile_cost(rows, block_m=block, exact=True)
        models.append(
            {
                "schema": BLOCK_TILE_MODEL_SCHEMA,
                "vllm_version": VLLM_VERSION,
                "block_m": block,
                "tile_cost_us": round(fit.tile_cost_us, COST_DIGITS),
                "evidence": dict(evidence),
            }
        )
    return {"rows": "balanced", "tile_models": models}
