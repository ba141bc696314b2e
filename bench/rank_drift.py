"""Does a rank measured later in one acquisition process drift from rank 0? (target isolation)

    PYTHONPATH=. .venv/bin/python bench/rank_drift.py --dp 8 --ranks 0,7 \\
        --run one-process=ROOT_A/out/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16 \\
        --run isolated=ROOT_B/out/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16 [--json OUT.json]

The wide-EP bundles (docs/h200-runs.md, "Wider expert parallelism on one GPU") showed ranks of
identical local geometry measured later in one ``python -m acquisition`` process systematically
slower than rank 0 (DP8, N <= 64: rank 7 +18.7 %), while rank 7's points re-measured by a fresh
process sat +2.8 % above. Each ``--run`` is a bundle of the same command (``--ranks``, one
process or ``--isolate-targets on``). Per run: each later rank against the first, with
`bench/wide_ep_evidence.py`'s ``agreement`` (per component, unsigned) and ``order`` (signed
expert median per band of N); across runs: each rank of every run against the same rank of the
first run (``compare_rows``, ``signed_bands``). No device needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from wide_ep_evidence import agreement, compare_rows, order, rank_rows, signed_bands


def drift(runs: dict[str, Path], dp: int, ranks: list[int]) -> dict[str, Any]:
    """Within each run, ranks after the first against it; across runs, rank by rank."""
    if not ranks or ranks[0] != 0:
        raise SystemExit("--ranks must start with 0 (every rank is compared with rank 0)")
    later = ranks[1:]
    out: dict[str, Any] = {"dp": dp, "ranks": ranks, "within": {}, "across": {}}
    for label, bundle in runs.items():
        out["within"][label] = {
            "agreement": agreement(bundle, dp, later),
            "order": order(bundle, dp, later),
        }
    first_label, first = next(iter(runs.items()))
    for label, bundle in list(runs.items())[1:]:
        per: dict[str, Any] = {}
        for rank in ranks:
            base, other = rank_rows(first, dp, rank), rank_rows(bundle, dp, rank)
            per[f"rank{rank}"] = {
                "agreement": compare_rows(base, other),
                "order": signed_bands(base, other),
            }
        out["across"][f"{label}_vs_{first_label}"] = per
    return out


def _percent(value: float) -> str:
    return f"{100 * value:+.1f} %"


def summary(result: dict[str, Any]) -> str:
    """A Markdown table: signed expert median per band of N, within and across runs."""
    lines = ["| comparison | rank | signed expert median by band of N |", "| --- | --- | --- |"]
    rows: list[tuple[str, str, dict[str, float]]] = []
    for label, within in result["within"].items():
        rows += [(f"{label}: vs rank 0", rank, bands) for rank, bands in within["order"].items()]
    for pair, per in result["across"].items():
        rows += [(pair, rank, entry["order"]) for rank, entry in per.items()]
    for label, rank, bands in rows:
        shown = ", ".join(f"{band} {_percent(value)}" for band, value in bands.items())
        lines.append(f"| {label} | {rank} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, required=True)
    parser.add_argument("--ranks", required=True, help="comma-separated, starting with 0")
    parser.add_argument(
        "--run", action="append", required=True, help="LABEL=BUNDLE (the first is the base)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs: dict[str, Path] = {}
    for spec in args.run:
        label, _, path = spec.partition("=")
        if not path:
            parser.error(f"--run {spec!r}: expected LABEL=BUNDLE")
        runs[label] = Path(path)
    result = drift(runs, args.dp, [int(r) for r in args.ranks.split(",")])
    print(summary(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    main()
