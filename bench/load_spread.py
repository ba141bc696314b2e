"""Does the expert kernel's row-tile count explain the estimate's compute error? (issue 18, parts 1-2)

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

``--kernel load_spread.json`` (what ``scripts/h200_load_spread.py`` measured on the H200: the
expert kernels alone, at fixed N, under balanced, uniform and power-law loads) adds, per
deployment (tp1, ep2): the time against the tiles and against the spread, the cost of a tile
fitted within each N (`moetables.tiles.fit_tile_cost`), and the fit left one distribution out
(fitted on the others, predicting each held-out record from its N's balanced record plus the
cost of its extra tiles); ``--kernel-figure`` draws both.

    PYTHONPATH=. .venv/bin/python bench/load_spread.py docs/evidence/h200x2-estimate \
        --kernel docs/evidence/h200-load-spread/load_spread.json \
        --kernel-figure docs/figures/load_spread_kernel.png
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


# ---- part 1: the kernel alone at fixed N (scripts/h200_load_spread.py) -------------------------


def kernel_rows(raw: dict[str, Any], deployment: str) -> list[Any]:
    from acquisition.load_spread import rows_of

    return rows_of(raw, deployment)


def kernel_table(rows: list[Any]) -> list[dict[str, Any]]:
    """Per N and distribution: mean tiles, spread and time, and the time over the balanced one."""
    out = []
    for n in sorted({r.tokens for r in rows}):
        at = [r for r in rows if r.tokens == n]
        bal = [r for r in at if r.distribution == "balanced"]
        base = statistics.median(r.b2_us for r in bal) if bal else float("nan")
        for dist in sorted({r.distribution for r in at}, key=lambda d: (d != "balanced", d)):
            rs = [r for r in at if r.distribution == dist]
            out.append(
                {
                    "N": n,
                    "distribution": dist,
                    "draws": len(rs),
                    "block_m": rs[0].block_m,
                    "A": statistics.mean(r.activated_experts for r in rs),
                    "M": statistics.mean(r.local_assignments for r in rs),
                    "max": statistics.mean(r.max_count for r in rs),
                    "cv": statistics.mean(r.cv for r in rs),
                    "tiles": statistics.mean(r.tiles for r in rs),
                    "time_us": statistics.mean(r.b2_us for r in rs),
                    "over_balanced": statistics.mean(r.b2_us for r in rs) / base,
                    "unstable": sum(not r.stable for r in rs),
                }
            )
    return out


def leave_one_distribution_out(
    rows: list[Any], block_m: int = MODEL_BLOCK_M
) -> list[dict[str, Any]]:
    """Fit the tile cost without one spread distribution, predict that one's records from their
    N's balanced record: before (the balanced time, today's answer) and after (plus the charge).
    Records whose block is smaller than ``block_m`` rows are neither fitted nor predicted."""
    from moetables.tiles import fit_tile_cost

    out = []
    spread = sorted({r.distribution for r in rows} - {"balanced"})
    for held in spread:
        c = fit_tile_cost([r for r in rows if r.distribution != held], block_m=block_m).tile_cost_us
        before, after = [], []
        for r in rows:
            if r.distribution != held or r.block_m < block_m or not r.stable:
                continue
            bal = [b for b in rows if b.tokens == r.tokens and b.distribution == "balanced"]
            if not bal:
                continue
            before.append(bal[0].b2_us / r.b2_us - 1)
            after.append((bal[0].b2_us + c * (r.tiles - bal[0].tiles)) / r.b2_us - 1)
        if before:
            out.append(
                {
                    "held_out": held,
                    "c": c,
                    "records": len(before),
                    "median_before": statistics.median(abs(e) for e in before),
                    "max_before": max(abs(e) for e in before),
                    "median_after": statistics.median(abs(e) for e in after),
                    "max_after": max(abs(e) for e in after),
                    "signed_median_before": statistics.median(before),
                    "signed_median_after": statistics.median(after),
                }
            )
    return out


def kernel_report(raw: dict[str, Any], block_m: int = MODEL_BLOCK_M) -> dict[str, Any]:
    """Per deployment; the cost is fitted on blocks of at least ``block_m`` rows (128: the tile
    model's; the FP8 kernel runs no 128-row blocks at E = 128, so its run is read with 64)."""
    from moetables.tiles import fit_tile_cost

    report: dict[str, Any] = {}
    for deployment in sorted({r["deployment"] for r in raw["results"]}):
        rows = kernel_rows(raw, deployment)
        fit = fit_tile_cost(rows, block_m=block_m)
        report[deployment] = {
            # named only when not the tile model's 128 (the committed reports predate it)
            **({} if block_m == MODEL_BLOCK_M else {"block_m_at_least": block_m}),
            "tile_cost_us": fit.tile_cost_us,
            "fit_records": fit.records,
            "fit_groups": fit.groups,
            "table": kernel_table(rows),
            "leave_one_distribution_out": leave_one_distribution_out(rows, block_m),
        }
    return report


def print_kernel_report(report: dict[str, Any]) -> None:
    for deployment, rep in report.items():
        print(
            f"{deployment}: c = {rep['tile_cost_us']:.3f} us/tile "
            f"({rep['fit_records']} records, {rep['fit_groups']} N)"
        )
        print(
            "  N | distribution | draws | block | A | M | max | cv | tiles | time us | / balanced"
        )
        for t in rep["table"]:
            print(
                f"  {t['N']} | {t['distribution']} | {t['draws']} | {t['block_m']} | {t['A']:.0f} | "
                f"{t['M']:.0f} | {t['max']:.0f} | {t['cv']:.3f} | {t['tiles']:.1f} | "
                f"{t['time_us']:.1f} | {t['over_balanced']:.3f}"
                + (f" ({t['unstable']} unstable)" if t["unstable"] else "")
            )
        for h in rep["leave_one_distribution_out"]:
            print(
                f"  without {h['held_out']}: c = {h['c']:.3f}; {h['records']} records: median "
                f"{100 * h['median_before']:.1f}% -> {100 * h['median_after']:.1f}%, max "
                f"{100 * h['max_before']:.1f}% -> {100 * h['max_after']:.1f}%"
            )


def kernel_figure(raw: dict[str, Any], report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deployments = list(report)
    fig, axes = plt.subplots(len(deployments), 2, figsize=(11, 4.0 * len(deployments)))
    axes = np.atleast_2d(axes)
    markers = {"balanced": "s", "uniform": "o"}
    for row, deployment in zip(axes, deployments, strict=True):
        rows = kernel_rows(raw, deployment)
        c = report[deployment]["tile_cost_us"]
        ns = sorted({r.tokens for r in rows})
        cmap = plt.get_cmap("viridis")
        for i, n in enumerate(ns):
            colour = cmap(i / max(1, len(ns) - 1))
            at = [r for r in rows if r.tokens == n]
            bal = [r for r in at if r.distribution == "balanced"]
            for dist in sorted({r.distribution for r in at}):
                rs = [r for r in at if r.distribution == dist]
                row[0].scatter(
                    [r.tiles for r in rs],
                    [r.b2_us for r in rs],
                    color=colour,
                    marker=markers.get(dist, "^" if "0.6" in dist else "v"),
                    label=dist if i == len(ns) - 1 else None,
                    s=22,
                )
                if bal:
                    row[1].scatter(
                        [r.cv for r in rs],
                        [r.b2_us / bal[0].b2_us for r in rs],
                        color=colour,
                        marker=markers.get(dist, "^" if "0.6" in dist else "v"),
                        s=22,
                        label=f"N = {n}" if dist == "balanced" else None,
                    )
            if bal and bal[0].block_m >= 128:
                xs = np.array([min(r.tiles for r in at), max(r.tiles for r in at)], dtype=float)
                row[0].plot(xs, bal[0].b2_us + c * (xs - bal[0].tiles), color=colour, lw=0.8)
        row[0].set_title(f"{deployment}: expert kernels vs row tiles (lines: c = {c:.2f} us/tile)")
        row[0].set_xlabel("row tiles the kernel runs")
        row[0].set_ylabel("kernel time, 2B median (us)")
        row[0].legend(fontsize=7)
        row[1].set_title(f"{deployment}: time over the balanced one vs spread")
        row[1].set_xlabel("coefficient of variation of the active experts' counts")
        row[1].set_ylabel("time / balanced time at the same N")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evidence", type=Path)
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--kernel", type=Path, help="load_spread.json (scripts/h200_load_spread.py)")
    ap.add_argument("--kernel-figure", type=Path)
    ap.add_argument("--kernel-out", type=Path, help="write the kernel report as JSON")
    ap.add_argument(
        "--kernel-block-m",
        type=int,
        default=MODEL_BLOCK_M,
        help="fit the kernel's tile cost on blocks of at least this many rows (FP8: 64)",
    )
    args = ap.parse_args(argv)
    if args.kernel:
        raw = json.loads(args.kernel.read_text())
        report = kernel_report(raw, args.kernel_block_m)
        print_kernel_report(report)
        if args.kernel_out:
            args.kernel_out.write_text(json.dumps(report, indent=1) + "\n")
        if args.kernel_figure:
            kernel_figure(raw, report, args.kernel_figure)
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
