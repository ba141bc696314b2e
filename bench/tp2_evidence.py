"""Evidence of the shipped TP2/DP1/EP2 H200 bundle for docs/benchmarks.md (issue 20, items 3, 6).

    PYTHONPATH=. .venv/bin/python bench/tp2_evidence.py

Prints markdown, read on the CPU from ``bundles/H200-vllm-modular-tp2-f2`` and the samples
archived beside it: per rank the points and the B/2B pass rate (``stability.csv``); the heaviest
expert row at the largest N against the two physical bounds (``moetables.bounds``); the layer
estimate ``moetables estimate --tp 2 --dp 1`` at a few token counts on the two-H200 cluster
description (per-rank compute, the TP all-reduce the link model charges, the layer). TP2 against
the DP2/EP2 ranks is ``bench/tp2_vs_dp2.py``; leave-one-out is ``bench/loo_surfaces.py --bundle``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bundle_evidence import Checks, print_bounds_table
from moetables.bundle import load_quality, load_table, open_bundle
from moetables.comm import load_cluster
from moetables.lookup import ComponentTables

BUNDLE = ROOT / "bundles/H200-vllm-modular-tp2-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"


def points_and_checks() -> None:
    b = open_bundle(BUNDLE)
    print("### Points and B/2B checks per TP2 rank\n")
    print(
        "| target | rows | expert points | checked | passed | passed at a later attempt | "
        "largest published change | failed attempts kept | traced forwards |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for entry in b.entries:
        table = load_table(b.root, entry)
        quality = load_quality(b.root, entry, table)
        checks = Checks.of(quality.stability or ())
        print(
            f"| tp2 {entry.target.deployment} | {len(table)} | "
            f"{int((table.component == 'experts').sum())} | {checks.cells()} | "
            f"{checks.failed_attempts} | {len(quality.conservation or ())} |"
        )
    print()


def estimates() -> None:
    tables = ComponentTables(BUNDLE)
    cluster = load_cluster(CLUSTER)
    print("### `estimate --tp 2 --dp 1` on the shipped tables (cluster h200x2-nvlink)\n")
    print("| tokens | rank 0 compute us | rank 1 compute us | all_reduce bytes | layer us |")
    print("| --- | --- | --- | --- | --- |")
    for n in (1, 16, 256, 300, 1024, 2048):
        answer = tables.estimate([n], tp=2, dp=1, cluster=cluster).as_dict()
        compute = [r["compute_us"] for r in answer["ranks"]]
        [reduce] = answer["collectives"]
        print(
            f"| {n} | {compute[0]:.1f} | {compute[1]:.1f} | {reduce['bytes']} | "
            f"{answer['layer_us']:.1f} |"
        )
    print()


def main() -> None:
    points_and_checks()
    print_bounds_table(
        "TP2 expert time at the largest N against the two physical bounds",
        [("H200-vllm-modular-tp2-f2", open_bundle(BUNDLE))],
    )
    estimates()


if __name__ == "__main__":
    main()
