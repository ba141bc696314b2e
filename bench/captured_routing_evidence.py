"""What the H200 routing profiles say about `balanced` vs `captured` (issue 15 part 4), on CPU
from the committed files only.

    PYTHONPATH=. .venv/bin/python bench/captured_routing_evidence.py \
        [--out docs/evidence/h200-routing/estimate.json] [--figure docs/figures/captured_routing.png]

1. Per-rank statistics. For EP 2, 4 and 8 (linear placement, R4) and several N, every MoE
   layer's per-rank (A, M) under the `captured` policy (drawn from the profile, ``DRAWS`` draws
   per layer, seed 0) against `balanced` (M = ceil(N k L / E), A = min(L, M)): the busiest and
   the idlest rank's M over balanced's M, and the mean A over balanced's A. At N the profile
   captured (16: decode) a draw is one captured step, as it was; elsewhere tokens are drawn from
   a captured step's per-token chances.
2. DP2/EP2 layer estimate from the shipped factor-2 H200 tables (vLLM 0.26.0 `TritonExperts`):
   per layer and step, `balanced` and `captured` (drawn: the tables' balanced-load answers at
   each rank's (N, A, M), with the per-tile charge c = 1.6 us of issue 18, and with each rank
   table's own load-spread model, the estimate's default since session 11; and the
   expectation), summed over the 48 MoE layers (compute and waits: ``layer_compute_us``;
   transfers do not depend on routing at a given step). DP4/EP4 and DP8/EP8 from the one-GPU
   wide-EP rank tables the same way, their tile models measured in session 11
   (`docs/evidence/h200-rank-load-spread/`).

Nothing here is the engine's own expert time: that comparison needs the DP2/EP2 validation run
on two GPUs (``scripts/h200_routing_capture.sh validate``), not run yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moetables.comm import load_cluster
from moetables.lookup import ComponentTables
from moetables.profiles import RoutingProfile, read_profile
from moetables.routing import Deployment, route_batch

EVIDENCE = ROOT / "docs/evidence/h200-routing"
PROFILES = {"normal_routing": "vLLM simulator normal_routing", "native": "native (untrained)"}
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
TABLES = {
    2: ROOT / "bundles/H200-vllm-modular-f2" / MODEL,
    4: ROOT / "bundles/H200-vllm-modular-dp4-f4" / MODEL,
    8: ROOT / "bundles/H200-vllm-modular-dp8-f4" / MODEL,
}
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"
STAT_N = (16, 64, 256, 1024, 4096)
# Tokens per DP rank of the estimated steps: the tables hold up to 2,048 rows per rank.
STEP_ROWS = (8, 32, 128, 512, 2048)
DRAWS = 8
TILE_COST_US = 1.6


def split(n: int, dp: int) -> list[int]:
    return [n // dp + (1 if r < n % dp else 0) for r in range(dp)]


def rank_statistics(profile: RoutingProfile, ep: int) -> list[dict[str, Any]]:
    d = Deployment(1, ep, False, profile.global_experts, profile.top_k)
    rows = []
    for n in STAT_N:
        steps = [split(n, ep)] * DRAWS
        bal = route_batch(d, steps, "balanced")
        m_bal = float(bal.local_assignments[0].max())
        a_bal = float(bal.activated_experts[0].max())
        hi, lo, a_ratio, a_lo = [], [], [], []
        for layer in profile.layers:
            got = route_batch(d, steps, "captured", profile=profile, layer=layer, seed=0)
            m = got.local_assignments.astype(np.float64)
            a = got.activated_experts.astype(np.float64)
            hi.extend((m.max(axis=1) / m_bal).tolist())
            lo.extend((m.min(axis=1) / m_bal).tolist())
            a_ratio.extend((a.mean(axis=1) / a_bal).tolist())
            a_lo.extend((a.min(axis=1) / a_bal).tolist())
        rows.append(
            {
                "ep": ep,
                "N": n,
                "M_balanced": m_bal,
                "A_balanced": a_bal,
                "M_max_over_balanced_mean": statistics.fmean(hi),
                "M_max_over_balanced_max": max(hi),
                "M_min_over_balanced_mean": statistics.fmean(lo),
                "A_mean_over_balanced_mean": statistics.fmean(a_ratio),
                "A_min_over_balanced_mean": statistics.fmean(a_lo),
            }
        )
    return rows


def step_estimates(profile: RoutingProfile, dp: int) -> list[dict[str, Any]]:
    tables = ComponentTables(TABLES[dp])
    cluster = load_cluster(CLUSTER) if dp == 2 else None
    steps = [[rows] * dp for rows in STEP_ROWS]
    repeated = [s for s in steps for _ in range(DRAWS)]
    base = tables.estimate_batch(steps, tp=1, dp=dp, cluster=cluster, policy="balanced")
    if base.errors:
        raise SystemExit(f"DP{dp} balanced refused: {base.errors}")
    # "captured": the tables' balanced-load answers at each rank's drawn (N, A, M);
    # "captured+table": the estimate's default since session 11, each rank's table's own
    # load-spread model charged for the drawn counts (every rank table here records one).
    arms: dict[str, dict[str, Any]] = {
        "captured": {"policy": "captured", "seed": 0, "tile_cost_us": "none"},
        "captured-expectation": {"policy": "captured", "captured_expectation": True},
    }
    if dp == 2:
        arms["captured+tiles"] = {"policy": "captured", "seed": 0, "tile_cost_us": TILE_COST_US}
    arms["captured+table"] = {"policy": "captured", "seed": 0, "tile_cost_us": "table"}
    per_arm = {name: np.zeros((len(steps), DRAWS)) for name in arms}
    experts_max = {name: np.zeros((len(steps), DRAWS)) for name in arms}
    for layer in profile.layers:
        for name, options in arms.items():
            est = tables.estimate_batch(
                repeated if "seed" in options else steps,
                tp=1,
                dp=dp,
                cluster=cluster,
                profile=profile,
                layer=layer,
                **options,
            )
            if est.errors:
                raise SystemExit(f"DP{dp} {name} layer {layer} refused: {est.errors}")
            width = DRAWS if "seed" in options else 1
            per_arm[name] += est.layer_compute_us.reshape(len(steps), width)
            experts_max[name] += est.components["experts"].max(axis=1).reshape(len(steps), width)
    layers = len(profile.layers)
    out = []
    for i, s in enumerate(steps):
        row: dict[str, Any] = {
            "dp": dp,
            "tokens_per_rank": s,
            "N": sum(s),
            "balanced_us": float(base.layer_compute_us[i]) * layers,
            "balanced_experts_max_us": float(base.components["experts"][i].max()) * layers,
            "balanced_layer_us": None
            if base.layer_us is None
            else float(base.layer_us[i]) * layers,
        }
        for name in arms:
            row[f"{name}_us"] = float(per_arm[name][i].mean())
            row[f"{name}_us_range"] = [float(per_arm[name][i].min()), float(per_arm[name][i].max())]
            row[f"{name}_experts_max_us"] = float(experts_max[name][i].mean())
        ref = row["captured+tiles_us" if dp == 2 else "captured_us"]
        row["balanced_over_captured"] = row["balanced_us"] / ref - 1.0
        row["balanced_over_captured_table"] = row["balanced_us"] / row["captured+table_us"] - 1.0
        out.append(row)
    return out


def figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    styles = {"normal_routing": "-", "native": "--"}
    colors = {2: "#2b6cb0", 4: "#c05621", 8: "#2f855a"}
    for name, data in result["profiles"].items():
        for ep, rows in data["rank_statistics"].items():
            ns = [r["N"] for r in rows]
            label = f"{PROFILES[name]}, EP{ep}"
            axes[0].plot(
                ns,
                [r["M_max_over_balanced_mean"] for r in rows],
                styles[name],
                color=colors[int(ep)],
                marker="o",
                label=label,
            )
            if ep == "2":  # A over balanced A is the same at every EP (total distinct / E)
                axes[1].plot(
                    ns,
                    [r["A_mean_over_balanced_mean"] for r in rows],
                    styles[name],
                    color="#1a202c",
                    marker="o",
                    label=PROFILES[name],
                )
        for dp, rows in data["estimates"].items():
            axes[2].plot(
                [r["N"] for r in rows],
                [100 * r["balanced_over_captured_table"] for r in rows],
                styles[name],
                color=colors[int(dp)],
                marker="o",
                label=f"{PROFILES[name]}, DP{dp}/EP{dp}",
            )
    axes[0].set_title("busiest rank's M / balanced M (mean over layers, draws)")
    axes[1].set_title("mean rank's A / balanced A (the same at every EP)")
    axes[2].set_title(
        "48-layer MoE compute, balanced over captured - 1 (%)\n"
        "(captured charged at each rank table's load-spread model)"
    )
    axes[2].axhline(0, color="#718096", linewidth=0.8)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("N (rows routed in the step, all DP ranks)")
        ax.grid(alpha=0.3)
    axes[0].axhline(1, color="#718096", linewidth=0.8)
    axes[1].axhline(1, color="#718096", linewidth=0.8)
    axes[1].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=EVIDENCE / "estimate.json")
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "tables": {str(k): str(v.relative_to(ROOT)) for k, v in TABLES.items()},
        "cluster": str(CLUSTER.relative_to(ROOT)),
        "draws": DRAWS,
        "tile_cost_us": TILE_COST_US,
        "profiles": {},
    }
    for name in PROFILES:
        profile = read_profile(EVIDENCE / f"{name}.routing.npz")
        data: dict[str, Any] = {
            "imbalance_max_over_mean": [round(float(v), 3) for v in profile.imbalance()],
            "rank_statistics": {str(ep): rank_statistics(profile, ep) for ep in (2, 4, 8)},
            "estimates": {str(dp): step_estimates(profile, dp) for dp in (2, 4, 8)},
        }
        result["profiles"][name] = data
        print(
            f"{name}: imbalance {min(data['imbalance_max_over_mean']):.2f}-"
            f"{max(data['imbalance_max_over_mean']):.2f}"
        )
        for ep, rows in data["rank_statistics"].items():
            for r in rows:
                print(
                    f"  EP{ep} N={r['N']:5d}: M busiest/balanced {r['M_max_over_balanced_mean']:.3f}"
                    f" (max {r['M_max_over_balanced_max']:.3f}), idlest "
                    f"{r['M_min_over_balanced_mean']:.3f}; A mean/balanced "
                    f"{r['A_mean_over_balanced_mean']:.3f}"
                )
        for dp, rows in data["estimates"].items():
            for r in rows:
                arms = ", ".join(
                    f"{k[:-3]} {r[k]:.0f}"
                    for k in r
                    if k.endswith("_us") and k.startswith("captured")
                )
                print(
                    f"  DP{dp} {r['tokens_per_rank']}: balanced {r['balanced_us']:.0f} us, {arms}"
                    f"; balanced vs captured {r['balanced_over_captured']:+.1%}"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.figure is not None:
        figure(result, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
