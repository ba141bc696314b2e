"""Tile costs for the catalog models' tables (issue 18, session 13): which vLLM block sizes to
record, judged through the lookup as the rank tables' were (docs/benchmarks.md, "Load spread on
the rank tables").

`docs/evidence/h200-catalog-load-spread/` times vLLM 0.26.0's expert kernel at the geometry of
Qwen3-235B-A22B (TP1/DP1, EP rank 0 of DP4/EP4 and DP8/EP8), DeepSeek-V2-Lite's routed experts
and OLMoE-1B-7B-0924 (TP1/DP1, EP rank 0 of DP2/EP2) under the balanced stimulus and 4 draws
each of uniform, power_law(0.6) and power_law(1.2) loads (`scripts/h200_spread_rest.sh models`).
The tables measured again on the rule-v4 plan (Qwen3-235B's DP4/EP4 and DP8/EP8 ranks, sessions
15-16; the FP8 model's, session 15) are judged on the same runs, with session 16's smaller N
(`docs/evidence/h200-session16-load-spread/`) and, for FP8, its kernel's own runs of sessions 5
and 11: every run names its evidence files.

``--choose``: per table, every block size the evidence times is fitted and recorded into a
temporary copy of the bundle (`acquisition.load_spread.attach`, the writer's own path); each
spread record is answered from that copy at its own (N, A, M), plain and charged for its exact
counts, against its measured time, unit-matched per N (`bench.rank_load_spread.report_run`).
A block size is chosen when its charge lowers the largest error and raises the median by at
most 0.1 point (the rank tables' rule). It prints the choice and the command that records it.

Without ``--choose``: the report of the bundles as shipped (their recorded costs), as JSON and
a figure:

    PYTHONPATH=. .venv/bin/python bench/catalog_load_spread.py --choose
    PYTHONPATH=. .venv/bin/python bench/catalog_load_spread.py \
        --out docs/evidence/h200-catalog-load-spread/lookup_report.json \
        --figure docs/figures/catalog_load_spread.png
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acquisition.load_spread import attach, merged, rows_of
from bench.rank_load_spread import figure, report_run
from moetables.tiles import fit_tile_cost

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs/evidence/h200-catalog-load-spread"
# The rank tables' rule: the charge must lower the worst error, and may raise the median by
# at most this many percentage points.
MEDIAN_SLACK = 0.1
_RANK = ROOT / "docs/evidence/h200-rank-load-spread"
_S16 = ROOT / "docs/evidence/h200-session16-load-spread"
_FP8 = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
_Q235 = "Qwen/Qwen3-235B-A22B/bf16"


def evidence_of(name: str) -> Path:
    return EVIDENCE / f"load_spread_{name}.json"


Run = tuple[tuple[Path, ...], str, str, tuple[int, int]]


def _catalog(name: str, bundle: str, deployment: str, tp_dp: tuple[int, int]) -> Run:
    """A run on one of the catalog's session-13 files."""
    return ((evidence_of(name),), bundle, deployment, tp_dp)


# (evidence files, bundle, deployment, (tp, dp)): each run against the tables its kernel is.
RUNS: tuple[Run, ...] = (
    _catalog("olmoe_tp1", "H200-vllm-modular-f2k4/allenai/OLMoE-1B-7B-0924/bf16", "tp1", (1, 1)),
    _catalog("olmoe_ep2", "H200-vllm-modular-dp2-f4/allenai/OLMoE-1B-7B-0924/bf16", "ep2", (1, 2)),
    _catalog("dsv2_tp1", "H200-vllm-modular-f2k4/deepseek-ai/DeepSeek-V2-Lite/bf16", "tp1", (1, 1)),
    _catalog(
        "dsv2_ep2", "H200-vllm-modular-dp2-f4/deepseek-ai/DeepSeek-V2-Lite/bf16", "ep2", (1, 2)
    ),
    # The same ranks measured again at factor 2 with rule v4 (session 13, after these runs).
    _catalog("olmoe_ep2", "H200-vllm-modular-f2k4/allenai/OLMoE-1B-7B-0924/bf16", "ep2", (1, 2)),
    _catalog("dsv2_ep2", "H200-vllm-modular-f2k4/deepseek-ai/DeepSeek-V2-Lite/bf16", "ep2", (1, 2)),
    _catalog("q235_tp1", f"H200-vllm-modular-f2k4/{_Q235}", "tp1", (1, 1)),
    _catalog("q235_ep4", f"H200-vllm-modular-dp4-f4/{_Q235}", "ep4", (1, 4)),
    _catalog("q235_ep8", f"H200-vllm-modular-dp8-f4/{_Q235}", "ep8", (1, 8)),
    # Qwen3-235B's DP4/EP4 (session 15) and DP8/EP8 (session 16) ranks measured again at
    # factor 2 with rule v4, with session 16's runs at the small N of their 32- and 64-row blocks.
    (
        (
            evidence_of("q235_ep4"),
            _S16 / "load_spread_q235_ep4_small.json",
            _S16 / "load_spread_q235_ep4_32row.json",
        ),
        f"H200-vllm-modular-f2k4/{_Q235}",
        "ep4",
        (1, 4),
    ),
    (
        (
            evidence_of("q235_ep8"),
            _S16 / "load_spread_q235_ep8_small.json",
            _S16 / "load_spread_q235_ep8_32row.json",
        ),
        f"H200-vllm-modular-f2k4/{_Q235}",
        "ep8",
        (1, 8),
    ),
    # The FP8 tables on the rule-v4 plan (session 15) against the FP8 kernel's own runs:
    # session 5's TP1 run (with session 11's 16-row N); session 11's DP2/EP2 rank-0 runs with
    # session 16's N = 64-192 between them.
    (
        (
            ROOT / "docs/evidence/h200-fp8-load-spread/load_spread_fp8.json",
            _RANK / "load_spread_fp8_tp1_small.json",
        ),
        f"H200-vllm-modular-f2k4/{_FP8}",
        "tp1",
        (1, 1),
    ),
    (
        (
            _RANK / "load_spread_fp8_ep2.json",
            _RANK / "load_spread_fp8_ep2_small.json",
            _S16 / "load_spread_fp8_ep2_mid.json",
        ),
        f"H200-vllm-modular-f2k4/{_FP8}",
        "ep2",
        (1, 2),
    ),
)


def choose(
    evidence: Sequence[Path], bundle: str, deployment: str, tp_dp: tuple[int, int]
) -> dict[str, Any]:
    """Every timed block size recorded into a copy, then judged block by block."""
    raw = merged([json.loads(e.read_text()) for e in evidence])
    rows = rows_of(raw, deployment)
    timed = sorted({r.block_m for r in rows}, reverse=True)
    # A block whose time does not grow with its tiles has no cost to record (the reader
    # refuses a negative one): it is left out before the others are recorded and judged.
    fitted = {b: fit_tile_cost(rows, block_m=b, exact=True).tile_cost_us for b in timed}
    blocks = [b for b in timed if fitted[b] >= 0]
    chosen, verdicts = [], {}
    for block in sorted(set(timed) - set(blocks), reverse=True):
        verdicts[block] = f"left out: the fitted cost is negative ({fitted[block]:.3f} us)"
    if not blocks:
        return {"bundle": bundle, "chosen": chosen, "verdicts": verdicts}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(bundle).name
        shutil.copytree(ROOT / "bundles" / bundle, copy)
        costs = attach(copy, raw, [deployment], blocks=blocks)[deployment]
        run = report_run(list(evidence), copy, tp_dp)
    assert isinstance(costs, dict)  # one cost per block size (blocks= was given)
    for block in blocks:
        v = run["errors_pct_by_block"].get(str(block))
        if v is None:
            verdicts[block] = "no spread record answered"
            continue
        plain, charged = v["balanced_unit"], v["charged_unit"]
        ok = (
            charged["max_abs"] < plain["max_abs"]
            and charged["median_abs"] <= plain["median_abs"] + MEDIAN_SLACK
        )
        verdicts[block] = (
            f"{'chosen' if ok else 'left out'}: {v['records']} records, unit-matched "
            f"{plain['median_abs']} / {plain['max_abs']} % -> "
            f"{charged['median_abs']} / {charged['max_abs']} %, cost {costs[block]:.3f} us"
        )
        if ok:
            chosen.append(block)
    return {"bundle": bundle, "chosen": chosen, "verdicts": verdicts}


def report_runs() -> list[dict[str, Any]]:
    """Every run answered from the bundles as shipped (their recorded costs)."""
    return [report_run(list(e), ROOT / "bundles" / b, d) for e, b, _, d in RUNS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--choose", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--figure", type=Path)
    args = ap.parse_args(argv)
    if args.choose:
        for evidence, bundle, deployment, tp_dp in RUNS:
            c = choose(evidence, bundle, deployment, tp_dp)
            print(f"{evidence[0].stem.removeprefix('load_spread_')} ({bundle}):")
            for block, verdict in c["verdicts"].items():
                print(f"  {block}-row {verdict}")
            if c["chosen"]:
                files = " ".join(str(e.relative_to(ROOT)) for e in evidence)
                print(
                    "  record: PYTHONPATH=. .venv/bin/python -m acquisition.load_spread "
                    f"bundles/{bundle} {files} "
                    f"--deployments {deployment} --blocks {','.join(map(str, c['chosen']))}"
                )
        return 0
    runs = report_runs()
    for (evidence, *_), run in zip(RUNS, runs, strict=True):
        name = evidence[0].stem.removeprefix("load_spread_")
        e = run["errors_pct"]
        print(
            f"{name} ({run['records']} spread records, "
            f"{len(run['skipped_outside_support'])} outside support): unit-matched "
            f"{e['balanced_unit']['median_abs']} / {e['balanced_unit']['max_abs']} % -> "
            f"{e['charged_unit']['median_abs']} / {e['charged_unit']['max_abs']} %"
        )
    if args.figure:
        names = [
            f"{b.split('/')[2]} ({b.split('/')[0].removeprefix('H200-vllm-')})"
            for _, b, _, _ in RUNS
        ]
        figure(runs, args.figure, names)
    if args.out:
        args.out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
