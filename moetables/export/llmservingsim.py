"""LLMServingSim's historical standalone layout (``moe-components-v1``), as its loader reads it.

The layout: ``meta.yaml`` names one index JSON per TP (``tp<N>/moe_components.json``, with its
sha256); each index entry names a contract-hash folder holding ``contract.json``,
``coverage.json`` and ``components.csv``. Its loader (mirrored by
``moetables.bundle.historical``) reads a table only if its contract carries the historical
method (launch-correlated eager and graph attribution, rotated weight cycles v2), its coverage
is complete with supported quality, and its expert rows are balanced totals: one M per N,
ceil(N*k*L/E), plus the all-remote point, read by the balanced reader (R42).

So a table is exported only if it already is such a table; nothing is relabelled (R38: no
translation of method names) and no row is dropped or invented. Table bytes are copied as they
are, so the exported bundle answers every query exactly as its source. A table that cannot be
expressed is left out, each reason named; a bundle with none to export is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moetables.bundle import (
    EXPERTS,
    HISTORICAL_SCHEMA,
    TableEntry,
    contract_id,
    load_table,
    validate_bundle,
)
from moetables.bundle.historical import HISTORICAL_CONDITIONING_SCHEMA, HISTORICAL_METHOD
from moetables.export.common import ExportError, ExportReport

__all__ = ["expressible", "write_llmservingsim"]

# The components LLMServingSim's historical method measured and its loader knows.
HISTORICAL_COMPONENTS = ("gate_routing", "experts", "finalize_copy")


def expressible(root: Path, entry: TableEntry) -> list[str]:
    """Why the historical layout cannot hold ``entry`` as it is (empty: it can)."""
    where = f"tp{entry.target.tp}/{entry.target.deployment}"
    why: list[str] = []
    contract, coverage = entry.contract, entry.coverage
    for key, value in HISTORICAL_METHOD.items():
        if contract.get(key) != value:
            why.append(
                f"{where}: contract {key} is {contract.get(key)!r}; the historical "
                f"method requires {value!r}"
            )
    conditioning = contract.get("expert_conditioning")
    schema = conditioning.get("schema") if isinstance(conditioning, dict) else None
    if schema != HISTORICAL_CONDITIONING_SCHEMA:
        why.append(
            f"{where}: expert_conditioning.schema is {schema!r}; the historical method "
            f"requires {HISTORICAL_CONDITIONING_SCHEMA!r} (R38: never relabelled)"
        )
    extra = [c for c in entry.components if c not in HISTORICAL_COMPONENTS]
    if extra:
        why.append(
            f"{where}: components {extra} are not in the historical method "
            f"({', '.join(HISTORICAL_COMPONENTS)})"
        )
    if coverage.get("complete") is not True or coverage.get("quality_supported") is not True:
        why.append(f"{where}: coverage must say complete and quality_supported")
    if coverage.get("expected_rounds") is None or (
        coverage.get("completed_rounds") != coverage.get("expected_rounds")
    ):
        why.append(f"{where}: coverage must give completed_rounds equal to expected_rounds")
    table = load_table(root, entry)
    experts = table.component == EXPERTS
    g = entry.geometry
    n, a = table.tokens[experts], table.activated_experts[experts]
    m = table.local_assignments[experts]
    total = -(-n * g.top_k * g.local_experts // g.global_experts)  # ceil(N*k*L/E)
    other = ~(((a == 0) & (m == 0)) | (m == total))
    if other.any():
        i = int(np.flatnonzero(other)[0])
        why.append(
            f"{where}: {int(other.sum())} expert rows are not balanced totals (first: N={n[i]} "
            f"A={a[i]} M={m[i]}, balanced M={total[i]}); the historical layout stores one M "
            "per N, ceil(N*k*L/E) (R42)"
        )
    return why


def _scalars(meta: dict[str, Any]) -> dict[str, Any]:
    """The root's plain fields (identity, versions, times): nothing that names other files."""
    return {
        k: v
        for k, v in meta.items()
        if (isinstance(v, str | int | float | bool) and not isinstance(v, float))
        or (isinstance(v, float) and math.isfinite(v))
    }


def write_llmservingsim(bundle_dir: Path, out: Path) -> ExportReport:
    report = validate_bundle(bundle_dir)
    if not report.ok or report.bundle is None:
        raise ExportError([f"the bundle is not valid: {p}" for p in report.problems])
    bundle = report.bundle
    chosen: list[TableEntry] = []
    left_out: list[str] = []
    for entry in bundle.entries:
        why = expressible(bundle.root, entry)
        if why:
            left_out.extend(why)
        else:
            chosen.append(entry)
    if not chosen:
        raise ExportError(
            [
                "no table of this bundle can be expressed in the historical "
                f"layout ({HISTORICAL_SCHEMA})",
                *left_out,
            ]
        )
    out.mkdir(parents=True, exist_ok=True)
    result = ExportReport(format="llmservingsim", out=out, left_out=left_out)
    meta = _scalars(bundle.meta)
    records: dict[int, dict[str, Any]] = {}
    for tp in sorted({e.target.tp for e in chosen}):
        entries = []
        for entry in [e for e in chosen if e.target.tp == tp]:
            contract = dict(entry.contract)
            identity = contract_id(contract)
            folder = f"moe_components/{identity}"
            data = (bundle.root / entry.table_path).read_bytes()
            coverage = {
                **entry.coverage,
                "contract_id": identity,
                "table_sha256": hashlib.sha256(data).hexdigest(),
            }
            base = out / f"tp{tp}" / folder
            base.mkdir(parents=True, exist_ok=True)
            (base / "contract.json").write_text(json.dumps(contract, indent=1, sort_keys=True))
            (base / "coverage.json").write_text(json.dumps(coverage, indent=1, sort_keys=True))
            (base / "components.csv").write_bytes(data)
            result.files += [
                f"tp{tp}/{folder}/{n}" for n in ("contract.json", "coverage.json", "components.csv")
            ]
            result.rows += data.count(b"\n") - 1
            entries.append(
                {
                    "target": entry.target.as_dict(),
                    "path": folder,
                    "contract_id": identity,
                    "table_sha256": coverage["table_sha256"],
                }
            )
        index = json.dumps({"schema": HISTORICAL_SCHEMA, "entries": entries}, indent=2).encode()
        (out / f"tp{tp}" / "moe_components.json").write_bytes(index)
        result.files.append(f"tp{tp}/moe_components.json")
        records[tp] = {
            "index": f"tp{tp}/moe_components.json",
            "sha256": hashlib.sha256(index).hexdigest(),
        }
        if bundle.meta.get("vllm_version"):
            records[tp]["vllm_version"] = bundle.meta["vllm_version"]
    meta["tp_degrees"] = sorted(records)
    meta["moe_components"] = {"schema": HISTORICAL_SCHEMA, "per_tp": records}
    (out / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    result.files.insert(0, "meta.yaml")
    check = validate_bundle(out)
    if not check.ok:  # what we wrote must read back, or nothing is claimed
        raise ExportError([f"the export does not validate: {p}" for p in check.problems])
    return result
