"""Evidence of the Qwen1.5-MoE and Mixtral H200 bundles for docs/benchmarks.md (issue 20, items 2, 6).

    PYTHONPATH=. .venv/bin/python bench/models_evidence.py [--figures docs/figures]

Prints markdown, all read from the shipped bundles and the acquisition samples archived beside
them (no device): per table the points and the B/2B pass rate (``stability.csv``); each table's
heaviest expert row at its largest N against the two physical bounds (``moetables.bounds``);
vllm-live against vllm-modular at TP1 at the (N, A, M) points both measured; Qwen1.5-MoE's
wrapper rows (shared expert, its sigmoid gate and the sum) against its routed experts, and what
the traced native forwards of the live build recorded (``launch_ownership``: per-scope time and
the streams of the parent block); Mixtral's DP2 rank 1 points whose B/2B control failed at least once,
forward by forward, from the checkpoint archived beside the modular bundle (the rank was
finished in session 5: which points needed more than one attempt and what was published). Leave-one-out errors
come from ``bench/loo_surfaces.py --bundle`` (one surface code path for every bundle).
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bundle_evidence import (
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

MODELS = ("Qwen/Qwen1.5-MoE-A2.7B", "mistralai/Mixtral-8x7B-Instruct-v0.1")
BACKENDS = ("H200-vllm-modular-f2", "H200-vllm-live-f2")


def bundle(folder: str, model: str) -> Bundle:
    return open_model_bundle(folder, model)


def tables() -> Iterator[ModelTable]:
    """Every table of the two models' bundles: (bundle folder, model, bundle, entry)."""
    return model_tables((folder, model) for model in MODELS for folder in BACKENDS)


def points_and_checks() -> None:
    print_points_and_checks(tables())


def bounds_at_largest_n() -> None:
    print_bounds_at_largest_n(tables())


def live_against_modular() -> None:
    print("### TP1: vllm-live against vllm-modular at the same (N, A, M)\n")
    print("| model | component | points | median live/modular | min | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in MODELS:
        live_b = bundle("H200-vllm-live-f2", model)
        live = eager_rows(load_table(live_b.root, live_b.entries[0]))
        mod_b = bundle("H200-vllm-modular-f2", model)
        entry = next(e for e in mod_b.entries if e.target.dp == 1)
        modular = eager_rows(load_table(mod_b.root, entry))
        for component in ("gate_routing", "experts"):
            cells = spread_cells(ratios(live, modular, component))
            print(f"| {model.split('/')[1]} | {component} | {cells} |")
    print()


def qwen15_wrapper() -> None:
    live_b = bundle("H200-vllm-live-f2", MODELS[0])
    entry = live_b.entries[0]
    live = eager_rows(load_table(live_b.root, entry))
    wrapper = {k[1]: v for k, v in live.items() if k[0] == "wrapper"}
    gate = {k[1]: v for k, v in live.items() if k[0] == "gate_routing"}
    experts: dict[int, float] = {}
    for (c, n, a, _m), t in live.items():
        # balanced full-top-k stimulus at EP1: the heaviest row at N is the one a real batch hits
        if c == "experts" and a > 0 and (n not in experts or t > experts[n]):
            experts[n] = t
    print("### Qwen1.5-MoE live TP1: wrapper rows against the routed experts\n")
    print("| N | gate_routing us | experts us (largest A at N) | wrapper us | wrapper / experts |")
    print("| --- | --- | --- | --- | --- |")
    for n in sorted(wrapper):
        e = experts.get(n)
        cells = (
            f"{e:.1f} | {wrapper[n]:.1f} | {wrapper[n] / e:.2f}"
            if e
            else f"- | {wrapper[n]:.1f} | -"
        )
        print(f"| {n} | {gate.get(n, float('nan')):.1f} | {cells} |")
    print()
    backend: dict[str, Any] = entry.contract["backend"]
    print("Traced native forwards of the live build (`backend.launch_ownership`):\n")
    print(
        "| tokens | native forward us | gate_routing us | experts us | wrapper us | outside us | "
        "wrapper activities | streams of the parent | streams of the experts |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for trace in backend["launch_ownership"]:
        acts = trace["activities"]["wrapper"]
        print(
            f"| {trace['tokens']} | {trace['native_forward_total_us']:.1f} | "
            f"{trace['gate_routing_us']:.1f} | {trace['experts_us']:.1f} | "
            f"{trace['wrapper_us']:.1f} | {trace['outside_scopes_us']:.1f} | "
            f"{sum(acts.values())} | {trace['streams']['parent']} | "
            f"{trace['streams']['experts']} |"
        )
    shared = backend["shared_experts"]
    print(
        f"\n`backend.shared_experts`: measured {shared['measured']}, component "
        f"{shared['component']}; the modular contract: "
        f"{bundle('H200-vllm-modular-f2', MODELS[0]).entries[0].contract['backend']['shared_experts']['measured']}.\n"
    )


def unstable_points() -> None:
    """The Mixtral DP2 rank 1 points whose control failed at least once (the bimodal N=512, A=2
    row among them), from the archived checkpoint: every attempt, and what was published."""
    archive = ROOT / "bundles/H200-vllm-modular-f2" / MODELS[1] / "bf16.acquisition-samples.tar.gz"
    target = "dp2_ep2_rank1_sp0"
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(f"{target}/samples.jsonl"))
        handle = tar.extractfile(member)
        assert handle is not None
        records = [json.loads(line) for line in handle.read().decode().splitlines()]
    controls = [r for r in records if r.get("type") == "control"]
    passed_points = {r["point"] for r in controls if r["passed"]}
    retried = sorted({r["point"] for r in controls if not r["passed"]})
    open_points = [p for p in retried if p not in passed_points]
    print(f"### Mixtral DP2 rank 1: points whose B/2B control failed at least once ({target})\n")
    print(
        f"{len(passed_points)} expert points passed their control; {len(retried)} needed more "
        f"than one attempt; still open: {', '.join(open_points) or 'none'}.\n"
    )
    print(
        "| point | session | attempt | B pooled median us | 2B pooled median us | change | passed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in controls:
        if r["point"] in retried:
            print(
                f"| {r['point']} | {r['session'][:8]} | {r['attempt']} | "
                f"{r['control_pooled_us']:.1f} | {r['selected_pooled_us']:.1f} | "
                f"{r['relative_change']:.1%} | {'yes' if r['passed'] else 'no'} |"
            )
    mod_b = bundle("H200-vllm-modular-f2", MODELS[1])
    published = {
        e.target.rank: eager_rows(load_table(mod_b.root, e))
        for e in mod_b.entries
        if e.target.dp == 2
    }
    print("\nPer-forward times of the N=512, A=2 points (both arms, every attempt):\n")
    print(
        "| point | forwards | below 385 us | range below | range above | mean us | "
        "published rank 1 us | rank 0 us |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    times: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.get("type") == "forward" and str(r.get("point", "")).startswith("experts:512:2:"):
            times[r["point"]].append(r["time_us"])
    for point in sorted(times, key=lambda p: int(p.split(":")[3])):
        v = times[point]
        lo = [x for x in v if x < 385]
        hi = [x for x in v if x >= 385]
        key = ("experts", 512, 2, int(point.split(":")[3]))
        ranks = [published.get(r, {}).get(key) for r in (1, 0)]
        shown = [f"{t:.1f}" if t is not None else "-" for t in ranks]
        print(
            f"| {point} | {len(v)} | {len(lo)} | {span(lo)} | {span(hi)} | "
            f"{sum(v) / len(v):.1f} | {shown[0]} | {shown[1]} |"
        )
    print()


def span(xs: list[float]) -> str:
    return f"{min(xs):.0f}-{max(xs):.0f}" if xs else "-"


def figures(out: Path) -> None:
    plt = pyplot(out)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for ax, model in zip(axes, MODELS, strict=True):
        mod_b = bundle("H200-vllm-modular-f2", model)
        entry = next(e for e in mod_b.entries if e.target.dp == 1)
        modular = eager_rows(load_table(mod_b.root, entry))
        live_b = bundle("H200-vllm-live-f2", model)
        live = eager_rows(load_table(live_b.root, live_b.entries[0]))
        lines: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for (c, n, a, _m), t in sorted(modular.items()):
            if c == "experts" and a > 0:
                lines[a].append((n, t))
        for a, pts in sorted(lines.items()):
            line = ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"A={a}")
            lpts = sorted(
                (n, t) for (c, n, aa, _m), t in live.items() if c == "experts" and aa == a
            )
            if lpts:
                ax.plot(*zip(*lpts, strict=True), ls="--", color=line[0].get_color(), alpha=0.6)
        wrapper = sorted((n, t) for (c, n, _a, _m), t in live.items() if c == "wrapper")
        if wrapper:
            ax.plot(
                *zip(*wrapper, strict=True), color="black", marker="s", ms=3, label="live wrapper"
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="N (rows)",
            ylabel="time (us)",
            title=f"{model.split('/')[1]} TP1/DP1 (solid: vllm-modular, dashed: vllm-live)",
        )
        ax.legend(fontsize=7)
    fig.suptitle("H200, vLLM 0.26.0, grid factor 2: measured expert rows (no interpolation)")
    save_figure(plt, fig, out / "h200_models_f2_experts.png")


def main() -> None:
    run_with_figures(
        (
            points_and_checks,
            bounds_at_largest_n,
            live_against_modular,
            qwen15_wrapper,
            unstable_points,
        ),
        figures,
    )


if __name__ == "__main__":
    main()
