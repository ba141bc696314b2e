"""Figures of the H200 evidence, drawn from the committed bundles only.

    .venv/bin/python bench/figures_h200.py        # writes docs/figures/*.png

Every point plotted is a stored measurement or a lookup answered by `moetables` inside
measured support; refused lookups are simply absent from the lines.
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
sys.path.insert(0, str(ROOT / "bench"))

from lookup_bench import loo_bundle

from moetables.bundle import load_table
from moetables.lookup import ComponentTables

H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
TORCH_REF = ROOT / "bundles/H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
RTX = ROOT / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
OUT = ROOT / "docs/figures"


def _lookup_line(deployment, tokens, active):  # type: ignore[no-untyped-def]
    g = deployment.entry.geometry
    xs, ys = [], []
    for n in tokens:
        m = g.balanced_total(n)
        a = min(active, m, g.local_experts)
        try:
            ys.append(deployment.time_us("experts", n, a, m))
            xs.append(n)
        except (LookupError, ValueError):
            continue
    return xs, ys


def experts_side_by_side() -> None:
    h200 = ComponentTables(H200).deployment(1, 2, 0)
    rtx = ComponentTables(RTX).deployment(1, 2, 0)
    tokens = sorted({round(2 ** (k / 4)) for k in range(0, 49)})
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for active, colour in ((8, "tab:blue"), (32, "tab:orange"), (64, "tab:green")):
        for deployment, style, name in ((h200, "-", "H200"), (rtx, "--", "RTX PRO 6000")):
            xs, ys = _lookup_line(deployment, tokens, active)
            ax.plot(xs, ys, style, color=colour, label=f"{name}, A={active}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N, gathered rows into the expert kernel")
    ax.set_ylabel("experts time (us, eager, summed CUDA activity)")
    ax.set_title(
        "Qwen3-30B-A3B bf16, TP1/DP2/EP2 rank 0: balanced M = ceil(N*k*L/E), A = min(A, M)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "h200_vs_rtxpro6000_experts.png", dpi=120)
    plt.close(fig)


def local_components() -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for path, style, name in (
        (H200, "-", "H200 (vLLM 0.26.0)"),
        (RTX, "--", "RTX PRO 6000 (vLLM 0.28.0)"),
    ):
        deployment = ComponentTables(path).deployment(1, 2, 0)
        table = load_table(path, deployment.entry)
        for component, colour in (("gate_routing", "tab:purple"), ("finalize_copy", "tab:red")):
            rows = table.select(component, "eager")
            order = np.argsort(table.tokens[rows])
            ax.plot(
                table.tokens[rows][order],
                table.time_us[rows][order],
                style,
                marker="o",
                markersize=3,
                color=colour,
                label=f"{component}, {name}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("local rows")
    ax.set_ylabel("time (us, eager)")
    ax.set_title("Local components, TP1/DP2/EP2 rank 0 (measured rows)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "h200_local_components.png", dpi=120)
    plt.close(fig)


def leave_one_out() -> None:
    cases = [
        ("H200 DP2 rank 0", H200, 2, 0),
        ("H200 DP2 rank 1", H200, 2, 1),
        ("RTX PRO 6000 DP2 rank 0", RTX, 2, 0),
    ]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    labels, medians, p95s = [], [], []
    for name, path, dp, rank in cases:
        result = loo_bundle(path, 1, dp, rank)
        for coords in ("raw", "log"):
            labels.append(f"{name}\n{coords}")
            medians.append(100 * result[coords]["median_rel_error"])
            p95s.append(100 * result[coords]["p95_rel_error"])
    x = np.arange(len(labels))
    ax.bar(x - 0.2, medians, 0.4, label="median")
    ax.bar(x + 0.2, p95s, 0.4, label="p95")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("leave-one-out relative error (%)")
    ax.set_title("Expert surface interpolation: raw vs log coordinates (eager rows)")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "expert_surface_leave_one_out.png", dpi=120)
    plt.close(fig)


def torch_reference_against_vllm() -> None:
    """One H200, one target, two expert implementations: where the plain PyTorch loop loses."""
    vllm = ComponentTables(H200).deployment(1, 2, 0)
    torch_ref = ComponentTables(TORCH_REF).deployment(1, 2, 0)
    tokens = sorted({round(2 ** (k / 4)) for k in range(0, 49)})
    expert_bytes = 3 * 2048 * 768 * 2  # gate, up and down projections of one expert, bf16
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for active, colour in ((8, "tab:blue"), (64, "tab:green")):
        for deployment, style, name in (
            (vllm, "-", "vLLM TritonExperts"),
            (torch_ref, "--", "torch-reference"),
        ):
            xs, ys = _lookup_line(deployment, tokens, active)
            ax.plot(xs, ys, style, color=colour, label=f"{name}, A={active}")
        bound = active * expert_bytes / 4.8e12 * 1e6
        ax.axhline(
            bound,
            color=colour,
            linestyle=":",
            linewidth=1,
            label=f"A={active} weights / 4.8 TB/s ({bound:.1f} us)",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N, gathered rows into the expert kernel")
    ax.set_ylabel("experts time (us, eager, summed CUDA activity)")
    ax.set_title(
        "H200, Qwen3-30B-A3B bf16, TP1/DP2/EP2 rank 0: balanced M, A = min(A, M)", fontsize=10
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "h200_torch_reference_vs_vllm_experts.png", dpi=120)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    torch_reference_against_vllm()
    experts_side_by_side()
    local_components()
    leave_one_out()
    print("\n".join(str(p.relative_to(ROOT)) for p in sorted(OUT.glob("*.png"))))


if __name__ == "__main__":
    main()
