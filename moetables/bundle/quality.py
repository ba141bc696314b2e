"""Quality evidence published beside a table: per-point stability and per-forward conservation.

A current-layout bundle of format version 2 names, per target, two files beside
``components.csv`` (the metadata carries their paths and sha256, never the points themselves:
R34 keeps individual controls out of the metadata):

- ``stability.csv``: one row per B/2B control of every published expert point, every attempt
  (a retried point shows its failed attempt too); the published attempt's 2B median equals the
  table's ``time_us`` byte for byte (R18).
- ``conservation.csv``: one row per traced native forward: the components' sums beside the
  forward's whole CUDA activity and what fell outside every scope (R15, R26). A backend that
  traces no native forward says why instead of naming a file.
  Traces measured later, in a separate run, for a table published without them
  (``python -m acquisition conserve``) are marked ``supplementary: true`` beside the file's
  digest, and the contract's ``supplementary_conservation`` says when, how and on what.

Older bundles (format 1, and the historical layout) say their evidence is absent; the
historical layout's ``coverage.json: conditioning_controls`` is read as its stability evidence.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetables.bundle.model import (
    CONSERVED_COMPONENTS,
    EXPERTS,
    METHOD_TOLERANCE,
    SUPPLEMENT_FIELDS,
    SUPPLEMENT_KEY,
    SUPPLEMENT_MEASURED,
    ComponentTable,
    QualityFile,
    QualityRefs,
    TableEntry,
)
from moetables.bundle.paths import resolve_inside
from moetables.errors import BundleError

__all__ = [
    "CONSERVATION_COLUMNS",
    "CONSERVATION_FILE",
    "STABILITY_COLUMNS",
    "STABILITY_FILE",
    "ConservationRow",
    "QualityEvidence",
    "QualityRefs",
    "StabilityRow",
    "check_supplement",
    "csv_rows",
    "float_cell",
    "format_conservation",
    "format_stability",
    "int_cell",
    "load_quality",
    "parse_quality_refs",
    "quality_file_ref",
    "read_checked_text",
]

STABILITY_FILE = "stability.csv"
CONSERVATION_FILE = "conservation.csv"
STABILITY_COLUMNS = (
    "component",
    "tokens",
    "activated_experts",
    "local_assignments",
    "attempt",
    "b_sets",
    "b_median_us",
    "b_pooled_us",
    "b2_sets",
    "b2_median_us",
    "b2_pooled_us",
    "relative_change",
    "tolerance",
    "passed",
    "published",
)
CONSERVATION_COLUMNS = (
    "forward",
    "tokens",
    "native_total_us",
    "outside_scopes_us",
    *(f"{c}_us" for c in CONSERVED_COMPONENTS),
)
# Conservation sums are rounded to the nanosecond when written in microseconds.
_SUM_SLACK_US = 0.0015


@dataclass(frozen=True, slots=True)
class StabilityRow:
    """One B/2B control: the B arm is the control, the 2B arm the published candidate."""

    component: str
    tokens: int
    activated_experts: int
    local_assignments: int
    attempt: int
    b_sets: int
    b_median_us: float
    b_pooled_us: float
    b2_sets: int
    b2_median_us: float
    b2_pooled_us: float
    relative_change: float
    tolerance: float
    passed: bool
    published: bool

    @property
    def point(self) -> tuple[int, int, int]:
        return (self.tokens, self.activated_experts, self.local_assignments)


@dataclass(frozen=True, slots=True)
class ConservationRow:
    """One traced native forward: each component's sum, the outside remainder, the whole."""

    forward: int
    tokens: int
    native_total_us: float
    outside_scopes_us: float
    components_us: Mapping[str, float]

    @property
    def attributed_us(self) -> float:
        return math.fsum(self.components_us.values())


@dataclass(frozen=True, slots=True)
class QualityEvidence:
    """A table's evidence as the reader found it; ``absent`` says why a part is missing."""

    stability: tuple[StabilityRow, ...] | None
    conservation: tuple[ConservationRow, ...] | None
    stability_absent: str | None = None
    conservation_absent: str | None = None
    source: str = "files"
    # Traces measured separately from the table (``conservation.supplementary: true``): the
    # contract's ``supplementary_conservation``, saying when, how and on what. None otherwise.
    conservation_supplement: Mapping[str, Any] | None = None


def _number(value: float) -> str:
    return repr(float(value))


def format_stability(rows: Iterable[StabilityRow]) -> bytes:
    """CSV bytes, rows ordered by point then attempt, LF line endings."""
    out = [",".join(STABILITY_COLUMNS)]
    for r in sorted(rows, key=lambda r: (r.component, r.point, r.attempt)):
        for value in (r.b_median_us, r.b_pooled_us, r.b2_median_us, r.b2_pooled_us):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"stability medians must be finite and positive, got {value!r}")
        out.append(
            ",".join(
                [
                    r.component,
                    str(int(r.tokens)),
                    str(int(r.activated_experts)),
                    str(int(r.local_assignments)),
                    str(int(r.attempt)),
                    str(int(r.b_sets)),
                    _number(r.b_median_us),
                    _number(r.b_pooled_us),
                    str(int(r.b2_sets)),
                    _number(r.b2_median_us),
                    _number(r.b2_pooled_us),
                    _number(r.relative_change),
                    _number(r.tolerance),
                    str(int(r.passed)),
                    str(int(r.published)),
                ]
            )
        )
    return ("\n".join(out) + "\n").encode()


def format_conservation(rows: Iterable[ConservationRow]) -> bytes:
    out = [",".join(CONSERVATION_COLUMNS)]
    for r in sorted(rows, key=lambda r: r.forward):
        unknown = set(r.components_us) - set(CONSERVED_COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)} in a conservation row")
        cells = [
            str(int(r.forward)),
            str(int(r.tokens)),
            _number(r.native_total_us),
            _number(r.outside_scopes_us),
        ]
        cells += [
            _number(r.components_us[c]) if c in r.components_us else ""
            for c in CONSERVED_COMPONENTS
        ]
        out.append(",".join(cells))
    return ("\n".join(out) + "\n").encode()


def quality_file_ref(root: Path, tp: int, raw: Any, *, where: str) -> QualityFile:
    if not isinstance(raw, dict):
        raise BundleError(where, "must be a mapping with file and sha256")
    path, _ = resolve_inside(root, f"tp{tp}", raw.get("file"), where=f"{where}.file")
    sha = raw.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise BundleError(f"{where}.sha256", f"must be 64 lowercase hex digits, got {sha!r}")
    return QualityFile(path, sha)


def parse_quality_refs(root: Path, tp: int, raw: Any, *, where: str) -> QualityRefs:
    """The ``quality`` mapping of a format-2 entry: stability file, conservation file or reason."""
    if not isinstance(raw, dict):
        raise BundleError(where, "is required in format 2: a mapping with stability, conservation")
    stability = quality_file_ref(root, tp, raw.get("stability"), where=f"{where}.stability")
    conservation = raw.get("conservation")
    if isinstance(conservation, dict) and "absent" in conservation:
        reason = conservation["absent"]
        if not isinstance(reason, str) or not reason.strip():
            raise BundleError(f"{where}.conservation.absent", "must say why, as text")
        return QualityRefs(stability, None, reason)
    supplementary = (
        conservation.get("supplementary", False) if isinstance(conservation, dict) else False
    )
    if not isinstance(supplementary, bool):
        raise BundleError(f"{where}.conservation.supplementary", "must be true or false")
    return QualityRefs(
        stability,
        quality_file_ref(root, tp, conservation, where=f"{where}.conservation"),
        None,
        supplementary,
    )


def read_checked_text(root: Path, ref: QualityFile) -> str:
    path = root / ref.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(ref.path, "is named by meta.yaml but missing") from None
    got = hashlib.sha256(data).hexdigest()
    if got != ref.sha256:
        raise BundleError(ref.path, f"sha256 {got} differs from the declared {ref.sha256}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(ref.path, "is not UTF-8") from None


def csv_rows(text: str, columns: Sequence[str], where: str) -> list[tuple[int, dict[str, str]]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != tuple(columns):
        raise BundleError(f"{where}:1", f"header must be {','.join(columns)}, got {header!r}")
    found = []
    for number, cells in enumerate(reader, start=2):
        if len(cells) != len(columns):
            raise BundleError(f"{where}:{number}", f"has {len(cells)} fields, not {len(columns)}")
        found.append((number, dict(zip(columns, cells, strict=True))))
    return found


def int_cell(cells: dict[str, str], key: str, where: str) -> int:
    try:
        return int(cells[key])
    except ValueError:
        raise BundleError(where, f"{key} {cells[key]!r} is not an integer") from None


def float_cell(cells: dict[str, str], key: str, where: str, *, positive: bool = False) -> float:
    try:
        value = float(cells[key])
    except ValueError:
        raise BundleError(where, f"{key} {cells[key]!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise BundleError(where, f"{key} must be finite and {'>' if positive else '>='} 0")
    return value


def _flag(cells: dict[str, str], key: str, where: str) -> bool:
    if cells[key] not in ("0", "1"):
        raise BundleError(where, f"{key} must be 0 or 1, got {cells[key]!r}")
    return cells[key] == "1"


def read_stability(text: str, where: str) -> list[StabilityRow]:
    rows = []
    for number, c in csv_rows(text, STABILITY_COLUMNS, where):
        at = f"{where}:{number}"
        row = StabilityRow(
            component=c["component"],
            tokens=int_cell(c, "tokens", at),
            activated_experts=int_cell(c, "activated_experts", at),
            local_assignments=int_cell(c, "local_assignments", at),
            attempt=int_cell(c, "attempt", at),
            b_sets=int_cell(c, "b_sets", at),
            b_median_us=float_cell(c, "b_median_us", at, positive=True),
            b_pooled_us=float_cell(c, "b_pooled_us", at, positive=True),
            b2_sets=int_cell(c, "b2_sets", at),
            b2_median_us=float_cell(c, "b2_median_us", at, positive=True),
            b2_pooled_us=float_cell(c, "b2_pooled_us", at, positive=True),
            relative_change=float_cell(c, "relative_change", at),
            tolerance=float_cell(c, "tolerance", at, positive=True),
            passed=_flag(c, "passed", at),
            published=_flag(c, "published", at),
        )
        if row.component != EXPERTS:
            raise BundleError(at, f"only experts points have B/2B controls, got {row.component!r}")
        if row.b2_sets != 2 * row.b_sets or row.b_sets < 1:
            raise BundleError(at, f"the 2B arm must cycle twice the B arm's sets ({row.b_sets})")
        expected = abs(row.b2_pooled_us - row.b_pooled_us) / row.b_pooled_us
        if not math.isclose(expected, row.relative_change, rel_tol=1e-9, abs_tol=1e-12):
            raise BundleError(
                at, f"relative_change {row.relative_change} is not |2B-B|/B of the pooled medians"
            )
        if row.passed != (row.relative_change <= row.tolerance):
            raise BundleError(at, "passed disagrees with relative_change and tolerance")
        if row.published and not row.passed:
            raise BundleError(at, "a failed control cannot be the published attempt")
        rows.append(row)
    return rows


def read_conservation(text: str, where: str) -> list[ConservationRow]:
    rows = []
    for number, c in csv_rows(text, CONSERVATION_COLUMNS, where):
        at = f"{where}:{number}"
        components = {
            name: float_cell(c, f"{name}_us", at)
            for name in CONSERVED_COMPONENTS
            if c[f"{name}_us"] != ""
        }
        row = ConservationRow(
            forward=int_cell(c, "forward", at),
            tokens=int_cell(c, "tokens", at),
            native_total_us=float_cell(c, "native_total_us", at, positive=True),
            outside_scopes_us=float_cell(c, "outside_scopes_us", at),
            components_us=components,
        )
        if not components:
            raise BundleError(at, "names no component")
        whole = row.attributed_us + row.outside_scopes_us
        if abs(whole - row.native_total_us) > _SUM_SLACK_US * (len(components) + 1):
            raise BundleError(
                at,
                f"components {row.attributed_us:.3f} us + outside {row.outside_scopes_us:.3f} us "
                f"!= the forward's whole CUDA activity {row.native_total_us:.3f} us",
            )
        rows.append(row)
    return rows


def _check_against_table(rows: Sequence[StabilityRow], table: ComponentTable, where: str) -> None:
    """Every table experts row has exactly one published control whose 2B median it stores."""
    published: dict[tuple[int, int, int], StabilityRow] = {}
    for r in rows:
        if r.published:
            if r.point in published:
                raise BundleError(where, f"point N,A,M={r.point} has two published controls")
            published[r.point] = r
    sel = table.component == EXPERTS
    stored = {
        (int(n), int(a), int(m)): float(t)
        for n, a, m, t in zip(
            table.tokens[sel],
            table.activated_experts[sel],
            table.local_assignments[sel],
            table.time_us[sel],
            strict=True,
        )
    }
    missing = sorted(set(stored) - set(published))
    if missing:
        raise BundleError(
            where, f"{len(missing)} table experts rows lack a control, e.g. {missing[0]}"
        )
    extra = sorted(set(published) - set(stored))
    if extra:
        raise BundleError(where, f"controls for points the table lacks, e.g. {extra[0]}")
    for point, row in published.items():
        if row.b2_median_us != stored[point]:
            raise BundleError(
                where,
                f"point N,A,M={point}: the published 2B median {row.b2_median_us} differs from "
                f"the table's {stored[point]}",
            )


def _historical_stability(entry: TableEntry) -> tuple[StabilityRow, ...] | None:
    """coverage.json's conditioning_controls: 2B and B medians, no pooled medians or sets."""
    controls = entry.coverage.get("conditioning_controls")
    if not isinstance(controls, list):
        return None
    tolerance = entry.contract.get("expert_conditioning", {}).get(
        "quality_relative_tolerance", METHOD_TOLERANCE
    )
    rows = []
    for c in controls:
        point = c.get("point") if isinstance(c, dict) else None
        if not isinstance(point, dict) or not isinstance(c.get("relative_change"), int | float):
            continue
        passed = bool(c.get("supported", True)) and abs(c["relative_change"]) <= tolerance
        rows.append(
            StabilityRow(
                component=str(point.get("component")),
                tokens=int(point.get("tokens", 0)),
                activated_experts=int(point.get("activated_experts", -1)),
                local_assignments=int(point.get("local_assignments", -1)),
                attempt=0,
                b_sets=0,
                b_median_us=float(c.get("control_us", math.nan)),
                b_pooled_us=math.nan,
                b2_sets=0,
                b2_median_us=float(c.get("selected_us", math.nan)),
                b2_pooled_us=math.nan,
                relative_change=abs(float(c["relative_change"])),
                tolerance=float(tolerance),
                passed=passed,
                published=passed,
            )
        )
    return tuple(rows)


def load_quality(
    root: Path, entry: TableEntry, table: ComponentTable | None = None
) -> QualityEvidence:
    """The entry's evidence, checksummed and validated; ``table`` adds the cross-check.

    Bundles without evidence files answer with ``*_absent`` reasons, never an error.
    """
    if entry.layout == "historical":
        stability = _historical_stability(entry)
        return QualityEvidence(
            stability=stability,
            conservation=None,
            stability_absent=None if stability is not None else "coverage.json keeps no controls",
            conservation_absent="the historical layout publishes no per-forward conservation",
            source="coverage.json",
        )
    refs = entry.quality
    if refs is None:
        reason = (
            f"format version {entry.format_version} bundles publish no quality evidence; "
            "only the compact conditioning summary"
        )
        return QualityEvidence(None, None, reason, reason, source="none")
    controls = read_stability(read_checked_text(root, refs.stability), refs.stability.path)
    if table is not None:
        _check_against_table(controls, table, refs.stability.path)
    conservation = None
    if refs.conservation is not None:
        conservation = tuple(
            read_conservation(read_checked_text(root, refs.conservation), refs.conservation.path)
        )
    supplement = entry.contract.get(SUPPLEMENT_KEY) if refs.conservation_supplementary else None
    return QualityEvidence(
        stability=tuple(controls),
        conservation=conservation,
        conservation_absent=refs.conservation_absent,
        conservation_supplement=supplement if isinstance(supplement, dict) else None,
    )


def check_supplement(contract: Mapping[str, Any], refs: QualityRefs | None, *, where: str) -> None:
    """Conservation measured separately from its table is marked in both places, or neither:
    ``quality.conservation.supplementary: true`` and the contract's ``supplementary_conservation``
    with what, when, how and on what it was measured."""
    supplement = contract.get(SUPPLEMENT_KEY)
    marked = refs is not None and refs.conservation_supplementary
    if supplement is None and not marked:
        return
    if not marked:
        raise BundleError(
            f"{where}.contract.{SUPPLEMENT_KEY}",
            "describes supplementary conservation, but quality.conservation does not name a file "
            "marked supplementary: true",
        )
    if not isinstance(supplement, dict):
        raise BundleError(
            f"{where}.quality.conservation.supplementary",
            f"is true, so the contract must say how the traces were measured ({SUPPLEMENT_KEY})",
        )
    for key in SUPPLEMENT_FIELDS:
        if not isinstance(supplement.get(key), str) or not supplement[key].strip():
            raise BundleError(f"{where}.contract.{SUPPLEMENT_KEY}.{key}", "must be non-empty text")
    if supplement["measured"] != SUPPLEMENT_MEASURED:
        raise BundleError(
            f"{where}.contract.{SUPPLEMENT_KEY}.measured", f"must be {SUPPLEMENT_MEASURED!r}"
        )
