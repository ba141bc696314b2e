"""The historical standalone layout (``moe-components-v1``), as LLMServingSim published it.

meta.yaml names one index JSON per TP; each index entry names a contract-hash folder with
contract.json, coverage.json and components.csv. The rules below are the ones its own loader
enforced, so a table it refused is refused here too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from moetables.bundle.contract import contract_id, entry_geometry, require
from moetables.bundle.model import HISTORICAL_SCHEMA, TableEntry
from moetables.bundle.paths import resolve_inside
from moetables.errors import BundleError
from moetables.geometry import MoeTarget

__all__ = ["HISTORICAL_CONDITIONING_SCHEMA", "HISTORICAL_METHOD", "read_historical_entries"]

# The method contract a historical table must carry to still be readable (R38).
HISTORICAL_METHOD = {
    "eager_attribution": "native_eager_launch_correlation_v1",
    "graph_attribution": "native_graph_launch_correlation_v1",
    "graph_memory_pool": "independent_per_variant",
    "graph_output_reference": "independent_pre_capture_clone",
}
HISTORICAL_CONDITIONING_SCHEMA = "rotated-weight-cycles-v2"


def _load_json(path: Path, name: str) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(name, "is missing") from None
    return _parse_json(data, name)


def _parse_json(data: bytes, name: str) -> Any:
    """JSON from strictly UTF-8 bytes (json.loads would also take UTF-16 and UTF-32)."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BundleError(name, f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise BundleError(name, "is nested too deeply") from None


def read_historical_entries(root: Path, tp: int, record: Any) -> list[TableEntry]:
    where = f"meta.yaml:moe_components.per_tp.{tp}"
    if not isinstance(record, dict):
        raise BundleError(where, "must be a mapping with index and sha256")
    index_rel, index_path = resolve_inside(root, "", record.get("index"), where=f"{where}.index")
    try:
        index_bytes = index_path.read_bytes()
    except FileNotFoundError:
        raise BundleError(index_rel, "the index file named by meta.yaml is missing") from None
    declared = record.get("sha256")
    if declared is not None and hashlib.sha256(index_bytes).hexdigest() != declared:
        raise BundleError(
            index_rel, f"index checksum mismatch: meta.yaml declares sha256 {declared}"
        )
    index = _parse_json(index_bytes, index_rel)
    if not isinstance(index, dict) or index.get("schema") != HISTORICAL_SCHEMA:
        got = index.get("schema") if isinstance(index, dict) else type(index).__name__
        raise BundleError(f"{index_rel}:schema", f"must be {HISTORICAL_SCHEMA!r}, got {got!r}")
    raw_entries = index.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise BundleError(f"{index_rel}:entries", "must be a non-empty list")
    base = str(Path(index_rel).parent.as_posix()) if "/" in index_rel else ""
    entries = [
        _read_entry(root, tp, base, raw, where=f"{index_rel}:entries[{i}]")
        for i, raw in enumerate(raw_entries)
    ]
    return entries


def _read_entry(root: Path, tp: int, base: str, raw: Any, *, where: str) -> TableEntry:
    if not isinstance(raw, dict):
        raise BundleError(where, "must be a mapping with target, path, contract_id, table_sha256")
    target = MoeTarget.from_dict(raw.get("target"), where=f"{where}.target")
    if target.tp != tp:
        raise BundleError(f"{where}.target.tp", f"is {target.tp} in the TP{tp} index")
    folder, folder_path = resolve_inside(root, base, raw.get("path"), where=f"{where}.path")
    contract_name = f"{folder}/contract.json"
    coverage_name = f"{folder}/coverage.json"
    contract = _load_json(folder_path / "contract.json", contract_name)
    coverage = _load_json(folder_path / "coverage.json", coverage_name)
    if not isinstance(contract, dict):
        raise BundleError(contract_name, "must be a JSON object")
    if not isinstance(coverage, dict):
        raise BundleError(coverage_name, "must be a JSON object")

    identity = contract_id(contract)
    declared = raw.get("contract_id")
    if declared != identity:
        raise BundleError(
            f"{where}.contract_id",
            f"is {declared!r} but sha256 of the canonical contract.json is {identity}: "
            "the contract was edited or belongs to another entry",
        )
    if coverage.get("contract_id") != identity:
        raise BundleError(f"{coverage_name}:contract_id", f"must be {identity}")
    for name, doc in ((contract_name, contract), (coverage_name, coverage)):
        if doc.get("schema") != HISTORICAL_SCHEMA:
            raise BundleError(
                f"{name}:schema", f"must be {HISTORICAL_SCHEMA!r}, got {doc.get('schema')!r}"
            )

    geometry, components, modes = entry_geometry(contract, target, where=contract_name)
    for key, value in HISTORICAL_METHOD.items():
        if contract.get(key) != value:
            raise BundleError(
                f"{contract_name}:{key}",
                f"must be {value!r} (the method contract this reader supports), got {contract.get(key)!r}",
            )
    conditioning = require(contract, "expert_conditioning", dict, where=contract_name)
    if conditioning.get("schema") != HISTORICAL_CONDITIONING_SCHEMA:
        raise BundleError(
            f"{contract_name}:expert_conditioning.schema",
            f"must be {HISTORICAL_CONDITIONING_SCHEMA!r}",
        )

    if require(coverage, "complete", bool, where=coverage_name) is not True:
        raise BundleError(f"{coverage_name}:complete", "is false: the acquisition did not finish")
    if coverage.get("quality_supported") is not True:
        raise BundleError(f"{coverage_name}:quality_supported", "is not true: controls failed")
    expected = require(coverage, "expected_rounds", int, where=coverage_name)
    completed = require(coverage, "completed_rounds", int, where=coverage_name)
    if completed != expected:
        raise BundleError(
            f"{coverage_name}:completed_rounds", f"is {completed} of {expected} expected rounds"
        )
    table_sha = require(raw, "table_sha256", str, where=where)
    if coverage.get("table_sha256") != table_sha:
        raise BundleError(
            f"{coverage_name}:table_sha256", "differs from the index entry's table_sha256"
        )
    return TableEntry(
        layout="historical",
        target=target,
        table_path=f"{folder}/components.csv",
        contract=contract,
        coverage=coverage,
        table_sha256=table_sha,
        components=components,
        modes=modes,
        geometry=geometry,
        contract_id=identity,
    )
