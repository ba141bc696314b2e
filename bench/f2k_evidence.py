"""Evidence of the shipped kernel-step bundles (issue 20, items 1 and 6), on CPU.

    PYTHONPATH=. .venv/bin/python bench/f2k_evidence.py [--figures docs/figures]

Prints markdown for `bundles/H200-vllm-modular-f2k` and `bundles/H200-vllm-live-f2k`
(Qwen3-30B-A3B bf16, factor 2 with `--moe-kernel-steps on`): points and B/2B checks per table;
the expert time at the largest N against the two physical bounds; live against modular at the
same (N, A, M); each table against its factor-2 predecessor (`H200-vllm-modular-f2`,
`H200-vllm-live-f2`, measured on another H200) at the points both measured. Draws the expert
surface (measured rows only) with vLLM's configuration switches marked.
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
from bench.loo_surfaces import kernel_steps
from moetables.bundle import Bundle, load_quality, load_table, open_bundle

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
NEW = ("H200-vllm-modular-f2k", "H200-vllm-live-f2k")
BEFORE = {
    "H200-vllm-modular-f2k": "H200-vllm-modular-f2",
    "H200-vllm-live-f2k": "H200-vllm-live-f2",
}


def bundle(name: str) -> Bundle:
    return open_bundle(ROOT / "bundles" / name / MODEL)


def points_and_checks() -> None:
    print("### Points and B/2B checks per table\n")
    print(
        "| bundle | target | rows | expert points | checked | passed | passed at a later "
        "attempt | largest published change | evidence | conservation |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in NEW:
        b = bundle(name)
        for entry in b.entries:
            table = load_table(b.root, entry)
            experts = int((table.component == "experts").sum())
            quality = load_quality(b.root, entry, table)
            traced = len(quality.conservation) if quality.conservation else 0
            print(
                f"| {name} | {entry.target.deployment} | {len(table)} | {experts} | "
                f"{Checks.of(quality.stability).cells()} | stability.csv | "
                f"{traced} traced forwards |"
            )
    print()


def bounds_at_largest_n() -> None:
    print_bounds_table(
        "Expert time at the largest N against the two physical bounds",
        ((name, bundle(name)) for name in NEW),
    )


def live_against_modular() -> None:
    live_b, mod_b = bundle(NEW[1]), bundle(NEW[0])
    live = eager_rows(load_table(live_b.root, live_b.entries[0]))
    entry = next(e for e in mod_b.entries if e.target.dp == 1)
    modular = eager_rows(load_table(mod_b.root, entry))
    print("### Kernel-step tables, TP1: vllm-live against vllm-modular at the same (N, A, M)\n")
    print("| component | points | median live/modular | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for component in ("gate_routing", "experts"):
        print(f"| {component} | {spread_cells(ratios(live, modular, component))} |")
    print()


def against_factor_2() -> None:
    print("### Against the factor-2 tables (another H200) at the points both measured: new / old\n")
    print("| bundle | target | component | points | median | min | max |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in NEW:
        new_b, old_b = bundle(name), bundle(BEFORE[name])
        old = {e.target.deployment: e for e in old_b.entries}
        for entry in new_b.entries:
            new_rows = eager_rows(load_table(new_b.root, entry))
            old_rows = eager_rows(load_table(old_b.root, old[entry.target.deployment]))
            for component in ("gate_routing", "experts"):
                values = ratios(new_rows, old_rows, component)
                if values:
                    print(
                        f"| {name} | {entry.target.deployment} | {component} | "
                        f"{spread_cells(values)} |"
                    )
    print()


def _switches(entry_steps: object, top: int) -> list[int]:
    """N = t + 1 at every switch of the kernel's configuration between t and t + 1."""
    kernel = entry_steps.kernel  # type: ignore[attr-defined]
    return [t + 1 for t in range(1, top) if kernel(t) != kernel(t + 1)]


def figures(out: Path) -> None:
    plt = pyplot(out)
    mod_b = bundle(NEW[0])
    entries = {e.target.deployment: e for e in mod_b.entries}
    by_dp = {d: eager_rows(load_table(mod_b.root, e)) for d, e in entries.items()}

    def per_a(
        table: dict[Key, float], a_values: tuple[int, ...]
    ) -> dict[int, list[tuple[int, float]]]:
        lines: dict[int, list[tuple[int, float]]] = {}
        for (c, n, a, _m), t in sorted(table.items()):
            if c == "experts" and a in a_values:
                lines.setdefault(a, []).append((n, t))
        return lines

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    dp1 = by_dp["dp1_ep1_rank0_sp0"]
    switches = _switches(kernel_steps(entries["dp1_ep1_rank0_sp0"]), 2048)
    for ax, (lo, hi, scale) in zip(
        axes[:2], ((1, 2048, "log"), (128, 1100, "linear")), strict=True
    ):
        for a, pts in per_a(dp1, (8, 16, 32, 64, 128)).items():
            pts = [(n, t) for n, t in pts if lo <= n <= hi]
            ax.plot(*zip(*pts, strict=True), marker="o", ms=2.5, lw=0.9, label=f"A={a}")
        for s in switches:
            if lo <= s <= hi:
                ax.axvline(s - 0.5, color="grey", lw=0.5, ls=":")
        ax.set(
            xscale=scale,
            yscale="log" if scale == "log" else "linear",
            xlabel="N (rows; M = 8N at EP1)",
            ylabel="experts time (us)",
            title=f"TP1/DP1, N {lo}..{hi} (dotted: vLLM config switches)",
        )
        ax.legend(fontsize=7)
    dp2 = by_dp["dp2_ep2_rank0_sp0"]
    for a in (4, 8, 16, 32, 64):
        pts = sorted(
            (m, t) for (c, n, aa, m), t in dp2.items() if c == "experts" and n == 4096 and aa == a
        )
        if pts:
            axes[2].plot(*zip(*pts, strict=True), marker="o", ms=2.5, lw=0.9, label=f"A={a}")
    axes[2].set(
        xscale="log",
        xlabel="M (local token-expert pairs)",
        ylabel="experts time (us)",
        title="TP1/DP2/EP2 rank 0, N=4096 (BLOCK_SIZE_M 128)",
    )
    axes[2].legend(fontsize=7)
    fig.suptitle(
        "H200 vllm-modular, factor 2 with kernel steps: measured expert rows "
        "(Qwen3-30B-A3B bf16, vLLM 0.26.0)"
    )
    save_figure(plt, fig, out / "h200_vllm_modular_f2k_experts.png")


def main() -> None:
    run_with_figures(
        (points_and_checks, bounds_at_largest_n, live_against_modular, against_factor_2), figures
    )


if __name__ == "__main__":
    main()
