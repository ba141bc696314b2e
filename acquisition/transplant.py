"""Move measured targets from one published bundle into another, through the bundle writer.

A re-measurement of one deployment rank (for example the FP8 TP1/DP1 table measured again on
the path its DP2 ranks took) is published by the acquisition into its own output folder. To
replace the shipped entry, the rows, contract, coverage and quality evidence are read back
from that folder and written into the shipped bundle with ``write_bundle`` (merge: the other
targets keep their entries and files), so checksums are computed by the writer, never by hand.
The written table must keep the source's bytes (its sha256); anything else is an error.

    PYTHONPATH=. .venv/bin/python -m acquisition.transplant SRC DEST \\
        --deployment tp1/dp1_ep1_rank0_sp0 --note "why"

Without ``--deployment`` every target of SRC is moved. The root of DEST records each move in
``transplanted`` (source folder, deployment, table sha256, when, why).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moetables.bundle.model import TableEntry
from moetables.bundle.quality import load_quality
from moetables.bundle.reader import open_bundle, read_meta
from moetables.bundle.table import load_table
from moetables.bundle.writer import Row, TableSpec, write_bundle
from moetables.errors import BundleError

__all__ = ["entry_key", "main", "spec_of", "transplant"]


def entry_key(entry: TableEntry) -> str:
    """``tp<N>/<deployment>``, the name the command line and the records use."""
    return f"tp{entry.target.tp}/{entry.target.deployment}"


def spec_of(root: Path, entry: TableEntry) -> TableSpec:
    """The writer's description of ``entry`` as published under ``root``."""
    if entry.layout != "current":
        raise BundleError(entry.where, "only current-layout entries can be moved")
    if entry.expert_loads.models:
        # Tile models point at load_spread.csv files that this tool does not carry.
        raise BundleError(entry.where, "carries expert load models; move those with their tool")
    table = load_table(root, entry)
    rows: list[Row] = table.rows()
    quality = load_quality(root, entry, table)
    if quality.conservation_supplement is not None:
        raise BundleError(entry.where, "has supplementary conservation; attach it again instead")
    return TableSpec(
        target=entry.target,
        contract=dict(entry.contract),
        coverage={k: v for k, v in entry.coverage.items() if k != "table_sha256"},
        rows=rows,
        stability=quality.stability,
        conservation=quality.conservation,
        conservation_absent=quality.conservation_absent if quality.stability else None,
    )


def transplant(source: Path, dest: Path, deployments: Sequence[str] | None, note: str) -> list[str]:
    """Write ``deployments`` (all of SOURCE's when None) of ``source`` into ``dest``."""
    src = open_bundle(source)
    dst = open_bundle(dest)
    for field in ("hardware", "model", "variant"):
        if src.meta.get(field) != dst.meta.get(field):
            raise BundleError(
                str(source), f"{field} {src.meta.get(field)!r} != {dst.meta.get(field)!r}"
            )
    chosen = [e for e in src.entries if deployments is None or entry_key(e) in deployments]
    missing = set(deployments or ()) - {entry_key(e) for e in chosen}
    if missing or not chosen:
        raise BundleError(str(source), f"holds no target {sorted(missing) or deployments}")
    specs = [spec_of(src.root, e) for e in chosen]
    expected = {e.table_path: e.table_sha256 for e in chosen}
    kept = {e.table_path: e.table_sha256 for e in dst.entries if e.table_path not in expected}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    header: dict[str, Any] = {
        k: v for k, v in read_meta(dst.root).items() if k not in ("per_tp", "tp_degrees")
    }
    record = list(header.get("transplanted") or [])
    for e in chosen:
        replaced = next((d for d in dst.entries if d.table_path == e.table_path), None)
        record.append(
            {
                "deployment": entry_key(e),
                "source": str(source),
                "table_sha256": e.table_sha256,
                "replaced_table_sha256": replaced.table_sha256 if replaced else None,
                "written_by": "python -m acquisition.transplant",
                "written_at": now,
                "note": note,
            }
        )
    header["transplanted"] = record
    write_bundle(dest, header, specs)
    after = {e.table_path: e.table_sha256 for e in open_bundle(dest).entries}
    if {p: after.get(p) for p in expected} != expected or {p: after.get(p) for p in kept} != kept:
        raise BundleError(str(dest), f"table checksums changed: {expected | kept} -> {after}")
    return [
        f"{r['deployment']}: {r['replaced_table_sha256'] or 'new'} -> {r['table_sha256']}"
        for r in record[-len(chosen) :]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acquisition.transplant", description=__doc__)
    parser.add_argument("source", type=Path, help="published bundle holding the new tables")
    parser.add_argument("dest", type=Path, help="bundle receiving them (other targets kept)")
    parser.add_argument(
        "--deployment",
        action="append",
        help="tp<N>/<deployment> to move, repeatable (default: every target of SOURCE)",
    )
    parser.add_argument("--note", required=True, help="why, recorded in DEST's root")
    args = parser.parse_args(argv)
    try:
        lines = transplant(args.source, args.dest, args.deployment, args.note)
    except BundleError as exc:
        print(f"transplant: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
