"""Print the conservation evidence of an acquired bundle: per table, per traced forward.

    python3 scripts/h200_conservation.py BUNDLE_DIR [--json OUT.json]

For every deployment table: the traced forwards of ``conservation.csv`` (read and checked by
``moetables.bundle.validate_bundle``: each row's components plus outside equal the whole to the
nanosecond), the share of the whole that fell outside every component scope and which
activities those were (from the contract's ``launch_ownership``), and, beside each traced
component sum, the table's own time at the same rows where the table has that exact row.
Exit status 1 when the bundle is invalid or a table of a tracing backend has no traced forward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moetables.bundle import validate_bundle


def _table_times(table: Any, tokens: int) -> dict[str, float]:
    """The table's time per local component at exactly ``tokens`` rows (eager mode)."""
    found: dict[str, float] = {}
    for i in range(len(table)):
        component = str(table.component[i])
        if table.mode[i] == "eager" and table.tokens[i] == tokens and component != "experts":
            found[component] = float(table.time_us[i])
    return found


def summarise(bundle: Path) -> tuple[dict[str, Any], bool]:
    report = validate_bundle(bundle)
    if not report.ok or report.bundle is None:
        return {"bundle": str(bundle), "valid": False, "problems": report.problems[:5]}, False
    ok = True
    tables = []
    for entry in report.bundle.entries:
        evidence = report.quality.get(entry.table_path)
        backend = entry.contract.get("backend", {})
        # Traced with the table (the backend's own description), or later and separately
        # (python -m acquisition conserve: the contract's supplementary_conservation).
        supplement = entry.contract.get("supplementary_conservation") or {}
        traced = backend.get("launch_ownership") or supplement.get("launch_ownership") or []
        item: dict[str, Any] = {
            "table": entry.table_path,
            "backend": backend.get("name"),
            "traced_separately_at": supplement.get("measured_at"),
            "forwards": [],
        }
        if evidence is None or evidence.conservation is None:
            item["absent"] = evidence.conservation_absent if evidence else "no evidence"
            ok = False
        else:
            for row, raw in zip(evidence.conservation, traced, strict=False):
                whole = row.native_total_us
                item["forwards"].append(
                    {
                        "tokens": row.tokens,
                        "expert_rows": raw.get("expert_rows"),
                        "kind": raw.get("forward"),
                        "native_total_us": whole,
                        "components_us": dict(row.components_us),
                        "outside_scopes_us": row.outside_scopes_us,
                        "outside_share": row.outside_scopes_us / whole if whole else None,
                        "outside_activities": raw.get("activities", {}).get("outside", {}),
                        "table_us_at_same_rows": _table_times(
                            report.tables[entry.table_path], row.tokens
                        ),
                    }
                )
        tables.append(item)
    return {"bundle": str(bundle), "valid": True, "tables": tables}, ok


def _print(summary: dict[str, Any]) -> None:
    if not summary["valid"]:
        print(f"INVALID {summary['bundle']}: {summary['problems']}")
        return
    for item in summary["tables"]:
        when = item.get("traced_separately_at")
        print(
            f"== {item['table']} ({item['backend']})"
            + (f", traced separately from the table at {when}" if when else "")
        )
        if "absent" in item:
            print(f"   no traced forward: {item['absent']}")
            continue
        for f in item["forwards"]:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in f["components_us"].items())
            share = f["outside_share"]
            print(
                f"   tokens {f['tokens']:>5} (expert rows {f['expert_rows']}, {f['kind']}): "
                f"whole {f['native_total_us']:.2f} us = {parts} + outside "
                f"{f['outside_scopes_us']:.2f}"
                + (f" ({100 * share:.1f} %)" if share is not None else "")
            )
            if f["outside_activities"]:
                print(f"      outside the scopes: {f['outside_activities']}")
            if f["table_us_at_same_rows"]:
                times = ", ".join(f"{k} {v:.2f}" for k, v in f["table_us_at_same_rows"].items())
                print(f"      table at {f['tokens']} rows: {times}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summary, ok = summarise(args.bundle)
    _print(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
