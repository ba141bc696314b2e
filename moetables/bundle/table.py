"""components.csv: its checksum and every row, checked against the entry that declares it."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np

from moetables.bundle.model import COLUMNS, EXPERTS, ComponentTable, TableEntry
from moetables.errors import BundleError

__all__ = ["load_table", "parse_table"]


def load_table(root: Path, entry: TableEntry) -> ComponentTable:
    """Read, checksum and validate the table of ``entry``."""
    path = root / entry.table_path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(entry.table_path, "the table file is missing") from None
    except OSError as exc:
        raise BundleError(entry.table_path, f"cannot be read: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.table_sha256:
        raise BundleError(
            entry.table_path,
            f"table checksum mismatch: sha256 of the file is {digest}, "
            f"the metadata declares {entry.table_sha256}",
        )
    return parse_table(data, entry)


# Plain ASCII decimal only: Python's int() and float() also read "7_5", Arabic-Indic "١" and
# fullwidth "１", which no CSV writer means as numbers (issue 17, item 5).
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _int_field(text: str, *, where: str, column: str) -> int:
    stripped = text.strip(" \t")
    if not _INTEGER.fullmatch(stripped):
        raise BundleError(where, f"{column} must be an integer (plain ASCII decimal), got {text!r}")
    return int(stripped)


def _decimal_field(text: str, *, where: str, column: str) -> float:
    stripped = text.strip(" \t")
    if not _DECIMAL.fullmatch(stripped):
        if stripped.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            raise BundleError(where, f"{column} must be finite and positive, got {text!r}")
        raise BundleError(where, f"{column} must be a number (plain ASCII decimal), got {text!r}")
    return float(stripped)


def parse_table(data: bytes, entry: TableEntry) -> ComponentTable:
    """Parse and validate CSV bytes; every problem names the file, line and column."""
    name = entry.table_path
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = text.splitlines()
    if not lines:
        raise BundleError(name, "is empty; it needs the header " + ",".join(COLUMNS))
    header = tuple(field.strip() for field in lines[0].split(","))
    if header != COLUMNS:
        raise BundleError(f"{name}:1", f"header must be {','.join(COLUMNS)}, got {lines[0]!r}")

    components = set(entry.components)
    modes = set(entry.modes)
    geometry = entry.geometry
    contract = entry.contract
    expert_cap = contract.get("maximum_expert_tokens")
    local_cap = contract.get("local_token_budget")
    balanced_only = entry.layout == "historical"

    comp_col: list[str] = []
    mode_col: list[str] = []
    n_col: list[int] = []
    a_col: list[int] = []
    m_col: list[int] = []
    t_col: list[float] = []
    seen: dict[tuple[str, str, int, int, int], int] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            raise BundleError(f"{name}:{number}", "blank line inside the table")
        where = f"{name}:{number}"
        fields = line.split(",")
        if len(fields) != len(COLUMNS):
            raise BundleError(where, f"needs {len(COLUMNS)} fields, got {len(fields)}")
        component, mode = fields[0].strip(), fields[1].strip()
        if component not in components:
            raise BundleError(
                where,
                f"component {component!r} is not declared by the contract {sorted(components)}",
            )
        if mode not in modes:
            raise BundleError(
                where, f"mode {mode!r} is not declared by the contract {sorted(modes)}"
            )
        tokens = _int_field(fields[2], where=where, column="tokens")
        active = _int_field(fields[3], where=where, column="activated_experts")
        pairs = _int_field(fields[4], where=where, column="local_assignments")
        time_us = _decimal_field(fields[5], where=where, column="time_us")
        if not math.isfinite(time_us) or time_us <= 0:
            raise BundleError(where, f"time_us must be finite and positive, got {fields[5]!r}")
        if tokens < 1:
            raise BundleError(where, f"tokens must be at least 1, got {tokens}")
        if component == EXPERTS:
            if not geometry.feasible(tokens, active, pairs):
                raise BundleError(
                    where,
                    f"expert point N={tokens} A={active} M={pairs} is infeasible for "
                    f"E={geometry.global_experts} k={geometry.top_k} L={geometry.local_experts}",
                )
            if balanced_only and active > 0 and pairs != geometry.balanced_total(tokens):
                raise BundleError(
                    where,
                    f"historical expert rows hold the balanced total ceil(N*k*L/E)="
                    f"{geometry.balanced_total(tokens)}, got M={pairs}",
                )
            if isinstance(expert_cap, int) and tokens > expert_cap:
                raise BundleError(
                    where,
                    f"tokens {tokens} exceeds the contract's maximum_expert_tokens {expert_cap}",
                )
        else:
            if active != -1 or pairs != -1:
                raise BundleError(
                    where,
                    f"local component {component} must have activated_experts = "
                    f"local_assignments = -1, got {active},{pairs}",
                )
            if isinstance(local_cap, int) and tokens > local_cap:
                raise BundleError(
                    where, f"tokens {tokens} exceeds the contract's local_token_budget {local_cap}"
                )
        key = (component, mode, tokens, active, pairs)
        if key in seen:
            raise BundleError(where, f"duplicates the row on line {seen[key]}")
        seen[key] = number
        comp_col.append(component)
        mode_col.append(mode)
        n_col.append(tokens)
        a_col.append(active)
        m_col.append(pairs)
        t_col.append(time_us)

    points = entry.coverage.get("points")
    if entry.layout == "historical" and points != len(seen):
        raise BundleError(
            name, f"holds {len(seen)} rows but its coverage declares {points!r} points"
        )
    present = {(c, m) for c, m, *_ in seen}
    for component in entry.components:
        for mode in entry.modes:
            if (component, mode) not in present:
                raise BundleError(name, f"declared component {component!r} has no {mode!r} rows")
    return ComponentTable(
        component=np.array(comp_col, dtype=np.str_),
        mode=np.array(mode_col, dtype=np.str_),
        tokens=np.array(n_col, dtype=np.int64),
        activated_experts=np.array(a_col, dtype=np.int64),
        local_assignments=np.array(m_col, dtype=np.int64),
        time_us=np.array(t_col, dtype=np.float64),
    )
