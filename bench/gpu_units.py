"""Unit-to-unit spread of lent H200s: the same expert points measured on two GPUs (issue 18).

    PYTHONPATH=. python3 bench/gpu_units.py REFERENCE OTHER [OTHER ...] [--label NAME ...]

Each argument is an acquisition ``--out-root`` or a shipped bundle directory holding a TP1/DP1
table of Qwen3-30B-A3B bf16. For every other table, the expert points it shares with the
reference are compared (OTHER / REFERENCE - 1), overall and by N band at the router-like
A = 128; tables measured on one GPU agree to the repeatability of the method (median change
0.1-0.5 %, docs/benchmarks.md), so a steady shift between two GPUs is the units, not the method.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acquisition_equivalence import table

Key = tuple[str, int, int, int]
BANDS = ((1, 15), (16, 192), (193, 768), (769, 2048))


def experts(root: Path) -> dict[Key, float]:
    found = sorted(root.glob("**/tp1/moe_components/dp1_ep1_rank0_sp0/components.csv"))
    found = [p for p in found if "_acquisition" not in p.parts]
    if len(found) != 1:
        raise SystemExit(f"{root}: expected one TP1/DP1 components.csv, found {len(found)}")
    return {k: v for k, v in table(found[0]).items() if k[0] == "experts"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("others", type=Path, nargs="+")
    parser.add_argument("--label", action="append", default=[], help="one per table, in order")
    args = parser.parse_args()
    tables = [args.reference, *args.others]
    labels = args.label or [str(p) for p in tables]
    if len(labels) != len(tables):
        raise SystemExit("give one --label per table, the reference first")
    ref = experts(args.reference)
    head = "| table | points in both | median change | p5 | p95 |"
    bands = " | ".join(f"A = 128, N {lo}-{hi}" for lo, hi in BANDS)
    print(f"{head} {bands} |")
    print("| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(BANDS))
    for label, path in zip(labels[1:], args.others, strict=True):
        other = experts(path)
        common = [k for k in ref if k in other]
        change = np.array([other[k] / ref[k] - 1 for k in common]) * 100
        cells = []
        for lo, hi in BANDS:
            band = [other[k] / ref[k] - 1 for k in common if k[2] == 128 and lo <= k[1] <= hi]
            cells.append(f"{np.median(band) * 100:+.2f} % ({len(band)})" if band else "-")
        p5, p95 = np.percentile(change, [5, 95])
        print(
            f"| {label} | {len(common)} | {np.median(change):+.2f} % | {p5:+.2f} % | "
            f"{p95:+.2f} % | " + " | ".join(cells) + " |"
        )


if __name__ == "__main__":
    main()
