"""Figures of the H200 vLLM bundles for docs/benchmarks.md (issue 5, item 7), on CPU.

    PYTHONPATH=. .venv/bin/python scripts/h200_vllm_evidence.py [--repeat REPEAT_BUNDLE]

Reads the shipped bundles (bundles/H200/..., bundles/H200-vllm-live/...) and the LLMServingSim
RTXPRO6000 bundle, and prints markdown: the same TP1/DP2/EP2 target side by side at the
(N, A, M) points both tables measured; the expert time at the largest N against the H200's
weight-bandwidth bound; leave-one-out interpolation error of the expert surfaces; the
repeatability of a table measured again in a new process (``--repeat``: the bundle folder of
that second acquisition); and the live path's conservation traces from its contract.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bundle_evidence import Key, eager_rows, ratios, spread_cells  # noqa: E402
from bench.lookup_bench import loo_bundle  # noqa: E402
from moetables.bundle import load_table  # noqa: E402
from moetables.lookup import ComponentTables  # noqa: E402

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
MODULAR = ROOT / "bundles/H200" / MODEL / "bf16"
LIVE = ROOT / "bundles/H200-vllm-live" / MODEL / "bf16"
RTX = ROOT / "bundles/llmservingsim-rtxpro6000" / MODEL / "bf16"
BANDWIDTH = 4.8e12  # H200 HBM3e, bytes per second


def rows(path: Path, tp: int, dp: int, rank: int) -> dict[Key, float]:
    return eager_rows(load_table(path, ComponentTables(path).deployment(tp, dp, rank).entry))


def side_by_side() -> None:
    print("### Same target, two GPUs: TP1/DP2/EP2 (H200 vLLM 0.26.0 vs RTXPRO6000 vLLM 0.28.0)\n")
    for rank in (0, 1):
        ours, theirs = rows(MODULAR, 1, 2, rank), rows(RTX, 1, 2, rank)
        common = sorted(set(ours) & set(theirs))
        print(f"rank {rank}: {len(common)} (component, N, A, M) points measured by both tables\n")
        print("| component | points | median H200/RTX | min | max |")
        print("| --- | --- | --- | --- | --- |")
        for component in ("gate_routing", "experts", "finalize_copy"):
            found = ratios(ours, theirs, component)
            if found:
                print(f"| {component} | {spread_cells(found, digits=2)} |")
        print()
        picks = [
            k for k in common if k[0] == "experts" and k[2] == 64 and k[1] in (1, 64, 512, 4096)
        ]
        if picks:
            print("| N | A | M | H200 us | RTXPRO6000 us |")
            print("| --- | --- | --- | --- | --- |")
            for k in picks:
                print(f"| {k[1]} | {k[2]} | {k[3]} | {ours[k]:.1f} | {theirs[k]:.1f} |")
            print()


def live_against_modular() -> None:
    live, modular = rows(LIVE, 1, 1, 0), rows(MODULAR, 1, 1, 0)
    print("### Two boundaries of one TP1 layer: vllm-live against vllm-modular\n")
    print("| component | points | median live/modular | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for component in ("gate_routing", "experts"):
        print(f"| {component} | {spread_cells(ratios(live, modular, component))} |")
    print()


def contract(path: Path, dp: int, rank: int) -> dict[str, Any]:
    meta = yaml.safe_load((path / "meta.yaml").read_text())
    for entry in meta["per_tp"][1]["moe_components"]["entries"]:
        if entry["target"]["dp"] == dp and entry["target"]["rank"] == rank:
            return entry["contract"]
    raise KeyError((dp, rank))


def bandwidth() -> None:
    print("### Expert time at the largest N against the weight-bandwidth bound (4.8 TB/s)\n")
    print(
        "| bundle | target | N | A | M | measured us | active weight bytes | bound us | bound/measured |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, path, targets in (
        ("vllm-modular", MODULAR, ((1, 0), (2, 0), (2, 1))),
        ("vllm-live", LIVE, ((1, 0),)),
    ):
        for dp, rank in targets:
            c = contract(path, dp, rank)
            per_expert = c["expert_weight_bytes"] / c["local_experts"]
            table = rows(path, 1, dp, rank)
            experts = {k: v for k, v in table.items() if k[0] == "experts" and k[2] > 0}
            n_max = max(k[1] for k in experts)
            k = max((k for k in experts if k[1] == n_max), key=lambda k: (k[2], k[3]))
            active = k[2] * per_expert
            bound = active / BANDWIDTH * 1e6
            print(
                f"| {label} | DP{dp} rank {rank} | {k[1]} | {k[2]} | {k[3]} | {experts[k]:.1f} | "
                f"{active / 1e6:.0f} MB | {bound:.1f} | {bound / experts[k]:.2f} |"
            )
    print()


def leave_one_out() -> None:
    print("### Leave-one-out interpolation error of the expert surfaces\n")
    print("| bundle | target | coordinates | points | answered | median | p95 | max |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, path, targets in (
        ("vllm-modular", MODULAR, ((1, 0), (2, 0), (2, 1))),
        ("vllm-live", LIVE, ((1, 0),)),
    ):
        for dp, rank in targets:
            for coords, r in loo_bundle(path, 1, dp, rank).items():
                print(
                    f"| {label} | DP{dp} rank {rank} | {coords} | {r['points']} | {r['answered']} | "
                    f"{r['median_rel_error']:.1%} | {r['p95_rel_error']:.1%} | "
                    f"{r['max_rel_error']:.1%} |"
                )
    print()


def repeatability(repeat: Path) -> None:
    first, second = rows(MODULAR, 1, 1, 0), rows(repeat, 1, 1, 0)
    common = sorted(set(first) & set(second))
    changes = [abs(second[k] - first[k]) / first[k] for k in common]
    worst = max(common, key=lambda k: abs(second[k] - first[k]) / first[k])
    print("### Repeatability: TP1/DP1 measured again in a new process\n")
    print(
        f"{len(common)} points (every row of the table); relative change median "
        f"{statistics.median(changes):.2%}, max {max(changes):.2%} (at {worst})\n"
    )


def conservation() -> None:
    c = contract(LIVE, 1, 0)
    print("### Live path conservation: one traced native MoE forward per token count\n")
    print(
        "| tokens | gate_routing us | experts us | wrapper us | sum | native forward total us | outside scopes us |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for o in c["backend"]["launch_ownership"]:
        total = o["gate_routing_us"] + o["experts_us"] + o["wrapper_us"]
        print(
            f"| {o['tokens']} | {o['gate_routing_us']:.1f} | {o['experts_us']:.1f} | "
            f"{o['wrapper_us']:.1f} | {total:.1f} | {o['native_forward_total_us']:.1f} | "
            f"{o['outside_scopes_us']:.1f} |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=Path, default=None)
    args = parser.parse_args()
    side_by_side()
    live_against_modular()
    bandwidth()
    leave_one_out()
    if args.repeat:
        repeatability(args.repeat)
    conservation()


if __name__ == "__main__":
    main()
