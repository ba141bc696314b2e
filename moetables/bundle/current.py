"""The current layout: entries live in the root meta.yaml under ``per_tp[tp].moe_components``."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from moetables.bundle.contract import entry_geometry, require
from moetables.bundle.loads import parse_expert_loads
from moetables.bundle.model import (
    CONTRACT_SCHEMAS,
    CURRENT_FORMAT_VERSIONS,
    CURRENT_SCHEMA,
    METHOD_TOLERANCE,
    TableEntry,
)
from moetables.bundle.paths import resolve_inside
from moetables.bundle.quality import check_supplement, parse_quality_refs
from moetables.errors import BundleError
from moetables.geometry import MoeTarget

__all__ = ["read_current_entries"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def read_current_entries(root: Path, tp: int, owner: Any) -> list[TableEntry]:
    """Entries of ``meta.yaml: per_tp[tp].moe_components``.

    A malformed owner is an error, never a reason to consult a historical index instead.
    """
    where = f"meta.yaml:per_tp.{tp}.moe_components"
    if not isinstance(owner, dict):
        raise BundleError(where, "must be a mapping with schema and entries")
    if owner.get("schema") != CURRENT_SCHEMA:
        raise BundleError(
            f"{where}.schema", f"must be {CURRENT_SCHEMA!r}, got {owner.get('schema')!r}"
        )
    version = owner.get("format_version", 1)
    if isinstance(version, bool) or version not in CURRENT_FORMAT_VERSIONS:
        raise BundleError(
            f"{where}.format_version",
            f"unknown format version {version!r}; this reader knows {list(CURRENT_FORMAT_VERSIONS)}"
            " (a newer writer made it: upgrade moetables)",
        )
    raw_entries = owner.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise BundleError(f"{where}.entries", "must be a non-empty list")
    entries: list[TableEntry] = []
    for index, raw in enumerate(raw_entries):
        entries.append(
            _read_entry(root, tp, raw, version=version, where=f"{where}.entries[{index}]")
        )
    return entries


def _check_method(contract: dict[str, Any], version: int, *, where: str) -> None:
    """R30: the contract names its method/schema version, and an unknown one is refused.

    Format 1 contracts written by hand may omit it; format 2 contracts must carry it. A
    tolerance looser than the method's must be labelled exploratory (format 2).
    """
    schema = contract.get("schema")
    if schema is None and version >= 2:
        raise BundleError(
            f"{where}.schema", f"is required in format 2; known: {list(CONTRACT_SCHEMAS)}"
        )
    if schema is not None and schema not in CONTRACT_SCHEMAS:
        raise BundleError(
            f"{where}.schema",
            f"unknown method/schema {schema!r}; this reader knows {list(CONTRACT_SCHEMAS)} and "
            "never reads another method's measurements as these (R30)",
        )
    quality = contract.get("quality", "method")
    if quality not in ("method", "exploratory"):
        raise BundleError(f"{where}.quality", f"must be method or exploratory, got {quality!r}")
    conditioning = contract.get("expert_conditioning")
    tolerance = (
        conditioning.get("quality_relative_tolerance") if isinstance(conditioning, dict) else None
    )
    if (
        version >= 2
        and isinstance(tolerance, int | float)
        and tolerance > METHOD_TOLERANCE
        and quality != "exploratory"
    ):
        raise BundleError(
            f"{where}.quality",
            f"tolerance {tolerance} is looser than the method's {METHOD_TOLERANCE}: the contract "
            "must say exploratory",
        )


def _read_entry(root: Path, tp: int, raw: Any, *, version: int, where: str) -> TableEntry:
    if not isinstance(raw, dict):
        raise BundleError(where, "must be a mapping with target, table, contract, coverage")
    target = MoeTarget.from_dict(raw.get("target"), where=f"{where}.target")
    if target.tp != tp:
        raise BundleError(f"{where}.target.tp", f"is {target.tp} under per_tp.{tp}")
    table_path, _ = resolve_inside(root, f"tp{tp}", raw.get("table"), where=f"{where}.table")
    contract: Any = raw.get("contract")  # entry_geometry checks that it is a mapping
    geometry, components, modes = entry_geometry(contract, target, where=f"{where}.contract")
    _check_method(contract, version, where=f"{where}.contract")
    if modes != ("eager",):
        raise BundleError(
            f"{where}.contract.modes",
            f"new measurements are eager only (R14); got {list(modes)}",
        )
    coverage = raw.get("coverage")
    if not isinstance(coverage, dict):
        raise BundleError(f"{where}.coverage", "must be a mapping")
    cwhere = f"{where}.coverage"
    if require(coverage, "complete", bool, where=cwhere) is not True:
        raise BundleError(
            f"{cwhere}.complete", "is false: an incomplete acquisition is not published"
        )
    rounds = require(coverage, "completed_rounds", int, where=cwhere)
    if rounds < 1:
        raise BundleError(f"{cwhere}.completed_rounds", f"must be at least 1, got {rounds}")
    sha = require(coverage, "table_sha256", str, where=cwhere)
    if not _SHA256.match(sha):
        raise BundleError(f"{cwhere}.table_sha256", f"must be 64 lowercase hex digits, got {sha!r}")
    _check_conditioning(contract, coverage, where=where)
    quality = None
    if version >= 2:
        quality = parse_quality_refs(root, tp, raw.get("quality"), where=f"{where}.quality")
    elif "quality" in raw:
        raise BundleError(f"{where}.quality", "quality evidence needs format_version 2")
    check_supplement(contract, quality, where=where)
    expert_loads = parse_expert_loads(
        root, tp, raw.get("expert_loads"), version=version, where=f"{where}.expert_loads"
    )
    return TableEntry(
        layout="current",
        target=target,
        table_path=table_path,
        contract=contract,
        coverage=coverage,
        table_sha256=sha,
        components=components,
        modes=modes,
        geometry=geometry,
        format_version=version,
        quality=quality,
        expert_loads=expert_loads,
    )


def _check_conditioning(contract: dict[str, Any], coverage: dict[str, Any], *, where: str) -> None:
    """Every published expert point passed its B/2B control within the contract's tolerance."""
    summary = require(coverage, "conditioning_summary", dict, where=f"{where}.coverage")
    swhere = f"{where}.coverage.conditioning_summary"
    checked = require(summary, "checked_points", int, where=swhere)
    failed = require(summary, "failed_points", int, where=swhere)
    change = require(summary, "max_relative_change", (int, float), where=swhere)
    if checked < 0 or failed < 0 or not math.isfinite(change) or change < 0:
        raise BundleError(swhere, f"holds impossible values {summary!r}")
    if failed:
        raise BundleError(
            f"{swhere}.failed_points",
            f"{failed} expert points failed the stability control; such a table is not published",
        )
    conditioning = require(contract, "expert_conditioning", dict, where=f"{where}.contract")
    tolerance = require(
        conditioning,
        "quality_relative_tolerance",
        (int, float),
        where=f"{where}.contract.expert_conditioning",
    )
    if change > tolerance:
        raise BundleError(
            f"{swhere}.max_relative_change",
            f"{change} exceeds the contract's tolerance {tolerance}",
        )
