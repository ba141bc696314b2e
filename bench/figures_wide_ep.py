"""Figure of the wide-EP H200 bundles (issue 20, item 3), drawn from the committed files only.

    PYTHONPATH=. .venv/bin/python bench/figures_wide_ep.py   # docs/figures/h200_wide_ep_ranks.png

Left: rank 0's expert time along the balanced line (M = the balanced pairs of N, A = min(L, M))
at DP4 (L = 32) and DP8 (L = 16), measured rows only. Middle and right: each rank's expert rows
over rank 0's at the same (N, A, M), median per N, for DP4 and DP8; the DP8 panel also shows
rank 7's rows measured by the resumed process (a fresh process, docs/h200-runs.md).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from wide_ep_evidence import BUNDLES, rank_rows, resumed_keys

from moetables.lookup import ComponentTables

OUT = ROOT / "docs/figures/h200_wide_ep_ranks.png"


def main() -> None:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    for dp, bundle in BUNDLES.items():
        g = ComponentTables(bundle).deployment(1, dp, 0).entry.geometry
        rows = rank_rows(bundle, dp, 0)
        line = sorted(
            (k[2], t)
            for k, t in rows.items()
            if k[0] == "experts"
            and k[4] == g.balanced_total(k[2])
            and k[3] == min(g.local_experts, k[4])
        )
        ax.plot([n for n, _ in line], [t for _, t in line], "o-", ms=3, label=f"DP{dp} rank 0")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N (gathered rows)")
    ax.set_ylabel("experts time, us (measured rows)")
    ax.set_title("Balanced expert rows, rank 0")
    ax.legend()
    late = resumed_keys(BUNDLES[8]).get(7, set())
    for ax, dp in zip(axes[1:], (4, 8), strict=True):
        bundle = BUNDLES[dp]
        base = rank_rows(bundle, dp, 0)
        cmap = plt.get_cmap("viridis")
        for rank in range(1, dp):
            other = rank_rows(bundle, dp, rank)
            by_n: dict[int, list[float]] = {}
            for k, t in base.items():
                if k[0] == "experts" and k[3] > 0 and not (rank == 7 and k in late):
                    by_n.setdefault(k[2], []).append(other[k] / t - 1)
            xs = sorted(by_n)
            ys = [100 * statistics.median(by_n[n]) for n in xs]
            ax.plot(xs, ys, "-", color=cmap(rank / dp), label=f"rank {rank}")
        if dp == 8 and late:
            other = rank_rows(bundle, dp, 7)
            xs = [k[2] for k in late]
            ys = [100 * (other[k] / base[k] - 1) for k in late]
            ax.plot(xs, ys, "x", color="crimson", label="rank 7, resumed process")
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhspan(-3, 3, color="grey", alpha=0.15, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (gathered rows)")
        ax.set_ylabel("rank / rank 0 - 1, % (median over A, M)")
        ax.set_title(f"TP1/DP{dp}/EP{dp}: expert rows against rank 0 (band: 3 %)")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
