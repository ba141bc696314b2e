"""Point-by-point agreement of two acquisitions of the same targets (issue 19).

    PYTHONPATH=. python3 bench/acquisition_equivalence.py BEFORE_OUT_ROOT AFTER_OUT_ROOT \
        [--model Qwen/Qwen3-30B-A3B-Instruct-2507] [--hardware H200] [--variant bf16]

Each argument is an acquisition ``--out-root``. For every deployment both published, the
rows measured by both (component, N, A, M) are compared: the relative change of the stored
time (median, p95, max), and for expert points the B/2B decisions read from the samples
(the verdict of the first control attempt, the weight-set counts, and whether the point was
published). The fast path must give the same answers: median change <= 1 %, same decisions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

Key = tuple[str, int, int, int]


def table(path: Path) -> dict[Key, float]:
    rows: dict[Key, float] = {}
    for line in path.read_text().splitlines()[1:]:
        if not line.strip():
            continue
        component, _, n, a, m, t = line.strip().split(",")
        rows[(component, int(n), int(a), int(m))] = float(t)
    return rows


def decisions(path: Path) -> dict[str, tuple[bool, tuple[int, ...], str]]:
    """Per expert point: first control verdict, its weight-set counts, final status."""
    first: dict[str, tuple[bool, tuple[int, ...]]] = {}
    status: dict[str, str] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "control":
            key = record["point"]
            if key not in first or record["attempt"] == 0:
                first[key] = (bool(record["passed"]), tuple(record.get("sets") or ()))
        elif record["type"] == "point":
            status[record["point"]] = record["status"]
    return {k: (v[0], v[1], status.get(k, "open")) for k, v in first.items()}


def key_of(point: str) -> Key:
    component, *coords = point.split(":")
    if len(coords) == 1:
        return (component, int(coords[0]), -1, -1)
    return (component, int(coords[0]), int(coords[1]), int(coords[2]))


def compare(before: Path, after: Path, model: str, hardware: str, variant: str) -> list[str]:
    tables = Path(hardware) / model / variant / "tp1" / "moe_components"
    work = Path("_acquisition") / tables
    lines = [
        "| target | points in both | median change | p95 | max | largest at | "
        "same first B/2B verdict | same weight sets | published in both |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for csv in sorted((before / tables).glob("*/components.csv")):
        deployment = csv.parent.name
        other = after / tables / deployment / "components.csv"
        if not other.exists():
            continue
        a, b = table(csv), table(other)
        common = sorted(set(a) & set(b))
        change = np.array([abs(b[k] - a[k]) / a[k] for k in common])
        worst = common[int(np.argmax(change))]
        da = decisions(before / work / deployment / "samples.jsonl")
        db = decisions(after / work / deployment / "samples.jsonl")
        shared = [p for p in da if p in db and key_of(p) in set(common)]
        same_verdict = sum(da[p][0] == db[p][0] for p in shared)
        same_sets = sum(da[p][1] == db[p][1] for p in shared)
        both = sum(da[p][2] == db[p][2] == "measured" for p in shared)
        lines.append(
            f"| {deployment} | {len(common)} | {np.median(change) * 100:.2f} % | "
            f"{np.percentile(change, 95) * 100:.2f} % | {change.max() * 100:.2f} % | "
            f"{':'.join(map(str, worst))} | {same_verdict}/{len(shared)} | "
            f"{same_sets}/{len(shared)} | {both}/{len(shared)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B-Instruct-2507")
    parser.add_argument("--hardware", default="H200")
    parser.add_argument("--variant", default="bf16")
    args = parser.parse_args(argv)
    lines = compare(args.before, args.after, args.model, args.hardware, args.variant)
    if len(lines) == 2:
        print("no deployment was published by both runs", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
