"""Would a cost per extra row tile help below vLLM's 128-row blocks? (issue 18, part 2 follow-up)

The estimate charges the captured counts' extra row tiles only where vLLM's expert kernel runs
128-row blocks (`moetables.tiles.MODEL_BLOCK_M`). Below them (N <= 640 with the tuned TP1 config:
16/32/64-row blocks) skewed counts put experts over a block boundary too. This asks, from the
evidence already measured, whether one cost per extra small-block tile per table predicts that:

1. the kernel alone (`docs/evidence/h200-load-spread/load_spread.json`: N = 256 at tp1, 32-row
   blocks, and at ep2, 64-row blocks): each record's reference is its N's balanced record moved
   to the record's (A, M) by the shipped factor-2 table (what the estimate does), its extra tiles
   the tiles run minus the table's balanced tiles at (N, A, M); the cost is the least-squares
   slope through the origin of (time - reference) on the extra tiles, fitted on all, and left
   one distribution out (fitted on the others, predicting the held-out one). The same with a
   second candidate count: the experts over a block boundary (those running 2+ tiles).
2. the TP1 engine (`docs/evidence/h200-tp1-validation`, `comparison-f2-tiles.json`: the
   captured counts with 128-row tiles charged at 1.416): steps with N <= 640 re-estimated with
   their small-block extra tiles charged at the kernel-fitted tp1 cost (out of sample for the
   engine), per step the medians over repetitions as `acquisition.estimate_validation` takes them.

    PYTHONPATH=. .venv/bin/python bench/small_block_tiles.py \
        --out docs/evidence/h200-load-spread/small_blocks.json

3. ``--by-block``: the same records with more kernel files (``--kernel``, repeatable: the
   session-5 run `docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json` adds tp1 at
   N = 64, 128 (16-row blocks), 200, 384 (32-row) and 512, 640 (64-row)), grouped by deployment
   and block size: per block one cost, left one distribution out and left one N out (does one
   cost per block size hold across N?); then the TP1 engine's steps N <= 640 charged per block
   at those costs.

    PYTHONPATH=. .venv/bin/python bench/small_block_tiles.py --by-block \
        --kernel docs/evidence/h200-load-spread/load_spread.json \
        --kernel docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json \
        --out docs/evidence/h200-fp8-load-spread/small_blocks_by_block.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from acquisition.estimate_validation import load_forwards, per_step
from moetables.lookup.tables import ComponentTables, DeploymentTables
from moetables.tiles import MODEL_BLOCK_M, row_tiles

BUNDLE = "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
KERNEL = Path("docs/evidence/h200-load-spread/load_spread.json")
ENGINE = Path("docs/evidence/h200-tp1-validation")
DEPLOYMENTS = {"tp1": (1, 1), "ep2": (1, 2)}
SPREAD = ("uniform", "power_law(0.6)", "power_law(1.2)")

Counter = Callable[[npt.NDArray[np.int64], int], float]


def _extra_tiles(counts: npt.NDArray[np.int64], block: int) -> float:
    return float(row_tiles(counts, block))


def _over(counts: npt.NDArray[np.int64], block: int) -> float:
    return float(((-(-counts // block)) > 1).sum())


COUNTERS: dict[str, tuple[Counter, bool]] = {
    # name: (count of the record, whether the balanced count at (N, A, M) is subtracted)
    "extra tiles": (_extra_tiles, True),
    "experts over a block boundary": (_over, False),
}


def kernel_records(
    tables: DeploymentTables, deployment: str, kernels: Sequence[Path] = (KERNEL,)
) -> list[dict[str, Any]]:
    """The small-block records of one deployment with their table-moved balanced reference."""
    raw = [r for k in kernels for r in json.loads(k.read_text())["results"]]
    recs = [
        r
        for r in raw
        if r["deployment"] == deployment
        and r["block_m"] < MODEL_BLOCK_M
        and "b2_us" in r
        and r.get("dtype", "bf16") == "bf16"
    ]
    out = []
    for n in sorted({r["N"] for r in recs}):
        group = [r for r in recs if r["N"] == n]
        bal = next(r for r in group if r["distribution"] == "balanced")
        at_bal = tables.time_us("experts", n, bal["A"], bal["M"])
        for r in group:
            moved = tables.time_us("experts", n, r["A"], r["M"]) - at_bal
            out.append(
                {
                    **{k: r[k] for k in ("N", "A", "M", "distribution", "seed", "block_m")},
                    "counts": np.asarray(r["counts"], dtype=np.int64),
                    "measured_us": float(r["b2_us"]),
                    "reference_us": float(bal["b2_us"]) + moved,
                    "balanced_tiles": tables.balanced_tiles(n, r["A"], r["M"]),
                }
            )
    return out


def _x(r: dict[str, Any], counter: str) -> float:
    count, less_balanced = COUNTERS[counter]
    x = count(r["counts"], r["block_m"])
    return x - r["balanced_tiles"] if less_balanced else x


def fit(records: Sequence[dict[str, Any]], counter: str) -> float:
    x = np.array([_x(r, counter) for r in records])
    y = np.array([r["measured_us"] - r["reference_us"] for r in records])
    return float(x @ y / (x @ x))


def _errors(records: Sequence[dict[str, Any]], cost: float, counter: str) -> dict[str, float]:
    before = [abs(r["reference_us"] / r["measured_us"] - 1) for r in records]
    after = [
        abs((r["reference_us"] + cost * _x(r, counter)) / r["measured_us"] - 1) for r in records
    ]
    return {
        "median_before": statistics.median(before),
        "median_after": statistics.median(after),
        "max_before": max(before),
        "max_after": max(after),
    }


def kernel_report(ct: ComponentTables) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for deployment, (tp, dp) in DEPLOYMENTS.items():
        records = kernel_records(ct.deployment(tp, dp, 0), deployment)
        per: dict[str, Any] = {}
        for counter in COUNTERS:
            held = {}
            for d in SPREAD:
                cost = fit([r for r in records if r["distribution"] != d], counter)
                held[d] = {
                    "cost_us": cost,
                    **_errors([r for r in records if r["distribution"] == d], cost, counter),
                }
            per[counter] = {"cost_us_all": fit(records, counter), "left_out": held}
        out[deployment] = {
            "N": sorted({r["N"] for r in records}),
            "block_m": sorted({r["block_m"] for r in records}),
            "records": len(records),
            "per_record": [
                {
                    **{k: r[k] for k in ("N", "A", "M", "distribution", "seed", "block_m")},
                    "extra_tiles": _x(r, "extra tiles"),
                    "over": _x(r, "experts over a block boundary"),
                    "excess_us": r["measured_us"] - r["reference_us"],
                }
                for r in records
            ],
            "counters": per,
        }
    return out


def _held(
    records: Sequence[dict[str, Any]], key: str, values: Sequence[Any], counter: str
) -> dict[str, Any]:
    out = {}
    for v in values:
        rest = [r for r in records if r[key] != v]
        mine = [r for r in records if r[key] == v and r["distribution"] != "balanced"]
        if not mine or not any(_x(r, counter) for r in rest):
            continue
        cost = fit(rest, counter)
        out[str(v)] = {"cost_us": cost, "records": len(mine), **_errors(mine, cost, counter)}
    return out


def block_report(ct: ComponentTables, kernels: Sequence[Path]) -> dict[str, Any]:
    """Per deployment and block size below 128 rows: one cost per extra tile, fitted on all,
    left one distribution out, left one N out."""
    out: dict[str, Any] = {}
    for deployment, (tp, dp) in DEPLOYMENTS.items():
        try:
            records = kernel_records(ct.deployment(tp, dp, 0), deployment, kernels)
        except StopIteration:
            continue
        for block in sorted({r["block_m"] for r in records}):
            mine = [r for r in records if r["block_m"] == block]
            counter = "extra tiles"
            ns = sorted({r["N"] for r in mine})
            out[f"{deployment} {block}"] = {
                "deployment": deployment,
                "block_m": block,
                "N": ns,
                "records": len(mine),
                "cost_us_all": fit(mine, counter),
                "per_N_cost_us": {
                    str(n): fit([r for r in mine if r["N"] == n], counter)
                    if any(_x(r, counter) for r in mine if r["N"] == n)
                    else None
                    for n in ns
                },
                "left_out_distribution": _held(mine, "distribution", SPREAD, counter),
                "left_out_N": _held(mine, "N", ns, counter) if len(ns) > 1 else {},
                "per_record": [
                    {
                        **{k: r[k] for k in ("N", "A", "M", "distribution", "seed")},
                        "extra_tiles": _x(r, counter),
                        "excess_us": r["measured_us"] - r["reference_us"],
                        "measured_us": r["measured_us"],
                    }
                    for r in mine
                ],
            }
    return out


def engine_report(
    ct: ComponentTables, cost: float | dict[int, float], max_tokens: int = 640
) -> dict[str, Any]:
    """Steps N <= max_tokens of the TP1 engine, before and after the small-block charge (one
    cost, or one per block size)."""
    tables = ct.deployment(1, 1, 0)
    shape = tables.tile_shape()
    cmp = json.loads((ENGINE / "comparison-f2-tiles.json").read_text())
    counts = {}
    # The routings this report was made for; the comparison file also holds the engine's own
    # router (native), added later, which the small-block question did not ask about.
    routings = ("simulator", "normal_routing")
    for routing in routings:
        forwards, _ = load_forwards(ENGINE, routing)
        for f in forwards:
            counts[(routing, f.rep, f.step)] = f.global_counts
    before, after = [], []
    for row in cmp["forwards"]:
        if row["policy"] != "histogram" or row["N"] > max_tokens or row["routing"] not in routings:
            continue
        block = shape.config(row["N"]).block_m
        c = counts[(row["routing"], row["rep"], row["step"])]
        charge = 0.0
        per = cost.get(block, 0.0) if isinstance(cost, dict) else cost
        if block < MODEL_BLOCK_M:
            a, m = int((c > 0).sum()), int(c.sum())
            charge = per * (row_tiles(c, block) - tables.balanced_tiles(row["N"], a, m))
        before.append(row)
        after.append(
            {
                **row,
                "compute_estimate_us": row["compute_estimate_us"] + charge,
                "experts_estimate_us": row["experts_estimate_us"] + charge,
            }
        )
    out: dict[str, Any] = {
        "tile_cost_us": {str(b): c for b, c in cost.items()} if isinstance(cost, dict) else cost,
        "max_tokens": max_tokens,
    }
    for label, rows in (("before", before), ("after", after)):
        steps = per_step(rows)
        for routing in ("simulator", "normal_routing"):
            mine = [s for s in steps if s["routing"] == routing]
            summary: dict[str, Any] = {
                "steps": {
                    str(s["tokens"][0]): [s["compute_error"], s["experts_error"]] for s in mine
                }
            }
            for key in ("compute_error", "experts_error"):
                errs = [abs(s[key]) for s in mine]
                summary[key] = {"median": statistics.median(errs), "max": max(errs)}
                kept = [abs(s[key]) for s in mine if s["tokens"][0] != 384]
                summary[key + "_without_384"] = {
                    "median": statistics.median(kept),
                    "max": max(kept),
                }
            out.setdefault(routing, {})[label] = summary
    return out


def engine_report_of(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = report["engine_tp1"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--kernel", type=Path, action="append", default=None)
    p.add_argument("--by-block", action="store_true", help="one cost per block size (item 3)")
    args = p.parse_args(argv)
    ct = ComponentTables(BUNDLE)
    if args.by_block:
        return by_block_main(ct, args.kernel or [KERNEL], args.out)
    kernel = kernel_report(ct)
    cost = kernel["tp1"]["counters"]["extra tiles"]["cost_us_all"]
    report: dict[str, Any] = {
        "bundle": BUNDLE,
        "kernel": kernel,
        "engine_tp1": engine_report(ct, cost),
    }
    for deployment, k in kernel.items():
        for counter, per in k["counters"].items():
            print(f"{deployment} {counter}: cost {per['cost_us_all']:.3f} us (all records)")
            for d, e in per["left_out"].items():
                print(
                    f"  held out {d}: cost {e['cost_us']:.3f}; median "
                    f"{100 * e['median_before']:.1f} -> {100 * e['median_after']:.1f} %, max "
                    f"{100 * e['max_before']:.1f} -> {100 * e['max_after']:.1f} %"
                )
    eng = engine_report_of(report)
    for routing in ("simulator", "normal_routing"):
        for key in ("compute_error", "experts_error", "experts_error_without_384"):
            b, a = eng[routing]["before"][key], eng[routing]["after"][key]
            print(
                f"engine {routing} N <= 640 {key}: median {100 * b['median']:.1f} -> "
                f"{100 * a['median']:.1f} %, max {100 * b['max']:.1f} -> {100 * a['max']:.1f} %"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def by_block_main(ct: ComponentTables, kernels: Sequence[Path], out: Path | None) -> int:
    blocks = block_report(ct, kernels)
    for name, b in blocks.items():
        per_n = ", ".join(
            f"{n}: {'-' if c is None else f'{c:.3f}'}" for n, c in b["per_N_cost_us"].items()
        )
        print(f"{name}-row blocks, N {b['N']}: cost {b['cost_us_all']:.3f} us (per N {per_n})")
        for kind in ("left_out_distribution", "left_out_N"):
            for v, e in b[kind].items():
                print(
                    f"  {kind} {v}: cost {e['cost_us']:.3f}; median "
                    f"{100 * e['median_before']:.1f} -> {100 * e['median_after']:.1f} %, max "
                    f"{100 * e['max_before']:.1f} -> {100 * e['max_after']:.1f} %"
                )
    costs = {b["block_m"]: b["cost_us_all"] for b in blocks.values() if b["deployment"] == "tp1"}
    engine = engine_report(ct, costs)
    for routing in ("simulator", "normal_routing"):
        for key in ("experts_error", "experts_error_without_384"):
            b, a = engine[routing]["before"][key], engine[routing]["after"][key]
            print(
                f"engine {routing} N <= 640 {key}: median {100 * b['median']:.1f} -> "
                f"{100 * a['median']:.1f} %, max {100 * b['max']:.1f} -> {100 * a['max']:.1f} %"
            )
    if out is not None:
        report = {
            "bundle": BUNDLE,
            "kernels": [str(k) for k in kernels],
            "blocks": blocks,
            "engine_tp1_per_block": engine,
        }
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
