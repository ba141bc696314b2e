"""Evidence of the shipped H200 FP8 bundles for docs/benchmarks.md (issue 20, items 4 and 6), on CPU.

    PYTHONPATH=. .venv/bin/python bench/fp8_evidence.py [--figures docs/figures]

Prints markdown for ``bundles/H200-vllm-modular-fp8-f2`` and ``bundles/H200-vllm-live-fp8-f2``
(Qwen3-30B-A3B-Instruct-2507-FP8, block-wise FP8): per table the points and the B/2B pass rate
(``stability.csv``); the plain leave-one-out error of each expert surface (raw coordinates, the
lookups' own locator: ``bench/loo_surfaces.py``; the kernel-aware variant is left out because its
tile rule is the bf16 one); the expert time at the largest N against the two physical bounds
(FP8 weight bytes plus scales at peak bandwidth, gated-MLP FLOPs at the dense FP8 rate); live
against modular at TP1; FP8 against the bf16 factor-2 tables (``bundles/H200-vllm-modular-f2``)
at the (component, N, A, M) points both measured. ``--figures`` draws the FP8 expert surface.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from loo_surfaces import leave_one_out

from bench.bundle_evidence import (
    Checks,
    Key,
    eager_rows,
    print_bounds_table,
    pyplot,
    ratios,
    run_with_figures,
    save_figure,
    spread_cells,
)
from moetables.bundle import Bundle, load_quality, load_table, open_bundle

FP8 = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
BF16 = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
MODULAR = "H200-vllm-modular-fp8-f2"
LIVE = "H200-vllm-live-fp8-f2"


def fp8_bundle(name: str) -> Bundle:
    return open_bundle(ROOT / "bundles" / name / FP8)


def tables(b: Bundle) -> dict[str, dict[Key, float]]:
    return {e.target.deployment: eager_rows(load_table(b.root, e)) for e in b.entries}


def points_checks_and_loo() -> None:
    print("### Points, B/2B checks and leave-one-out per FP8 table\n")
    print(
        "| bundle | target | rows | expert points | B/2B checked | passed | passed at a later "
        "attempt | largest published change | LOO answered | LOO median | LOO p95 | LOO max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in (MODULAR, LIVE):
        b = fp8_bundle(name)
        for entry in b.entries:
            table = load_table(b.root, entry)
            experts = int((table.component == "experts").sum())
            checks = Checks.of(load_quality(b.root, entry, table).stability or ())
            loo = leave_one_out(b, entry)
            print(
                f"| {name} | {entry.target.deployment} | {len(table)} | {experts} | "
                f"{checks.cells()} | {loo.answered} | "
                f"{loo.quantile(50):.1%} | {loo.quantile(95):.1%} | {loo.quantile(100):.1%} |"
            )
    print()


def bounds_at_largest_n() -> None:
    print_bounds_table(
        "FP8 expert time at the largest N against the two physical bounds",
        ((name, fp8_bundle(name)) for name in (MODULAR, LIVE)),
    )


def ratio_rows(title: str, num: dict[Key, float], den: dict[Key, float]) -> None:
    for component in sorted({k[0] for k in set(num) & set(den)}):
        print(f"| {title} | {component} | {spread_cells(ratios(num, den, component))} |")


def comparisons() -> None:
    fp8 = tables(fp8_bundle(MODULAR))
    live = tables(fp8_bundle(LIVE))["dp1_ep1_rank0_sp0"]
    bf16 = tables(open_bundle(ROOT / "bundles" / "H200-vllm-modular-f2" / BF16))
    bf16_live_b = open_bundle(ROOT / "bundles" / "H200-vllm-live-f2" / BF16)
    bf16_live = eager_rows(load_table(bf16_live_b.root, bf16_live_b.entries[0]))
    print("### FP8: live against modular (TP1), and FP8 against bf16 at the same points\n")
    print("| ratio (target) | component | common points | median | min | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratio_rows("FP8 live / FP8 modular (DP1)", live, fp8["dp1_ep1_rank0_sp0"])
    for target in sorted(fp8):
        ratio_rows(f"FP8 / bf16 modular ({target})", fp8[target], bf16[target])
    ratio_rows("FP8 / bf16 live (DP1)", live, bf16_live)
    print()
    print("FP8 / bf16 modular experts time at the largest N, per A (DP1 and DP2 rank 0):\n")
    print("| target | N | A | M | FP8 us | bf16 us | FP8 / bf16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for target in ("dp1_ep1_rank0_sp0", "dp2_ep2_rank0_sp0"):
        common = [k for k in set(fp8[target]) & set(bf16[target]) if k[0] == "experts"]
        top = max(k[1] for k in common)
        for a in sorted({k[2] for k in common if k[1] == top}):
            key = max((k for k in common if k[1] == top and k[2] == a), key=lambda k: k[3])
            f, b = fp8[target][key], bf16[target][key]
            print(f"| {target} | {key[1]} | {a} | {key[3]} | {f:.1f} | {b:.1f} | {f / b:.2f} |")
    print()


def figures(out: Path) -> None:
    """FP8 against bf16 expert time over N per A, measured rows only (no interpolation)."""
    plt = pyplot(out)
    fp8 = tables(fp8_bundle(MODULAR))
    bf16 = tables(open_bundle(ROOT / "bundles" / "H200-vllm-modular-f2" / BF16))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, target, title in (
        (axes[0], "dp1_ep1_rank0_sp0", "TP1/DP1 (128 local experts), M = 8N"),
        (axes[1], "dp2_ep2_rank0_sp0", "TP1/DP2/EP2 rank 0 (64 local), largest M per N"),
    ):
        for i, a in enumerate((1, 8, 32, 64, 128)):
            for table, style, label in ((fp8, "-", "FP8"), (bf16, "--", "bf16")):
                best: dict[int, tuple[int, float]] = {}
                for (c, n, aa, m), t in table[target].items():
                    if c == "experts" and aa == a and m >= best.get(n, (-1, 0.0))[0]:
                        best[n] = (m, t)
                pts = sorted((n, t) for n, (_m, t) in best.items())
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        ls=style,
                        color=f"C{i}",  # one colour per A: FP8 and bf16 side by side
                        marker="o" if label == "FP8" else None,
                        ms=3,
                        label=f"{label} A={a}",
                    )
        ax.set(xscale="log", yscale="log", xlabel="N (rows)", ylabel="experts time (us)")
        ax.set_title(title)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(
        "H200 vllm-modular, grid factor 2: Qwen3-30B-A3B FP8 (block 128x128, TritonExperts) "
        "solid, bf16 dashed; measured rows only"
    )
    save_figure(plt, fig, out / "h200_vllm_modular_fp8_f2_experts.png")


def main() -> None:
    run_with_figures((points_checks_and_loo, bounds_at_largest_n, comparisons), figures)


if __name__ == "__main__":
    main()
