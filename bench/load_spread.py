"""Does the expert kernel's row-tile count explain the estimate's compute error? (issue 18, part 2)

Reads the DP2/EP2 validation evidence (per MoE block forward and rank: the measured compute, the
captured per-expert counts) and the estimate's comparison files (the `histogram` policy's
compute estimate of the same forward from the factor-8 and factor-2 H200 tables), computes with
`moetables.tiles` the block size vLLM 0.26.0 chose (64 local experts: no tuned H200 file, so
vLLM's default config on the gathered rows) and the row tiles the kernel ran, and fits the
compute residual (measured - estimate) against the extra tiles over the balanced tiles the table
embodies at the step's (N, A, M) (`DeploymentTables.balanced_tiles`: the stimulus' tiles at the
table's own points, interpolated exactly as the time is): residual = c * extra_tiles. `c` is fitted on one routing mode
and used to predict the other (simulator -> native and back), and leaving one step out.

    PYTHONPATH=. .venv/bin/python bench/load_spread.py docs/evidence/h200x2-estimate \
        --figure docs/figures/load_spread_tiles.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from acquisition.estimate_validation import load_forwards
from moetables.tiles import MODEL_BLOCK_M, block_size_m, row_tiles

WIDTH = 768  # Qwen3-30B-A3B expert width (w2's last dimension at TP1)
COMPARISONS = {"factor 8": "comparison.json", "factor 2": "comparison-f2.json"}
BUNDLES = {"factor 8": "bundles/H200", "factor 2": "bundles/H200-vllm-modular-f2"}


def rows_of(evidence: Path, comparison: str, bundle: str) -> list[dict[str, Any]]:
    cmp = json.loads((evidence / comparison).read_text())
    est = {
        (f["routing"], f["rep"], f["step"], f["rank"]): f
        for f in cmp["forwards"]
        if f["policy"] == "histogram"
    }
    from moetables.lookup.tables import ComponentTables

    tables = ComponentTables(str(Path(bundle) / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"))
    ranks_tables = [tables.deployment(1, 2, r) for r in range(2)]
    out = []
    for routing in ("simulator", "native"):
        forwards, ranks = load_forwards(evidence, routing)
        for f in forwards:
            g = f.global_counts
            for r, rank in enumerate(ranks):
                emap = rank["moe"][0]["expert_map"]
                local = np.array([g[i] for i, m in enumerate(emap) if m >= 0], dtype=np.int64)
                n = sum(f.tokens)
                bm = block_size_m(n, len(local), WIDTH)
                pairs = int(local.sum())
                e = est[(routing, f.rep, f.step, r)]
                out.append(
                    {
                        "routing": routing,
                        "step": f.step,
                        "rank": r,
                        "rep": f.rep,
                        "N": n,
                        "block_m": bm,
                        "A": int((local > 0).sum()),
                        "M": pairs,
                        "tiles": row_tiles(local, bm),
                        "extra_tiles": (
                            row_tiles(local, bm)
                            - ranks_tables[r].balanced_tiles(n, int((local > 0).sum()), pairs)
                        )
                        if bm >= MODEL_BLOCK_M
                        else 0.0,
                        "measured_us": f.compute_us[r],
                        "estimate_us": e["compute_estimate_us"],
                    }
                )
    return out


def fit_c(rows: list[dict[str, Any]]) -> float:
    x = np.array([r["extra_tiles"] for r in rows])
    y = np.array([r["measured_us"] - r["estimate_us"] for r in rows])
    return float((x @ y) / (x @ x))


def errors(rows: list[dict[str, Any]], c: float) -> tuple[float, float, float, float]:
    """(median, max) abs relative compute error per (step, rank) median: before, after."""
    by: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["step"], r["rank"]), []).append(r)
    before, after = [], []
    for rs in by.values():
        m = statistics.median(r["measured_us"] for r in rs)
        e0 = statistics.median(r["estimate_us"] for r in rs)
        e1 = statistics.median(r["estimate_us"] + c * r["extra_tiles"] for r in rs)
        before.append(abs(e0 / m - 1))
        after.append(abs(e1 / m - 1))
    return statistics.median(before), max(before), statistics.median(after), max(after)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evidence", type=Path)
    ap.add_argument("--figure", type=Path)
    args = ap.parse_args(argv)
    data = {name: rows_of(args.evidence, f, BUNDLES[name]) for name, f in COMPARISONS.items()}
    for name, rows in data.items():
        for train, test in (("simulator", "native"), ("native", "simulator")):
            c = fit_c([r for r in rows if r["routing"] == train])
            held = [r for r in rows if r["routing"] == test]
            b0, b1, a0, a1 = errors(held, c)
            print(
                f"{name}: fit on {train} c={c:.2f} us/tile -> {test}: "
                f"median {100 * b0:.1f}% -> {100 * a0:.1f}%, max {100 * b1:.1f}% -> {100 * a1:.1f}%"
            )
        steps = sorted({r["step"] for r in rows})
        loo: list[dict[str, Any]] = []
        for s in steps:
            c = fit_c([r for r in rows if r["step"] != s])
            loo.extend(
                {**r, "estimate_us": r["estimate_us"] + c * r["extra_tiles"]}
                for r in rows
                if r["step"] == s
            )
        b0, b1, _, _ = errors(rows, 0.0)
        a0, a1, _, _ = errors(loo, 0.0)
        print(
            f"{name}: leave one step out: median {100 * b0:.1f}% -> {100 * a0:.1f}%, max {100 * b1:.1f}% -> {100 * a1:.1f}%"
        )
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, (name, rows) in zip(axes, data.items(), strict=True):
            for routing, marker in (("simulator", "o"), ("native", "x")):
                rs = [r for r in rows if r["routing"] == routing]
                ax.scatter(
                    [r["extra_tiles"] for r in rs],
                    [r["measured_us"] - r["estimate_us"] for r in rs],
                    c=[r["N"] for r in rs],
                    cmap="viridis",
                    marker=marker,
                    label=routing,
                )
            c = fit_c(rows)
            xs = np.linspace(
                min(r["extra_tiles"] for r in rows), max(r["extra_tiles"] for r in rows), 10
            )
            ax.plot(xs, c * xs, "k--", lw=1, label=f"c = {c:.2f} us/tile (all)")
            ax.set_title(f"H200 tables, {name}")
            ax.set_xlabel("row tiles run - the table's balanced tiles at (N, A, M); colour: N")
            ax.legend(fontsize=8)
        axes[0].set_ylabel("measured - estimate (us), forward x rank")
        fig.tight_layout()
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
