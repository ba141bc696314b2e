"""The rank tables' tile models through the lookup, on the H200 load-spread runs of session 11
(issue 18: "validate ... on the real engine"; the kernel half for the ranks one GPU can time).

`docs/evidence/h200-rank-load-spread/` times vLLM 0.26.0's expert kernel at EP rank 0 of the
DP2/EP2 (FP8, and bf16 small blocks), DP4/EP4 and DP8/EP8 deployments under balanced, uniform
and power-law loads. Under expert parallelism a spread draw moves the rank's A and M as well as
its tiles (the local experts hold more or fewer of the heavy ones), so the held-out check of
``python -m acquisition.load_spread --held-out`` (each record against its N's balanced record)
mixes the two. This asks the lookup itself, as a simulator would: each record's answer from the
shipped rank table at the record's own (N, A, M),

- ``balanced``: ``experts_time_us(N, A, M)`` (today's answer),
- ``charged``: the same with the record's exact per-expert counts (``loads=counts``, the table's
  recorded tile model),

against the record's measured time (2B median). The tables were measured on other H200 units
(1-2 % apart, docs/benchmarks.md "H200 units differ"), so each N's answers are also read
``unit-matched``: scaled by that N's measured balanced arm over the table's answer for it.

    PYTHONPATH=. .venv/bin/python bench/rank_load_spread.py \
        --out docs/evidence/h200-rank-load-spread/lookup_report.json \
        --figure docs/figures/rank_load_spread.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.bundle_evidence import save_figure
from moetables.errors import CoverageError
from moetables.lookup.tables import ComponentTables

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs/evidence/h200-rank-load-spread"
Q = "Qwen/Qwen3-30B-A3B-Instruct-2507"
# (evidence file, bundle, (tp, dp)): each run against the tables its kernel is.
# The second file of a run is a later call's smaller N (another H200 unit).
RUNS = (
    (
        ("load_spread_fp8_ep2.json", "load_spread_fp8_ep2_small.json"),
        f"bundles/H200-vllm-modular-fp8-f2/{Q}-FP8/fp8",
        (1, 2),
    ),
    (("load_spread_bf16_ep2_small.json",), f"bundles/H200-vllm-modular-f2k4/{Q}/bf16", (1, 2)),
    # FP8 TP1/DP1: session 5's run and call 3's 16-row N (whether a 16-row cost holds there).
    (
        ("../h200-fp8-load-spread/load_spread_fp8.json", "load_spread_fp8_tp1_small.json"),
        f"bundles/H200-vllm-modular-fp8-f2/{Q}-FP8/fp8",
        (1, 1),
    ),
    (
        ("load_spread_bf16_ep4.json", "load_spread_bf16_ep4_small.json"),
        f"bundles/H200-vllm-modular-dp4-f4/{Q}/bf16",
        (1, 4),
    ),
    (
        ("load_spread_bf16_ep8.json", "load_spread_bf16_ep8_small.json"),
        f"bundles/H200-vllm-modular-dp8-f4/{Q}/bf16",
        (1, 8),
    ),
)


def _shown(path: Path) -> str:
    """A path as the report names it: from the repository root where it lies inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _errors(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Median and largest absolute relative error (%), and the median signed one."""
    signed = [100 * (p / m - 1) for p, m in pairs]
    absolute = [abs(e) for e in signed]
    return {
        "median_abs": round(statistics.median(absolute), 2),
        "max_abs": round(max(absolute), 2),
        "median_signed": round(statistics.median(signed), 2),
    }


def report_run(evidence: Sequence[Path], bundle: Path, tp_dp: tuple[int, int]) -> dict[str, Any]:
    raws = [json.loads(e.read_text()) for e in evidence]
    rank = ComponentTables(bundle).deployment(*tp_dp, 0)
    records = [r for raw in raws for r in raw["results"] if "b2_us" in r and not r.get("unstable")]
    scale: dict[int, float] = {}
    for r in records:
        if r["distribution"] == "balanced":
            scale[r["N"]] = r["b2_us"] / rank.experts_time_us(r["N"], r["A"], r["M"])
    out: dict[str, list[tuple[float, float]]] = {
        k: [] for k in ("balanced", "charged", "balanced_unit", "charged_unit")
    }
    by_block: dict[int, dict[str, list[tuple[float, float]]]] = {}
    skipped = []
    answers: list[dict[str, Any]] = []
    for r in records:
        if r["distribution"] == "balanced":
            continue
        n, a, m = r["N"], r["A"], r["M"]
        try:
            plain = rank.experts_time_us(n, a, m)
            charged = rank.experts_time_us(n, a, m, loads=tuple(r["counts"]))
        except CoverageError as exc:
            skipped.append({"N": n, "A": a, "M": m, "why": str(exc)[:200]})
            continue
        measured = r["b2_us"]
        s = scale[n]
        answers.append(
            {
                "N": n, "A": a, "M": m, "distribution": r["distribution"], "seed": r["seed"],
                "block_m": r["block_m"], "measured_us": measured,
                "balanced_us": round(plain, 4), "charged_us": round(charged, 4),
                "unit_scale": round(s, 6),
            }
        )  # fmt: skip
        for key, value in (
            ("balanced", plain),
            ("charged", charged),
            ("balanced_unit", plain * s),
            ("charged_unit", charged * s),
        ):
            out[key].append((value, measured))
            by_block.setdefault(r["block_m"], {}).setdefault(key, []).append((value, measured))
    return {
        "evidence": [_shown(e) for e in evidence],
        "bundle": _shown(bundle),
        "target": {"tp": tp_dp[0], "dp": tp_dp[1], "ep": tp_dp[1], "rank": 0},
        "gpus": [raw["meta"]["uuid"] for raw in raws],
        "dtype": raws[0]["meta"]["dtype"],
        "records": len(out["balanced"]),
        "skipped_outside_support": skipped,
        "unit_scale_by_N": {str(k): round(v, 4) for k, v in sorted(scale.items())},
        "errors_pct": {k: _errors(v) for k, v in out.items()},
        "errors_pct_by_block": {
            str(b): {"records": len(v["balanced"]), **{k: _errors(p) for k, p in v.items()}}
            for b, v in sorted(by_block.items(), reverse=True)
        },
        "answers": answers,
    }


def figure(runs: Sequence[dict[str, Any]], path: Path, names: Sequence[str] | None = None) -> None:
    """Per run, each spread record's lookup error (unit-matched) against its N: the balanced
    answer and the answer charged for the record's counts. ``names`` prefix the panel titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(2, -(-len(runs) // 3))
    fig, axes = plt.subplots(rows, 3, figsize=(16, 4 * rows), sharey=True)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for i, (ax, run) in enumerate(zip(axes.flat, runs, strict=False)):
        pts = run["answers"]
        n = np.array([p["N"] for p in pts], dtype=float)
        jitter = np.exp(np.linspace(-0.06, 0.06, len(pts)))
        for key, colour, label in (
            ("balanced_us", "tab:red", "balanced answer"),
            ("charged_us", "tab:blue", "charged for the record's counts"),
        ):
            err = [100 * (p[key] * p["unit_scale"] / p["measured_us"] - 1) for p in pts]
            ax.scatter(n * jitter, err, s=9, alpha=0.6, color=colour, label=label)
        t = run["target"]
        e = run["errors_pct"]
        ax.set_title(
            f"{names[i] + chr(10) if names else ''}"
            f"{run['dtype']} DP{t['dp']}/EP{t['ep']} rank 0: median |err| "
            f"{e['balanced_unit']['median_abs']} -> {e['charged_unit']['median_abs']} %, "
            f"max {e['balanced_unit']['max_abs']} -> {e['charged_unit']['max_abs']} %",
            fontsize=9,
        )
        ax.set_xscale("log", base=2)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlabel("N (token rows into the rank's expert kernel)")
        ax.set_ylabel("lookup / measured - 1 (%), unit-matched per N")
        ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--figure", type=Path)
    args = ap.parse_args(argv)
    runs = [report_run([EVIDENCE / f for f in e], ROOT / b, d) for e, b, d in RUNS]
    for run in runs:
        e = run["errors_pct"]
        print(
            f"{Path(run['evidence'][0]).name} ({run['records']} spread records, "
            f"{len(run['skipped_outside_support'])} outside support): "
            f"balanced {e['balanced']['median_abs']} / {e['balanced']['max_abs']} % -> charged "
            f"{e['charged']['median_abs']} / {e['charged']['max_abs']} %; unit-matched "
            f"{e['balanced_unit']['median_abs']} / {e['balanced_unit']['max_abs']} % -> "
            f"{e['charged_unit']['median_abs']} / {e['charged_unit']['max_abs']} %"
        )
        for b, v in run["errors_pct_by_block"].items():
            print(
                f"  {b}-row ({v['records']}): unit-matched {v['balanced_unit']['median_abs']} / "
                f"{v['balanced_unit']['max_abs']} % -> {v['charged_unit']['median_abs']} / "
                f"{v['charged_unit']['max_abs']} %"
            )
    if args.figure:
        figure(runs, args.figure)
    if args.out:
        args.out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
