"""Issue 15 part 4: captured vs balanced vs measured expert time under skewed routing.

    python3 scripts/h200_routing_capture.py prompts --out prompts.jsonl [--count 64]   # GPU host
    python scripts/h200_routing_capture.py compare EVIDENCE --bundle DIR --cluster FILE --out FILE

``prompts`` writes the prompt set the capture runs (random token ids of varied lengths: dummy
weights have no tokenizer; the seed makes it the same file, and so the same sha256, every time).

``compare`` reads what ``scripts/h200_routing_capture.sh`` wrote: the two routing profiles
(``<router>.routing.npz`` from ``python -m acquisition routing``) and the DP2/EP2 validation runs
(``validation/<router>/rank<r>.json``: per block forward the tokens, the router's per-expert
counts and the measured compute). For every measured forward and rank it estimates the rank's
compute under

- ``balanced``: what every simulator's even routing gives;
- ``captured`` (sampled, seed 0, and its expectation) from the independently captured profile's
  first layer (the engine's MoE layer 0, as in the one-layer validation prefix);
- ``captured-same-run``: ``captured`` from a profile of the validation run's own counts;
- ``histogram``: the forward's exact counts (the best any routing policy can do);

and reports per policy the median and maximum relative compute error and the error of M.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ROUTERS = ("normal_routing", "native")


def cmd_prompts(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    lengths = [rng.choice((16, 64, 128, 256, 512, 1024)) for _ in range(args.count)]
    with open(args.out, "w") as f:
        for n in lengths:
            f.write(
                json.dumps({"prompt_token_ids": [rng.randrange(1000, 150000) for _ in range(n)]})
            )
            f.write("\n")
    print(f"{args.out}: {args.count} prompts, {sum(lengths)} tokens")
    return 0


def same_run_profile(forwards: list[Any], top_k: int) -> Any:
    from moetables.profiles import RoutingProfile

    counts = np.array([f.global_counts for f in forwards], dtype=np.int64)[:, None, :]
    return RoutingProfile.create(
        model={
            "name": "Qwen/Qwen3-30B-A3B-Instruct-2507 (validation run)",
            "global_experts": int(counts.shape[2]),
            "top_k": top_k,
            "layers": [0],
        },
        workload={
            "prompts_sha256": "",
            "prompts": len(forwards),
            "prompt_tokens": int(counts.sum()) // top_k,
            "generated_tokens": 0,
        },
        step_tokens=[sum(f.tokens) for f in forwards],
        counts=counts,
        command="scripts/h200_routing_capture.py compare (from the validation run's own capture)",
        router="validation",
        source="vllm",
    )


def estimate_rows(
    forwards: list[Any],
    info: list[dict[str, Any]],
    tables: Any,
    cluster: Any,
    name: str,
    **options: Any,
) -> list[dict[str, Any]]:
    from acquisition.estimate_validation import local_load

    tokens = np.array([f.tokens for f in forwards], dtype=np.int64)
    est = tables.estimate_batch(tokens, tp=1, dp=len(info), cluster=cluster, **options)
    if est.errors:
        raise SystemExit(f"{name}: the estimate refused steps: {est.errors}")
    maps = [i["moe"][0]["expert_map"] for i in info]
    rows = []
    for i, f in enumerate(forwards):
        for r in range(len(info)):
            a, m = local_load(f.global_counts, maps[r])
            rows.append(
                {
                    "policy": name,
                    "step": f.step,
                    "rep": f.rep,
                    "rank": r,
                    "tokens": list(f.tokens),
                    "A_measured": a,
                    "M_measured": m,
                    "A_estimate": int(est.routing.activated_experts[i, r]),
                    "M_estimate": int(est.routing.local_assignments[i, r]),
                    "compute_measured_us": f.compute_us[r],
                    "compute_estimate_us": float(est.compute_us[i, r]),
                }
            )
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rel = [
        abs(r["compute_estimate_us"] - r["compute_measured_us"]) / r["compute_measured_us"]
        for r in rows
    ]
    m_err = [abs(r["M_estimate"] - r["M_measured"]) / max(1, r["M_measured"]) for r in rows]
    return {
        "forwards_x_ranks": len(rows),
        "compute_rel_err_median": statistics.median(rel),
        "compute_rel_err_max": max(rel),
        "M_rel_err_median": statistics.median(m_err),
        "M_rel_err_max": max(m_err),
    }


def cmd_compare(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from acquisition.estimate_validation import load_forwards
    from moetables.comm import load_cluster
    from moetables.lookup.tables import ComponentTables
    from moetables.profiles import read_profile

    evidence = Path(args.evidence)
    tables = ComponentTables(args.bundle)
    cluster = load_cluster(args.cluster)
    result: dict[str, Any] = {"bundle": args.bundle, "cluster": args.cluster, "routers": {}}
    for router in ROUTERS:
        if not (evidence / "validation" / router).is_dir():
            print(f"{router}: no validation run, skipped")
            continue
        forwards, info = load_forwards(evidence, router)
        top_k = int(info[0]["moe"][0]["top_k"])
        profile = read_profile(evidence / f"{router}.routing.npz")
        layer = profile.layers[0]
        counts = np.array([f.global_counts for f in forwards], dtype=np.int64)
        arms: dict[str, dict[str, Any]] = {
            "balanced": {"policy": "balanced"},
            "captured": {"policy": "captured", "profile": profile, "layer": layer, "seed": 0},
            "captured-expectation": {
                "policy": "captured", "profile": profile, "layer": layer,
                "captured_expectation": True,
            },
            "captured-same-run": {
                "policy": "captured", "profile": same_run_profile(forwards, top_k), "layer": 0,
                "seed": 0,
            },
            "histogram": {"policy": "histogram", "expert_counts": counts},
        }  # fmt: skip
        # The counting arms are charged for their counts by default (tile_cost_us="auto": each
        # rank table's load-spread model); the same arms for balanced loads beside them.
        for name in ("captured", "captured-same-run", "histogram"):
            arms[f"{name}-uncharged"] = {**arms[name], "tile_cost_us": "none"}
        runs = {
            name: estimate_rows(forwards, info, tables, cluster, name, **options)
            for name, options in arms.items()
        }
        result["routers"][router] = {
            "profile": {"file": f"{router}.routing.npz", **profile.summary()},
            "summary": {name: summarise(rows) for name, rows in runs.items()},
            "rows": runs,
        }
        print(f"{router}: imbalance of the captured layer {layer}: {profile.imbalance()[0]:.2f}")
        for name, s in result["routers"][router]["summary"].items():
            print(
                f"  {name:22s} compute err median {s['compute_rel_err_median']:.1%} "
                f"max {s['compute_rel_err_max']:.1%}; M err median {s['M_rel_err_median']:.1%}"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("prompts", help="write the capture's prompt set")
    q.add_argument("--out", required=True)
    q.add_argument("--count", type=int, default=64)
    q.add_argument("--seed", type=int, default=15)
    c = sub.add_parser("compare", help="captured vs balanced vs measured (CPU)")
    c.add_argument("evidence")
    c.add_argument("--bundle", required=True)
    c.add_argument("--cluster", required=True)
    c.add_argument("--out", required=True)
    args = p.parse_args(argv)
    return cmd_prompts(args) if args.cmd == "prompts" else cmd_compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
