"""A target's quality evidence, from its checkpoint and its backend's traced forwards.

Stability: every B/2B ``control`` record of samples.jsonl for a published expert point, every
attempt, with the published attempt marked (R18). Conservation: the backend description's
``launch_ownership`` (native forwards traced with every scope open, R26); a backend that
traces none says why. The same functions serve a fresh acquisition and the re-publication of
a shipped bundle from its kept samples (``python -m acquisition.evidence``), whose tables
must come out byte for byte unchanged (R38).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moetables.bundle import (
    EXPERTS,
    ConservationRow,
    Row,
    StabilityRow,
    TableSpec,
    load_table,
    open_bundle,
    write_bundle,
)
from moetables.bundle.model import COMPONENTS, METHOD_TOLERANCE
from moetables.errors import BundleError

__all__ = [
    "conservation_evidence",
    "quality_label",
    "republish",
    "stability_rows",
]


def quality_label(tolerance: float) -> str:
    """``exploratory`` when the B/2B tolerance is looser than the method's 3 %."""
    return "exploratory" if tolerance > METHOD_TOLERANCE else "method"


def _point(key: str) -> tuple[str, int, int, int] | None:
    parts = key.split(":")
    if parts[0] != EXPERTS or len(parts) != 4:
        return None
    return (EXPERTS, int(parts[1]), int(parts[2]), int(parts[3]))


def stability_rows(records: Iterable[Mapping[str, Any]]) -> list[StabilityRow]:
    """Controls of the measured expert points, from samples.jsonl records in file order.

    A point measured in a later attempt keeps its earlier, failed controls: the figure shows
    the retry. A point never measured (failed) is not published, nor are its controls.
    """
    controls: dict[str, list[Mapping[str, Any]]] = {}
    results: dict[str, Mapping[str, Any]] = {}
    for record in records:
        if record.get("type") == "control":
            controls.setdefault(str(record["point"]), []).append(record)
        elif record.get("type") == "point":
            results[str(record["point"])] = record
    rows: list[StabilityRow] = []
    for key, result in results.items():
        point = _point(key)
        if point is None or result.get("status") != "measured":
            continue
        published = int(result["attempt"])
        seen: dict[int, Mapping[str, Any]] = {}
        for control in controls.get(key, []):
            seen[int(control["attempt"])] = control  # a resumed attempt keeps its last verdict
        if published not in seen:
            raise ValueError(f"{key}: measured in attempt {published} without its control")
        for attempt, c in sorted(seen.items()):
            sets = c.get("sets") or [0, 0]
            rows.append(
                StabilityRow(
                    component=EXPERTS,
                    tokens=point[1],
                    activated_experts=point[2],
                    local_assignments=point[3],
                    attempt=attempt,
                    b_sets=int(sets[0]),
                    b_median_us=float(c["control_us"]),
                    b_pooled_us=float(c["control_pooled_us"]),
                    b2_sets=int(sets[1]),
                    b2_median_us=float(c["selected_us"]),
                    b2_pooled_us=float(c["selected_pooled_us"]),
                    relative_change=float(c["relative_change"]),
                    tolerance=float(c["tolerance"]),
                    passed=bool(c["passed"]),
                    published=attempt == published,
                )
            )
    return rows


def conservation_evidence(
    backend: Mapping[str, Any],
) -> tuple[list[ConservationRow], str | None]:
    """Traced native forwards of the backend description, or the reason there are none."""
    traced = backend.get("launch_ownership")
    if not isinstance(traced, list) or not traced:
        name = backend.get("name", "this backend")
        return [], (
            f"{name} times each component in its own forward with launch correlation "
            "(unattributed activity fails the point); it traces no native MoE forward whose "
            "whole could be compared with the components' sum"
        )
    rows = []
    for index, forward in enumerate(traced):
        components = {c: float(forward[f"{c}_us"]) for c in COMPONENTS if f"{c}_us" in forward}
        rows.append(
            ConservationRow(
                forward=index,
                tokens=int(forward["tokens"]),
                native_total_us=float(forward["native_forward_total_us"]),
                outside_scopes_us=float(forward["outside_scopes_us"]),
                components_us=components,
            )
        )
    return rows, None


def _samples(archive: Path) -> dict[str, list[dict[str, Any]]]:
    """samples.jsonl records per ``tp<N>/moe_components/<deployment>`` found in the archive."""
    found: dict[str, list[dict[str, Any]]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith("/samples.jsonl"):
                continue
            parts = member.name.split("/")
            key = "/".join(parts[-4:-1])
            handle = tar.extractfile(member)
            assert handle is not None
            found[key] = [json.loads(line) for line in handle.read().decode().splitlines()]
    return found


def republish(bundle_dir: Path, archive: Path) -> list[str]:
    """Re-publish ``bundle_dir`` with quality evidence from the samples kept in ``archive``.

    Tables are re-written from their own rows and must keep their bytes; anything else is an
    error and the bundle stays as it was. Returns one line per target.
    """
    bundle = open_bundle(bundle_dir)
    before = {e.table_path: e.table_sha256 for e in bundle.entries}
    samples = _samples(archive)
    specs = []
    lines = []
    for entry in bundle.entries:
        key = f"tp{entry.target.tp}/moe_components/{entry.target.deployment}"
        if key not in samples:
            raise BundleError(str(archive), f"holds no samples.jsonl for {key}")
        table = load_table(bundle.root, entry)
        rows: list[Row] = table.rows()
        stability = stability_rows(samples[key])
        backend = entry.contract.get("backend")
        conservation, absent = conservation_evidence(backend if isinstance(backend, dict) else {})
        contract = dict(entry.contract)
        contract["quality"] = quality_label(entry.tolerance)
        specs.append(
            TableSpec(
                target=entry.target,
                contract=contract,
                coverage={k: v for k, v in entry.coverage.items() if k != "table_sha256"},
                rows=rows,
                stability=stability,
                conservation=conservation,
                conservation_absent=absent,
            )
        )
        retried = len({r.point for r in stability if r.attempt > 0})
        lines.append(
            f"{key}: {sum(r.published for r in stability)} published controls "
            f"({retried} retried), {len(conservation)} traced forwards"
        )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    header = {k: v for k, v in bundle.meta.items() if k not in ("per_tp", "tp_degrees")}
    header["quality_evidence"] = {
        "source": archive.name,
        "source_sha256": digest,
        "written_by": "python -m acquisition.evidence",
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "stability and conservation evidence re-published from the acquisition's kept "
        "samples; tables unchanged",
    }
    write_bundle(bundle_dir, header, specs)
    after = {e.table_path: e.table_sha256 for e in open_bundle(bundle_dir).entries}
    if after != before:
        raise BundleError(str(bundle_dir), f"table checksums changed: {before} -> {after}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m acquisition.evidence",
        description="Re-publish a bundle with quality evidence from its kept samples archive.",
    )
    parser.add_argument("bundle", type=Path, help="the bundle's variant folder")
    parser.add_argument("archive", type=Path, help="*.acquisition-samples.tar.gz of its run")
    args = parser.parse_args(argv)
    try:
        for line in republish(args.bundle, args.archive):
            print(line)
    except (BundleError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
