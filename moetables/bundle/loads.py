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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetables.bundle.model import (
    EXPERT_LOAD_ROWS,
    TILE_MODEL_SCHEMAS,
    ExpertLoads,
    TableEntry,
    TileModel,
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
    "format_load_spread",
    "load_spread_evidence",
    "parse_expert_loads",
    "read_load_spread",
    "tile_model_record",
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
    """An entry's ``expert_loads`` (format 3; absent: balanced rows, no model)."""
    if raw is None:
        return ExpertLoads()
    if version < 3:
        raise BundleError(where, "expert_loads needs format_version 3")
    if not isinstance(raw, dict):
        raise BundleError(where, "must be a mapping with rows and optionally tile_model")
    unknown = set(raw) - {"rows", "tile_model"}
    if unknown:
        raise BundleError(where, f"unknown keys {sorted(unknown)}; it takes rows, tile_model")
    rows = raw.get("rows")
    if rows not in EXPERT_LOAD_ROWS:
        raise BundleError(
            f"{where}.rows",
            f"must be one of {list(EXPERT_LOAD_ROWS)}, got {rows!r}: rows measured under another "
            "load are never read as balanced ones",
        )
    model = raw.get("tile_model")
    if model is None:
        return ExpertLoads(rows=str(rows))
    mwhere = f"{where}.tile_model"
    if not isinstance(model, dict):
        raise BundleError(mwhere, "must be a mapping")
    schema = model.get("schema")
    if schema not in TILE_MODEL_SCHEMAS:
        raise BundleError(
            f"{mwhere}.schema",
            f"unknown tile model {schema!r}; this reader knows {list(TILE_MODEL_SCHEMAS)}",
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
    return ExpertLoads(
        rows=str(rows),
        tile_model=TileModel(str(schema), version_text, int(block), float(cost), evidence),
    )


def load_spread_evidence(root: Path, entry: TableEntry) -> tuple[LoadSpreadRow, ...] | None:
    """The entry's tile-model evidence, checksummed, and its fit checked against the recorded
    cost; None when the entry has no model."""
    model = entry.expert_loads.tile_model
    if model is None or model.evidence is None:
        return None
    from moetables.tiles import TileError, fit_tile_cost

    ref = model.evidence
    rows = read_load_spread(read_checked_text(root, ref), ref.path)
    try:
        fit = fit_tile_cost(rows, block_m=model.block_m)
    except TileError as exc:
        raise BundleError(ref.path, f"fits no tile cost: {exc}") from None
    if round(fit.tile_cost_us, COST_DIGITS) != model.tile_cost_us:
        raise BundleError(
            f"{entry.where}:expert_loads.tile_model.tile_cost_us",
            f"is {model.tile_cost_us}, but its evidence {ref.path} fits "
            f"{round(fit.tile_cost_us, COST_DIGITS)}",
        )
    return tuple(rows)


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
