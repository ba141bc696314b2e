"""Evidence of the session-12 H200 bundles of Qwen3-235B-A22B, DeepSeek-V2-Lite and OLMoE.

    PYTHONPATH=. .venv/bin/python bench/catalog_models_evidence.py [--figures docs/figures]

Prints markdown, all read from the shipped bundles (no device): per table the rows and B/2B
controls and the heaviest expert row at the largest N against the two physical bounds (the
same sections as ``bench/models_evidence.py``); OLMoE's vllm-live table against its
vllm-modular table at the points both measured; DeepSeek-V2-Lite's gate_routing, timed with
vLLM's GroupedTopKRouter (what DeepseekV2MoE builds), against OLMoE's plain fused top-k at
the same gate GEMM (2,048 -> 64 logits); and how far apart Qwen3-235B-A22B's eight DP8/EP8
rank tables are at the points they share.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bundle_evidence import (
    Key,
    ModelTable,
    eager_rows,
    model_tables,
    open_model_bundle,
    print_bounds_at_largest_n,
    print_points_and_checks,
    pyplot,
    ratios,
    run_with_figures,
    save_figure,
    spread_cells,
)
from moetables.bundle import Bundle, load_table

Q235 = "Qwen/Qwen3-235B-A22B"
DSV2 = "deepseek-ai/DeepSeek-V2-Lite"
OLMOE = "allenai/OLMoE-1B-7B-0924"
# (bundle folder, model): every table measured in session 12.
SHIPPED = (
    ("H200-vllm-modular-f2k4", Q235),
    ("H200-vllm-modular-dp8-f4", Q235),
    ("H200-vllm-modular-f2k4", DSV2),
    ("H200-vllm-modular-dp2-f4", DSV2),
    ("H200-vllm-modular-f2k4", OLMOE),
    ("H200-vllm-live-f2k4", OLMOE),
    ("H200-vllm-modular-dp2-f4", OLMOE),
    ("H200-vllm-modular-dp4-f4", Q235),
)


def bundle(folder: str, model: str) -> Bundle:
    return open_model_bundle(folder, model)


def tables() -> Iterator[ModelTable]:
    return model_tables(SHIPPED)


def dp1_rows(folder: str, model: str) -> dict[Key, float]:
    b = bundle(folder, model)
    entry = next(e for e in b.entries if e.target.dp == 1)
    return eager_rows(load_table(b.root, entry))


def points_and_checks() -> None:
    print_points_and_checks(tables())


def bounds_at_largest_n() -> None:
    print_bounds_at_largest_n(tables())


def olmoe_live_against_modular() -> None:
    live = dp1_rows("H200-vllm-live-f2k4", OLMOE)
    modular = dp1_rows("H200-vllm-modular-f2k4", OLMOE)
    print("### OLMoE TP1: vllm-live against vllm-modular at the same (N, A, M)\n")
    print("| component | points | median live/modular | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for component in ("gate_routing", "experts"):
        print(f"| {component} | {spread_cells(ratios(live, modular, component))} |")
    print()


def router_rows() -> tuple[dict[int, float], dict[int, float]]:
    """gate_routing by N: DeepSeek-V2-Lite (grouped router), OLMoE (plain fused top-k)."""

    def by_n(rows: dict[Key, float]) -> dict[int, float]:
        return {k[1]: t for k, t in rows.items() if k[0] == "gate_routing"}

    return (
        by_n(dp1_rows("H200-vllm-modular-f2k4", DSV2)),
        by_n(dp1_rows("H200-vllm-modular-f2k4", OLMOE)),
    )


def grouped_router() -> None:
    grouped, plain = router_rows()
    print("### gate_routing: DeepSeek-V2-Lite's grouped router against a plain top-k\n")
    print(
        "Both gates are the same GEMM (hidden 2,048 -> 64 logits, bf16); DeepSeek-V2-Lite's "
        "router is vLLM's GroupedTopKRouter (one group: the unfused grouped path), OLMoE's the "
        "fused top-k (top-8).\n"
    )
    print("| N | DeepSeek-V2-Lite us | OLMoE us | grouped / plain |")
    print("| ---: | ---: | ---: | ---: |")
    shared = sorted(set(grouped) & set(plain))
    for n in shared:
        print(f"| {n} | {grouped[n]:.2f} | {plain[n]:.2f} | {grouped[n] / plain[n]:.2f} |")
    values = [grouped[n] / plain[n] for n in shared]
    print(f"\nMedian grouped / plain over {len(values)} N: {statistics.median(values):.2f}.\n")


def q235_ranks() -> None:
    b = bundle("H200-vllm-modular-dp8-f4", Q235)
    rows = {e.target.rank: eager_rows(load_table(b.root, e)) for e in b.entries}
    shared = set.intersection(*(set(r) for r in rows.values()))
    spread: dict[str, list[float]] = defaultdict(list)
    for key in shared:
        times = [rows[rank][key] for rank in rows]
        spread[key[0]].append(max(times) / min(times) - 1)
    print("### Qwen3-235B-A22B DP8/EP8: the eight rank tables at their shared points\n")
    print("| component | shared points | median slowest/fastest - 1 | p95 | max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for component, values in sorted(spread.items()):
        values.sort()
        p95 = values[int(0.95 * (len(values) - 1))]
        print(
            f"| {component} | {len(values)} | {statistics.median(values):.2%} | {p95:.2%} | "
            f"{values[-1]:.2%} |"
        )
    print()


def figures(out: Path) -> None:
    plt = pyplot(out)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    grouped, plain = router_rows()
    for rows, label in (
        (grouped, "DeepSeek-V2-Lite (GroupedTopKRouter)"),
        (plain, "OLMoE (fused top-k)"),
    ):
        left.plot(*zip(*sorted(rows.items()), strict=True), marker="o", ms=3, label=label)
    left.set(
        xscale="log",
        xlabel="N (rows)",
        ylabel="gate_routing (us)",
        title="Same gate GEMM, two routers",
    )
    left.legend(fontsize=7)
    for folder, model in (
        ("H200-vllm-modular-f2k4", Q235),
        ("H200-vllm-modular-f2k4", DSV2),
        ("H200-vllm-modular-f2k4", OLMOE),
    ):
        rows = dp1_rows(folder, model)
        # balanced full-top-k rows: the heaviest A at each N, what a real batch is near
        heaviest: dict[int, float] = {}
        for (component, n, a, _m), t in rows.items():
            if component == "experts" and a > 0 and t > heaviest.get(n, 0.0):
                heaviest[n] = t
        right.plot(
            *zip(*sorted(heaviest.items()), strict=True), marker=".", label=model.split("/")[1]
        )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="N (rows)",
        ylabel="experts (us), heaviest A at N",
        title="TP1/DP1 expert kernels (vllm-modular, rule v4)",
    )
    right.legend(fontsize=7)
    fig.suptitle("H200, vLLM 0.26.0, session 12: measured rows (no interpolation)")
    save_figure(plt, fig, out / "h200_catalog_models.png")


def main() -> None:
    run_with_figures(
        (
            points_and_checks,
            bounds_at_largest_n,
            olmoe_live_against_modular,
            grouped_router,
            q235_ranks,
        ),
        figures,
    )


if __name__ == "__main__":
    main()
