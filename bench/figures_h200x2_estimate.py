"""Figures of the two-H200 layer-estimate evidence (issue 11 parts 3 and 5), from committed files only.

    PYTHONPATH=. .venv/bin/python bench/figures_h200x2_estimate.py
        # writes docs/figures/h200x2_nccl_sweep.png and docs/figures/h200x2_estimate_validation.png

The sweep figure plots every measured size (last-arriving rank's kernel, median over iterations),
the shipped model of clusters/h200x2-nvlink.yaml (alpha and the bandwidth-by-size table), the
straight alpha-beta line it replaces, and the table's leave-one-out error; the validation figure
plots measured against estimated per-rank compute (shipped factor-8 tables and the factor-2 ones)
and per-step transfer (medians over the repetitions), recomputed from the raw rank files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from acquisition.estimate_validation import per_step, run
from moetables.calibration import OPS, bus_factor, fit_sweep, load_sweep
from moetables.comm import load_cluster

EVIDENCE = ROOT / "docs/evidence/h200x2-estimate"
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"
BUNDLE = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
F2 = ROOT / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
OUT = ROOT / "docs/figures"


def sweep_figure() -> Path:
    sweep = load_sweep(EVIDENCE / "nccl_sweep.json")
    cluster = load_cluster(CLUSTER)
    fits = fit_sweep(sweep)
    fig, axes = plt.subplots(
        2, 5, figsize=(19, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
    )
    for j, op in enumerate(OPS):
        pts = sweep.of(op)
        x = np.array([p.bytes_per_rank for p in pts], dtype=float)
        meas = np.array([p.time_us for p in pts])
        each = [np.array(p.iteration_times_us) for p in pts]
        params = cluster.link_classes["nvlink"].collectives[op]
        # the shipped file's (rounded) parameters, not the in-memory fit
        line = np.array(
            [
                params.alpha_us
                + bus_factor(op, sweep.ranks) * p.size_bytes / (params.bus_bandwidth_GBps * 1e3)
                for p in pts
            ]
        )
        model = np.array([float(params.time_us(op, sweep.ranks, p.size_bytes)) for p in pts])
        loo = {b: (m - t) / t for b, t, m in fits[op].loo_residuals}
        ax = axes[0, j]
        for xi, e in zip(x, each, strict=True):
            ax.scatter(np.full(e.shape, xi), e, s=4, color="0.7", zorder=1)
        ax.plot(x, meas, "o", color="C0", ms=4, label="measured (median, last arriver)", zorder=3)
        ax.plot(
            x,
            line,
            ":",
            color="0.4",
            label=f"line: alpha {params.alpha_us:.2f} us, bus {params.bus_bandwidth_GBps:.0f} GB/s",
        )
        ax.plot(x, model, "-", color="C3", label="shipped: alpha + bandwidth by size")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3, which="both")
        axes[1, j].plot(x, 100 * (line - meas) / meas, "o:", color="0.4", ms=3, label="line")
        lx = np.array(sorted(loo))
        axes[1, j].plot(
            lx, [100 * loo[b] for b in lx], "s-", color="C3", ms=3, label="table, leave-one-out"
        )
        axes[1, j].legend(fontsize=6)
        axes[1, j].axhline(0, color="k", lw=0.6)
        axes[1, j].axhspan(-25, 25, color="C2", alpha=0.08)
        axes[1, j].set_xlabel("bytes per rank")
        axes[1, j].grid(alpha=0.3)
    axes[0, 0].set_ylabel("kernel time (us)")
    axes[1, 0].set_ylabel("model error (%)")
    fig.suptitle(
        "NCCL on two H200s (NVLink, NCCL 2.28.9, bf16): measured vs the calibrated model (alpha from <= 64 KiB/rank, "
        "bus bandwidth by size in log2(S)) and the straight line (bandwidth from >= 32 MiB/rank)",
        fontsize=10,
    )
    fig.tight_layout()
    path = OUT / "h200x2_nccl_sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def validation_figure() -> Path:
    result = run(EVIDENCE, str(BUNDLE), str(CLUSTER))
    steps = per_step(result["forwards"])
    f2 = [
        s
        for s in per_step(run(EVIDENCE, str(F2), str(CLUSTER))["forwards"])
        if s["policy"] == "histogram"
    ]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    styles = {
        ("simulator", "histogram"): ("C0", "o"),
        ("simulator", "balanced"): ("C1", "x"),
        ("native", "histogram"): ("C2", "s"),
    }
    for key, (color, marker) in styles.items():
        ss = [s for s in steps if (s["routing"], s["policy"]) == key]
        m = np.array([s["compute_measured_us"] for s in ss])
        e = np.array([s["compute_estimate_us"] for s in ss])
        axes[0].scatter(
            m, 100 * (e - m) / m, color=color, marker=marker, s=22, label=f"{key[0]} / {key[1]}"
        )
        n = np.array([sum(s["tokens"]) for s in ss])
        axes[1].scatter(
            n, 100 * (e - m) / m, color=color, marker=marker, s=22, label=f"{key[0]} / {key[1]}"
        )
        r0 = [s for s in ss if s["rank"] == 0]
        tm = np.array([s["transfer_measured_us"] for s in r0])
        te = np.array([s["transfer_estimate_us"] for s in r0])
        axes[2].scatter(tm, te, color=color, marker=marker, s=26, label=f"{key[0]} / {key[1]}")
    for routing, color in (("simulator", "C4"), ("native", "C5")):
        ss = [s for s in f2 if s["routing"] == routing]
        m = np.array([s["compute_measured_us"] for s in ss])
        e = np.array([s["compute_estimate_us"] for s in ss])
        n = np.array([sum(s["tokens"]) for s in ss])
        axes[1].scatter(
            n * 1.04,
            100 * (e - m) / m,
            color=color,
            marker="^",
            s=22,
            label=f"{routing} / histogram, factor-2 tables",
        )
    for ax in axes[:2]:
        ax.axhspan(-3, 3, color="C2", alpha=0.12, label="+-3 % (median goal)")
        ax.axhline(8, color="C3", lw=0.8, ls="--", label="+-8 % (max goal)")
        ax.axhline(-8, color="C3", lw=0.8, ls="--")
        ax.set_ylabel("compute: estimate vs measured (%)")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("measured per-rank compute (us): MoE block kernels minus NCCL")
    axes[1].set_xlabel("gathered rows N (sum of the ranks' tokens)")
    axes[1].axvspan(514, 4096, color="0.5", alpha=0.08)
    axes[1].text(
        600,
        axes[1].get_ylim()[1] * 0.85,
        "factor 8: no table point between N = 514 and 4096",
        fontsize=8,
    )
    axes[1].legend(fontsize=6, loc="lower left")
    axes[1].set_xscale("log", base=2)
    axes[0].legend(fontsize=7)
    lim = [0, 120]
    axes[2].plot(lim, lim, "k-", lw=0.6)
    axes[2].fill_between(
        lim, [0.75 * v for v in lim], [1.25 * v for v in lim], color="C2", alpha=0.1, label="+-25 %"
    )
    axes[2].set_xlim(lim)
    axes[2].set_ylim(lim)
    axes[2].set_xlabel(
        "measured transfer (us): per NCCL kernel the last arriver's duration, summed"
    )
    axes[2].set_ylabel("estimated transfer (us)")
    axes[2].legend(fontsize=7)
    axes[2].grid(alpha=0.3)
    fig.suptitle(
        "DP2/EP2 vLLM 0.26.0 engine on two H200s (one-layer Qwen3-30B-A3B, eager) vs the layer estimate from "
        "the shipped H200 bundle and clusters/h200x2-nvlink.yaml (medians over 3 repetitions)",
        fontsize=10,
    )
    fig.tight_layout()
    path = OUT / "h200x2_estimate_validation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    print(sweep_figure())
    print(validation_figure())
