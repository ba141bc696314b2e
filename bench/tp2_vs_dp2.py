"""TP2/DP1/EP2 rank tables against the TP1/DP2/EP2 rank tables of the same model (issue 20 item 3).

    PYTHONPATH=. .venv/bin/python bench/tp2_vs_dp2.py --tp2 BUNDLE [--dp2 BUNDLE] [--json OUT]

Rank r of both deployments holds the same 64 whole experts (EP2, linear placement) and runs
vLLM's Triton experts on N rows with the same expert map; what differs is around the kernel:
TP2/DP1 has the no-op ``no_dp_ep`` prepare/finalize inside ``experts`` (verified to launch
nothing), DP2 the all-gathered rows and a ``finalize_copy`` (and, in the engine, the
collectives, which no table holds: R44). So at the (N, A, M) points both planned, the expert
times should agree within the protocol's noise, and ``gate_routing`` at equal local rows too.
This prints, per rank and component, the shared points and the relative difference
(TP2 / DP2 - 1): median, p95 and the worst points. A large systematic difference is a finding
to explain, not a failure of either table. ``--dp2`` defaults to the shipped factor-2 bundle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moetables.bundle import Bundle, load_table, open_bundle
from moetables.geometry import MoeTarget

SHIPPED_DP2 = ROOT / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
Key = tuple[str, int, int, int]


def _rows(bundle: Bundle, target: MoeTarget) -> dict[Key, float]:
    [entry] = [e for e in bundle.entries if e.target == target]
    table = load_table(bundle.root, entry)
    return {(c, n, a, m): t for c, mode, n, a, m, t in table.rows() if mode == "eager"}


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def compare(tp2: Path, dp2: Path, *, worst: int = 5) -> list[dict[str, Any]]:
    """Per rank and shared component: points both tables hold and TP2/DP2 - 1 over them."""
    tp2_bundle, dp2_bundle = open_bundle(tp2), open_bundle(dp2)
    report = []
    for rank in (0, 1):
        ours = _rows(tp2_bundle, MoeTarget.for_rank(2, 1, rank))
        theirs = _rows(dp2_bundle, MoeTarget.for_rank(1, 2, rank))
        for component in sorted({k[0] for k in ours} & {k[0] for k in theirs}):
            shared = sorted(k for k in ours.keys() & theirs.keys() if k[0] == component)
            diffs = {k: ours[k] / theirs[k] - 1.0 for k in shared if theirs[k] > 0}
            values = list(diffs.values())
            report.append(
                {
                    "rank": rank,
                    "component": component,
                    "tp2_points": sum(1 for k in ours if k[0] == component),
                    "shared_points": len(diffs),
                    "median": statistics.median(values) if values else None,
                    "p95_abs": _p95([abs(v) for v in values]) if values else None,
                    "worst": [
                        {"N": k[1], "A": k[2], "M": k[3], "relative": diffs[k]}
                        for k in sorted(diffs, key=lambda k: -abs(diffs[k]))[:worst]
                    ],
                }
            )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp2", type=Path, required=True, help="bundle with the TP2 ranks")
    parser.add_argument("--dp2", type=Path, default=SHIPPED_DP2, help="bundle with DP2 ranks")
    parser.add_argument("--worst", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    report = compare(args.tp2, args.dp2, worst=args.worst)
    for line in report:
        median, p95 = line["median"], line["p95_abs"]
        level = "no shared points" if median is None else f"median {median:+.2%}, |p95| {p95:.2%}"
        print(
            f"rank {line['rank']} {line['component']}: {line['shared_points']} of "
            f"{line['tp2_points']} TP2 points shared; {level}"
        )
        for w in line["worst"]:
            print(f"    N={w['N']} A={w['A']} M={w['M']}: {w['relative']:+.2%}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
