"""Evidence of the shipped H200 bundles for docs/benchmarks.md (issue 20, item 6), on CPU.

    PYTHONPATH=. .venv/bin/python bench/f2_evidence.py [--figures docs/figures]

Prints markdown: per bundle and target, the points and the B/2B pass rate (from
``stability.csv`` where the bundle carries it, else from the coverage's conditioning summary);
every shipped table's expert time at its largest N against the two physical bounds of
``moetables.bounds`` (weight bytes at peak bandwidth, gated-MLP FLOPs at the dense tensor-core
peak); the live table against the modular one at the (N, A, M) points both measured. Draws one
figure of the expert surface per factor-2 vLLM bundle (measured rows only, no interpolation).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
H200_BUNDLES = (
    "H200",
    "H200-vllm-live",
    "H200-vllm-modular-f2",
    "H200-vllm-live-f2",
    "H200-torch-reference",
)


def bundle(name: str) -> Bundle:
    return open_bundle(ROOT / "bundles" / name / MODEL)


def points_and_checks() -> None:
    print("### Points and B/2B checks per table\n")
    print(
        "| bundle | target | expert points | checked | passed | passed at a later attempt | "
        "largest published change | evidence |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in (*H200_BUNDLES, "llmservingsim-rtxpro6000"):
        b = open_bundle(ROOT / "bundles" / name / MODEL)
        for entry in b.entries:
            table = load_table(b.root, entry)
            experts = int((table.component == "experts").sum())
            quality = load_quality(b.root, entry, table)
            if quality.stability:
                source = "stability.csv" if quality.source == "files" else "coverage.json controls"
                cells = f"{Checks.of(quality.stability).cells()} | {source}"
            else:
                summary = entry.coverage.get("conditioning_summary", {})
                checked, failed = summary.get("checked_points"), summary.get("failed_points")
                change = summary.get("max_relative_change")
                cells = (
                    f"{checked} | {checked - failed} | not recorded | {change:.1%} | "
                    "coverage summary (format 1: no stability.csv)"
                )
            print(f"| {name} | {entry.target.deployment} | {experts} | {cells} |")
    print()


def bounds_at_largest_n() -> None:
    print_bounds_table(
        "Expert time at the largest N against the two physical bounds",
        ((name, bundle(name)) for name in (*H200_BUNDLES, "llmservingsim-rtxpro6000")),
    )


def live_against_modular() -> None:
    live = eager_rows(
        load_table(bundle("H200-vllm-live-f2").root, bundle("H200-vllm-live-f2").entries[0])
    )
    mod_b = bundle("H200-vllm-modular-f2")
    entry = next(e for e in mod_b.entries if e.target.dp == 1)
    modular = eager_rows(load_table(mod_b.root, entry))
    print("### Factor 2, TP1: vllm-live against vllm-modular at the same (N, A, M)\n")
    print("| component | points | median live/modular | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for component in ("gate_routing", "experts"):
        print(f"| {component} | {spread_cells(ratios(live, modular, component))} |")
    print()


def figures(out: Path) -> None:
    plt = pyplot(out)
    mod_b = bundle("H200-vllm-modular-f2")
    by_dp = {e.target.deployment: eager_rows(load_table(mod_b.root, e)) for e in mod_b.entries}
    live_b = bundle("H200-vllm-live-f2")
    live = eager_rows(load_table(live_b.root, live_b.entries[0]))

    def per_a(table: dict[Key, float]) -> dict[int, list[tuple[int, float]]]:
        lines: dict[int, list[tuple[int, float]]] = {}
        for (c, n, a, _m), t in sorted(table.items()):
            if c == "experts" and a > 0:
                lines.setdefault(a, []).append((n, t))
        return lines

    # vllm-modular f2: DP1 over N per A; DP2 rank 0 over M at N = 514 and 4096 per A.
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for a, pts in per_a(by_dp["dp1_ep1_rank0_sp0"]).items():
        axes[0].plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"A={a}")
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="N (rows; M = 8N at EP1)",
        ylabel="experts time (us)",
        title="TP1/DP1 (128 local experts)",
    )
    axes[0].legend(fontsize=7)
    dp2 = by_dp["dp2_ep2_rank0_sp0"]
    for ax, n in ((axes[1], 514), (axes[2], 4096)):
        for a in (1, 4, 8, 16, 32, 64):
            pts = sorted(
                (m, t)
                for (c, nn, aa, m), t in dp2.items()
                if c == "experts" and nn == n and aa == a
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"A={a}")
        ax.set(
            xscale="log",
            xlabel="M (local token-expert pairs)",
            ylabel="experts time (us)",
            title=f"TP1/DP2/EP2 rank 0, N={n} (BLOCK_SIZE_M 128)",
        )
        ax.legend(fontsize=7)
    fig.suptitle(
        "H200 vllm-modular, grid factor 2: measured expert rows (Qwen3-30B-A3B bf16, vLLM 0.26.0)"
    )
    save_figure(plt, fig, out / "h200_vllm_modular_f2_experts.png")

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    modular_lines = per_a(by_dp["dp1_ep1_rank0_sp0"])
    for a, pts in per_a(live).items():
        line = ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"live A={a}")
        if a in modular_lines:
            ax.plot(
                *zip(*modular_lines[a], strict=True),
                ls="--",
                color=line[0].get_color(),
                alpha=0.6,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="N (rows; M = 8N at EP1)",
        ylabel="experts time (us)",
        title="H200 vllm-live TP1, grid factor 2 (dashed: vllm-modular f2)",
    )
    ax.legend(fontsize=7)
    save_figure(plt, fig, out / "h200_vllm_live_f2_experts.png")


def main() -> None:
    run_with_figures((points_and_checks, bounds_at_largest_n, live_against_modular), figures)


if __name__ == "__main__":
    main()
