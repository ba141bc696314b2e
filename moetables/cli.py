"""Command line: validate a bundle, describe it, or answer lookups from a JSON-lines file."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from moetables.bundle import EXPERTS, validate_bundle
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.lookup import ComponentTables

__all__ = ["main"]


def _validate(args: argparse.Namespace, out: TextIO) -> int:
    report = validate_bundle(args.bundle)
    if report.ok and report.bundle is not None:
        rows = sum(len(t) for t in report.tables.values())
        print(
            f"ok: {args.bundle}: {len(report.bundle.entries)} deployment tables, {rows} rows, "
            f"{report.bundle.layout} layout",
            file=out,
        )
        for name in report.bundle.missing_files:
            print(f"note: meta.yaml names {name}, which is not in this bundle", file=out)
        return 0
    print(f"invalid: {args.bundle}", file=out)
    for problem in report.problems:
        print(f"  - {problem}", file=out)
    return 1


def describe(path: str | Path) -> dict[str, Any]:
    """What ``info`` prints: identity, and per deployment its components and support."""
    report = validate_bundle(path)
    if report.bundle is None:
        raise BundleError(str(path), "; ".join(report.problems))
    bundle = report.bundle
    deployments = []
    for entry in bundle.entries:
        table = report.tables.get(entry.table_path)
        item: dict[str, Any] = {
            "target": entry.target.as_dict(),
            "table": entry.table_path,
            "layout": entry.layout,
            "components": list(entry.components),
            "modes": list(entry.modes),
            "global_experts": entry.geometry.global_experts,
            "top_k": entry.geometry.top_k,
            "local_experts": entry.geometry.local_experts,
            "table_sha256": entry.table_sha256,
        }
        if table is not None:
            experts = table.component == EXPERTS
            item["rows"] = len(table)
            if experts.any():
                item["support"] = {
                    axis: [int(col[experts].min()), int(col[experts].max())]
                    for axis, col in (
                        ("tokens", table.tokens),
                        ("activated_experts", table.activated_experts),
                        ("local_assignments", table.local_assignments),
                    )
                }
        else:
            item["problem"] = next((p for p in report.problems if entry.table_path in p), None)
        deployments.append(item)
    return {
        "bundle": str(path),
        "valid": report.ok,
        "layout": bundle.layout,
        "hardware": bundle.hardware,
        "model": bundle.model,
        "variant": bundle.variant,
        "vllm_version": bundle.meta.get("vllm_version"),
        "missing_files": list(bundle.missing_files),
        "deployments": deployments,
    }


def _info(args: argparse.Namespace, out: TextIO) -> int:
    try:
        info = describe(args.bundle)
    except BundleError as exc:
        print(f"invalid: {exc}", file=out)
        return 1
    json.dump(info, out, indent=2)
    out.write("\n")
    return 0 if info["valid"] else 1


def _lookup(args: argparse.Namespace, out: TextIO) -> int:
    try:
        tables = ComponentTables(args.bundle)
        deployment = tables.deployment(args.tp, args.dp, args.rank, args.sequence_parallel)
    except (BundleError, CoverageError, QueryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = sys.stdin.read() if args.queries == "-" else Path(args.queries).read_text("utf-8")
    parsed: list[Any] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError as exc:
            parsed.append(QueryError(f"line {number} is not JSON: {exc.msg}"))
    valid = [q for q in parsed if not isinstance(q, QueryError)]
    answers = iter(deployment.answer(valid))
    for item in parsed:
        if isinstance(item, QueryError):
            answer: dict[str, Any] = {"error": "invalid", "message": str(item)}
        else:
            answer = next(answers)
        out.write(json.dumps(answer) + "\n")
    return 0


def _export(args: argparse.Namespace, out: TextIO) -> int:
    from moetables.export import ExportError, export_bundle

    try:
        report = export_bundle(args.bundle, args.format, args.out)
    except (ExportError, BundleError) as exc:
        problems = exc.problems if isinstance(exc, ExportError) else [str(exc)]
        print(f"refused: {args.bundle} as {args.format}", file=out)
        for problem in problems:
            print(f"  - {problem}", file=out)
        return 1
    print(f"ok: {report.rows} rows in {len(report.files)} files under {report.out}", file=out)
    for name in report.left_out:
        print(f"left out: {name}", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moetables", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check every file, checksum, contract and row")
    p.add_argument("bundle")
    p = sub.add_parser("info", help="describe a bundle's deployments and support as JSON")
    p.add_argument("bundle")
    p = sub.add_parser("lookup", help="answer JSON-lines queries for one deployment rank")
    p.add_argument("bundle")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument(
        "--queries", required=True, help="file of JSON objects, one per line; - for stdin"
    )
    p = sub.add_parser("export", help="write the bundle for another simulator")
    p.add_argument("bundle")
    p.add_argument("--format", required=True, choices=("llmservingsim", "aiconfigurator"))
    p.add_argument("--out", required=True, help="an empty or new folder")
    args = parser.parse_args(argv)
    handler = {
        "validate": _validate, "info": _info, "lookup": _lookup, "export": _export,
    }[args.command]
    return handler(args, out or sys.stdout)
