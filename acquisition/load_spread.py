"""Per-expert load spread measured on a GPU, recorded in a bundle (issue 18, parts 1 and 2).

``scripts/h200_load_spread.py`` times vLLM's expert kernels at the tables' own N under balanced,
uniform and power-law per-expert loads, for two deployments of Qwen3-30B-A3B: ``tp1`` (all 128
experts local) and ``ep2`` (EP rank 0 of 2, 64 local experts). This module turns its JSON into
the bundle's ``load_spread.csv`` rows and records each deployment's fitted row-tile cost on the
bundle's matching entries (format 3, ``moetables.bundle.attach_tile_models``):

- ``tp1`` on the TP1/DP1 table;
- ``ep2`` on every TP1/DP2/EP2 rank's table (the kernel's shape, 64 local experts of width 768,
  is the same on both ranks; the measurement ran rank 0's expert map).

    python -m acquisition.load_spread BUNDLE docs/evidence/h200-load-spread/load_spread.json

FP8 (block-FP8 weights, vLLM's tuned H200 file): the kernel runs 16-row blocks up to 128 token
rows and 64-row blocks from 200 on, never 128, so its cost is fitted and charged on 64-row
blocks (``--block-m 64``; the model's ``block_m`` says where the lookups charge it), and only
the TP1/DP1 table is measured (``--deployments tp1``):

    python -m acquisition.load_spread bundles/H200-vllm-modular-fp8-f2 \
        docs/evidence/h200-fp8-load-spread/load_spread_fp8.json --block-m 64 --deployments tp1
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moetables.bundle import open_bundle
from moetables.bundle.loads import LoadSpreadRow
from moetables.bundle.writer import attach_tile_models
from moetables.geometry import MoeTarget
from moetables.tiles import MODEL_BLOCK_M, fit_tile_cost

# The measured deployment -> the table targets (tp, dp) whose kernel it is.
DEPLOYMENT_TABLES = {"tp1": (1, 1), "ep2": (1, 2)}


class LoadSpreadError(ValueError):
    """A raw load-spread file that cannot be recorded (named in the message)."""


def rows_of(raw: Mapping[str, Any], deployment: str) -> list[LoadSpreadRow]:
    """The timed records of one deployment (records that failed on the GPU are left out)."""
    out = []
    for r in raw.get("results", []):
        if r.get("deployment") != deployment or "error" in r or "b2_us" not in r:
            continue
        out.append(
            LoadSpreadRow(
                tokens=int(r["N"]),
                activated_experts=int(r["A"]),
                local_assignments=int(r["M"]),
                distribution=str(r["distribution"]),
                seed=int(r["seed"]),
                block_m=int(r["block_m"]),
                tiles=int(r["tiles"]),
                max_count=int(r["max"]),
                cv=float(r["cv"]),
                b_us=float(r["b_us"]),
                b2_us=float(r["b2_us"]),
            )
        )
    if not out:
        raise LoadSpreadError(f"no timed records of deployment {deployment!r}")
    return out


def targets_for(bundle: Path, deployment: str) -> list[MoeTarget]:
    tp, dp = DEPLOYMENT_TABLES[deployment]
    return [
        e.target
        for e in open_bundle(bundle).entries
        if (e.target.tp, e.target.dp) == (tp, dp) and not e.target.sequence_parallel
    ]


def attach(
    bundle: Path,
    raw: Mapping[str, Any],
    deployments: Sequence[str] = tuple(DEPLOYMENT_TABLES),
    *,
    block_m: int = MODEL_BLOCK_M,
) -> dict[str, float]:
    """Record each deployment's fitted cost (on blocks of at least ``block_m`` rows, where the
    lookups then charge it) on the bundle's matching tables; returns the costs."""
    # The kernel's dtype must be the bundle's (an FP8 cost on a bf16 table would be wrong).
    dtypes = {str(r.get("dtype", "bf16")) for r in raw.get("results", [])}
    variant = str(open_bundle(bundle).meta.get("variant", ""))
    if dtypes != {variant}:
        raise LoadSpreadError(
            f"the evidence times {sorted(dtypes)} kernels, the bundle is {variant!r}"
        )
    models: dict[MoeTarget, list[LoadSpreadRow]] = {}
    costs = {}
    for deployment in deployments:
        rows = rows_of(raw, deployment)
        targets = targets_for(bundle, deployment)
        if not targets:
            continue
        costs[deployment] = fit_tile_cost(rows, block_m=block_m).tile_cost_us
        for t in targets:
            models[t] = rows
    if not models:
        raise LoadSpreadError(f"{bundle} has no table of the measured deployments")
    attach_tile_models(bundle, models, block_m=block_m)
    return costs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("evidence", type=Path, help="load_spread.json from scripts/h200_load_spread.py")
    p.add_argument(
        "--block-m",
        type=int,
        default=MODEL_BLOCK_M,
        help="fit and charge tiles on vLLM blocks of at least this many rows (FP8: 64)",
    )
    p.add_argument(
        "--deployments",
        default=",".join(DEPLOYMENT_TABLES),
        help="comma-separated measured deployments to record (tp1, ep2)",
    )
    args = p.parse_args(argv)
    wanted = [d for d in args.deployments.split(",") if d]
    unknown = set(wanted) - set(DEPLOYMENT_TABLES)
    if unknown:
        p.error(f"unknown deployments {sorted(unknown)}; known: {sorted(DEPLOYMENT_TABLES)}")
    costs = attach(args.bundle, json.loads(args.evidence.read_text()), wanted, block_m=args.block_m)
    for deployment, c in costs.items():
        print(f"{args.bundle}: {deployment} tile_cost_us {c:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
