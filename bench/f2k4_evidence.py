"""Evidence of the rule-v4 kernel-step bundles (issue 20, items 1 and 6), on CPU.

    PYTHONPATH=. .venv/bin/python bench/f2k4_evidence.py [--figures docs/figures]

The sections of `bench/f2k_evidence.py` for `bundles/H200-vllm-modular-f2k4` and
`bundles/H200-vllm-live-f2k4` (TP1/DP1, `--moe-kernel-steps v4`): points and B/2B checks, the
expert time at the largest N against the two physical bounds, live against modular, and each
table against its rule-v2 predecessor (`-f2k`, another H200) at the points both measured. The
figure is the one rule v4 is about: the expert time along A at fixed N on vLLM's 16-row blocks,
where v2 measured five A and v4 measures the sawtooth's corners.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import f2k_evidence as base
from bench.bundle_evidence import eager_rows, pyplot, run_with_figures, save_figure
from moetables.bundle import load_table

base.NEW = ("H200-vllm-modular-f2k4", "H200-vllm-live-f2k4")
base.BEFORE = {
    "H200-vllm-modular-f2k4": "H200-vllm-modular-f2k",
    "H200-vllm-live-f2k4": "H200-vllm-live-f2k",
}
ROWS = (16, 32, 49, 68, 113, 161)  # N on 16-row blocks, where v4 adds A


def figures(out: Path) -> None:
    plt = pyplot(out)
    fig, axes = plt.subplots(2, 3, figsize=(16, 8), sharey=False)
    for name, style in (("H200-vllm-modular-f2k4", "o-"), ("H200-vllm-modular-f2k", "s")):
        b = base.bundle(name)
        entry = next(e for e in b.entries if e.target.deployment == "dp1_ep1_rank0_sp0")
        table = eager_rows(load_table(b.root, entry))
        for ax, n in zip(axes.flat, ROWS, strict=True):
            pts = sorted(
                (a, t) for (c, nn, a, _m), t in table.items() if c == "experts" and nn == n
            )
            if not pts:
                continue
            label = "v4 (f2k4)" if name.endswith("f2k4") else "v2 (f2k)"
            ax.plot(*zip(*pts, strict=True), style, ms=3, lw=0.8, label=label)
            ax.set(
                xlabel="A (active experts)",
                ylabel="experts time (us)",
                title=f"N = {n}, M = {8 * n}",
            )
    for ax in axes.flat:
        ax.legend(fontsize=7)
    fig.suptitle(
        "H200 vllm-modular TP1/DP1, Qwen3-30B-A3B bf16: expert time along A at 16-row blocks, "
        "rule v4 against v2 (different H200s)"
    )
    save_figure(plt, fig, out / "h200_vllm_modular_f2k4_along_a.png")


def main() -> None:
    run_with_figures(
        (
            base.points_and_checks,
            base.bounds_at_largest_n,
            base.live_against_modular,
            base.against_factor_2,
        ),
        figures,
    )


if __name__ == "__main__":
    main()
