"""The issue-18 tile surfaces of a table: three new builds against the time surface's own
triangulation reused (`with_values`), side by side in one run.

    PYTHONPATH=. python3 bench/tile_surface_build.py [--repeat 5]

A tile charge (``tile_cost_us``) needs, per table and mode, the balanced tiles, the log2 block
and its square interpolated over the table's points. Built anew, that is three triangulations
(three per kernel segment) at the first charged query of a process; reused, it is the value
arrays only. Prints, per shipped bundle rank, the best-of-``repeat`` seconds of each way and
their ratio, and checks that both ways answer every measured point the same.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from moetables import ComponentTables

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    ("H200-vllm-modular-f2", (1, 1, 0)),
    ("H200-vllm-modular-f2k", (1, 2, 0)),
    ("H200-vllm-modular-f2k4", (1, 2, 1)),
    ("H200-vllm-modular-dp8-f4", (1, 8, 3)),
]
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| bundle | rank | expert rows | three new builds s | reused s | ratio | same answers |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for name, (tp, dp, rank) in CASES:
        tables = ComponentTables(ROOT / "bundles" / name / MODEL).deployment(tp, dp, rank)
        surface = tables._experts[("experts", "eager")]
        n, a, m = tables._expert_points["eager"]
        arrays = [np.random.default_rng(i).uniform(1, 9, n.shape[0]) for i in range(3)]
        fresh_s = reused_s = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            fresh = [tables._surface(n, a, m, v, "bench") for v in arrays]
            fresh_s = min(fresh_s, time.perf_counter() - started)
            started = time.perf_counter()
            reused = [surface.with_values(v, label="bench") for v in arrays]  # type: ignore[union-attr]
            reused_s = min(reused_s, time.perf_counter() - started)
        same = all(
            np.array_equal(f.batch(n, a, m)[0], r.batch(n, a, m)[0], equal_nan=True)
            for f, r in zip(fresh, reused, strict=True)
        )
        print(
            f"| {name} | TP{tp}/DP{dp} rank {rank} | {n.shape[0]} | {fresh_s:.4f} | "
            f"{reused_s:.4f} | {fresh_s / reused_s:.0f}x | {'yes' if same else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
