"""Figures of an acquisition for docs/benchmarks.md, read from its --out-root.

    python bench/acquisition_h200_summary.py OUT_ROOT [--bandwidth-tbs 4.8]

Prints, per target: points, wall time of the sessions that measured them and points per
minute, the share of expert points passing the B/2B check at their first attempt (and in
the end), and the expert time at the largest N against the weight-bandwidth bound (bytes of
the active local expert weights / bandwidth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetables.bundle import validate_bundle


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _measuring_wall(records: list[dict]) -> float:
    """Seconds spent inside sessions: a resumed run's idle gap between sessions is not work."""
    spans: list[list[float]] = []
    for record in records:
        if record["type"] == "session" or not spans:
            spans.append([])
        if "at" in record:
            spans[-1].append(record["at"])
    return sum(max(span) - min(span) for span in spans if span) or float("nan")


def summarize(root: Path, bandwidth: float) -> None:
    for samples in sorted((root / "_acquisition").rglob("samples.jsonl")):
        records = _records(samples)
        deployment = samples.parent.name
        points = [r for r in records if r["type"] == "point" and r["status"] == "measured"]
        controls = [r for r in records if r["type"] == "control"]
        sessions = [r for r in records if r["type"] == "session"]
        wall = _measuring_wall(records)
        first = [c for c in controls if c["attempt"] == 0]
        passed_first = sum(c["passed"] for c in first)
        expert_points = [p for p in points if p["point"].startswith("experts:")]
        print(
            f"{deployment}: {len(points)} points in {wall:.0f} s over {len(sessions)} sessions "
            f"({60 * len(points) / wall:.1f} points/min)"
        )
        if first:
            print(
                f"  B/2B check: {passed_first}/{len(first)} expert points passed at the first "
                f"attempt ({100 * passed_first / len(first):.1f}%); {len(expert_points)} "
                f"published after {len(controls)} controls"
            )
    for bundle in sorted(
        p.parent for p in root.rglob("meta.yaml") if "_acquisition" not in p.parts
    ):
        report = validate_bundle(bundle)
        print(f"bundle {bundle.relative_to(root)}: valid={report.ok}")
        if report.bundle is None:
            continue
        for entry in report.bundle.entries:
            table = report.tables[entry.table_path]
            experts = table.select("experts", "eager")
            n_max = int(table.tokens[experts].max())
            at_max = experts & (table.tokens == n_max)
            a_max = int(table.activated_experts[at_max].max())
            row = at_max & (table.activated_experts == a_max)
            time_us = float(table.time_us[row].max())
            per_expert = entry.contract["expert_weight_bytes"] / entry.geometry.local_experts
            bound_us = a_max * per_expert / (bandwidth * 1e12) * 1e6
            print(
                f"  {entry.target.deployment}: experts at N={n_max} A={a_max}: "
                f"{time_us:.1f} us; weight-bandwidth bound {bound_us:.1f} us "
                f"({a_max} experts x {per_expert / 1e6:.2f} MB / {bandwidth} TB/s), "
                f"ratio {time_us / bound_us:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8)
    args = parser.parse_args()
    summarize(args.root, args.bandwidth_tbs)


if __name__ == "__main__":
    main()
