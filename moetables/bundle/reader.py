"""Opening a bundle (either layout) and validating all of it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from moetables.bundle.current import read_current_entries
from moetables.bundle.historical import read_historical_entries
from moetables.bundle.loads import LoadSpreadRow, load_spread_evidence
from moetables.bundle.model import HISTORICAL_SCHEMA, Bundle, ComponentTable, TableEntry
from moetables.bundle.quality import QualityEvidence, load_quality
from moetables.bundle.safeyaml import load_bounded_yaml
from moetables.bundle.table import load_table
from moetables.errors import BundleError

__all__ = ["ValidationReport", "open_bundle", "read_meta", "validate_bundle"]

META = "meta.yaml"
# Strings in meta.yaml that name a file of the bundle (tables, indexes of other categories).
_FILE_REF = re.compile(
    r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*\.(csv|json|jsonl|ya?ml|parquet|npz)$"
)


def read_meta(root: Path) -> dict[str, Any]:
    path = root / META
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(META, f"is missing from {root}") from None
    except IsADirectoryError:
        raise BundleError(META, "is a directory") from None
    meta = load_bounded_yaml(data, name=META)
    if not isinstance(meta, dict):
        raise BundleError(META, "must be a YAML mapping")
    return meta


def _tp_key(raw: Any, *, where: str) -> int:
    try:
        tp = int(raw)
    except (TypeError, ValueError):
        raise BundleError(where, f"TP key {raw!r} is not an integer") from None
    if tp < 1 or str(tp) != str(raw).strip():
        raise BundleError(where, f"TP key {raw!r} must be a positive integer")
    return tp


def _referenced_files(meta: Any) -> set[str]:
    """Files other parts of meta.yaml name; the MoE owners' own paths are checked elsewhere."""
    found: set[str] = set()
    per_tp = meta.get("per_tp") if isinstance(meta, dict) else None
    stack: list[Any] = (
        [value for key, value in meta.items() if key not in ("per_tp", "moe_components")]
        if isinstance(meta, dict)
        else [meta]
    )
    if isinstance(per_tp, dict):
        stack.extend(
            {k: v for k, v in record.items() if k != "moe_components"}
            for record in per_tp.values()
            if isinstance(record, dict)
        )
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and _FILE_REF.match(node) and ".." not in node.split("/"):
            found.add(node)
    return found


def open_bundle(path: str | Path, *, meta: dict[str, Any] | None = None) -> Bundle:
    """Read root metadata and every entry's contract and coverage (tables load lazily).

    The current owner ``per_tp[tp].moe_components`` is authoritative; the historical index is
    consulted only for a TP that has no current owner. ``meta``: the root metadata already
    parsed from this bundle's meta.yaml (a cache of a verified copy, as RemoteTables keeps);
    everything else is read and checked as always.
    """
    root = Path(path)
    if not root.is_dir():
        raise BundleError(str(root), "is not a bundle directory")
    if meta is None:
        meta = read_meta(root)
    entries: list[TableEntry] = []
    current_tps: set[int] = set()
    per_tp = meta.get("per_tp")
    if per_tp is not None:
        if not isinstance(per_tp, dict):
            raise BundleError("meta.yaml:per_tp", "must be a mapping of TP degree to records")
        for raw_tp, record in per_tp.items():
            tp = _tp_key(raw_tp, where="meta.yaml:per_tp")
            if isinstance(record, dict) and "moe_components" in record:
                entries.extend(read_current_entries(root, tp, record["moe_components"]))
                current_tps.add(tp)
    legacy = meta.get("moe_components")
    if legacy is not None:
        if not isinstance(legacy, dict) or legacy.get("schema") != HISTORICAL_SCHEMA:
            got = legacy.get("schema") if isinstance(legacy, dict) else legacy
            raise BundleError(
                "meta.yaml:moe_components.schema", f"must be {HISTORICAL_SCHEMA!r}, got {got!r}"
            )
        records = legacy.get("per_tp")
        if not isinstance(records, dict):
            raise BundleError("meta.yaml:moe_components.per_tp", "must be a mapping")
        for raw_tp, record in records.items():
            tp = _tp_key(raw_tp, where="meta.yaml:moe_components.per_tp")
            if tp not in current_tps:
                entries.extend(read_historical_entries(root, tp, record))
    if not entries:
        raise BundleError(
            META,
            "declares no MoE component tables (neither per_tp[tp].moe_components nor moe_components)",
        )
    seen: dict[tuple[int, int, int, bool], TableEntry] = {}
    for entry in entries:
        if entry.target.key in seen:
            raise BundleError(
                entry.table_path,
                f"duplicate entry for {entry.target.as_dict()}; "
                f"{seen[entry.target.key].table_path} already covers it",
            )
        seen[entry.target.key] = entry
    missing = sorted(f for f in _referenced_files(meta) if not (root / f).is_file())
    layout: Literal["current", "historical"] = (
        "historical" if all(e.layout == "historical" for e in entries) else "current"
    )
    return Bundle(
        root=root, layout=layout, meta=meta, entries=tuple(entries), missing_files=tuple(missing)
    )


@dataclass(slots=True)
class ValidationReport:
    """Every problem found, each naming its file and field; empty ``problems`` means valid."""

    root: Path
    bundle: Bundle | None = None
    tables: dict[str, ComponentTable] = field(default_factory=dict)
    quality: dict[str, QualityEvidence] = field(default_factory=dict)
    # Issue 18: each entry's tile-model evidence (format 3), refitted; absent without a model.
    loads: dict[str, tuple[LoadSpreadRow, ...]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_bundle(path: str | Path) -> ValidationReport:
    """Open the bundle and load every table, collecting problems rather than stopping at one."""
    report = ValidationReport(root=Path(path))
    try:
        bundle = open_bundle(path)
    except BundleError as exc:
        report.problems.append(str(exc))
        return report
    report.bundle = bundle
    for entry in bundle.entries:
        try:
            table = load_table(bundle.root, entry)
            report.tables[entry.table_path] = table
            report.quality[entry.table_path] = load_quality(bundle.root, entry, table)
            spread = load_spread_evidence(bundle.root, entry)
            if spread is not None:
                report.loads[entry.table_path] = spread
        except BundleError as exc:
            report.problems.append(str(exc))
    return report
