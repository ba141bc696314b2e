"""Per-expert load spread measured on a GPU, recorded in a bundle (issue 18, parts 1 and 2).

``scripts/h200_load_spread.py`` times vLLM's expert kernels at the tables' own N under balanced,
uniform and power-law per-expert loads, for deployments of Qwen3-30B-A3B: ``tp1`` (all 128
experts local), ``ep2``, ``ep4`` and ``ep8`` (EP rank 0 of 2, 4 and 8: 64, 32 and 16 local
experts). This module turns its JSON into the bundle's ``load_spread.csv`` rows and records each
deployment's fitted row-tile cost on the bundle's matching entries (format 3,
``moetables.bundle.attach_tile_models``):

- ``tp1`` on the TP1/DP1 table;
- ``ep2`` on every TP1/DP2/EP2 rank's table, ``ep4`` on every DP4/EP4 rank's, ``ep8`` on every
  DP8/EP8 rank's (the kernel's shape, the local experts of width 768, is the same on every rank
  of a deployment; the measurement ran rank 0's expert map).

By default every deployment the evidence times is recorded where the bundle has its tables.

    python -m acquisition.load_spread BUNDLE docs/evidence/h200-load-spread/load_spread.json

FP8 (block-FP8 weights, vLLM's tuned H200 file): the kernel runs 16-row blocks up to 128 token
rows and 64-row blocks from 200 on, never 128, so its cost is fitted and charged on 64-row
blocks (``--block-m 64``; the model's ``block_m`` says where the lookups charge it), and only
the TP1/DP1 table is measured (``--deployments tp1``):

    python -m acquisition.load_spread bundles/H200-vllm-modular-fp8-f2 \
        docs/evidence/h200-fp8-load-spread/load_spread_fp8.json --block-m 64 --deployments tp1

bf16 small blocks (format 4, one cost per vLLM block size, each fitted on exactly that block's
records and charged only there): the TP1/DP1 table's 128-, 64- and 32-row costs from the
session-4 file and the session-5 small-block file together (the DP2/EP2 ranks keep their
format-3 128-row model: their 64-row evidence is one N and fails leave-one-out):

    python -m acquisition.load_spread BUNDLE docs/evidence/h200-load-spread/load_spread.json \
        docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json \
        --deployments tp1 --blocks 128,64,32

``--held-out`` prints, per block size, the leave-one-distribution-out and leave-one-N-out
errors of the reader's fit (what decides which block sizes are recorded).

Waves (format 5, `moetables.waves`): at vLLM's tuned 32-row blocks the bf16 TP1 kernel's extra
time follows waves of its grid over the SMs, not tiles (``docs/benchmarks.md``, "Waves, not
tiles"); ``--waves 32:2:132`` charges 32-row blocks per weighted wave at 2 programs per SM on
132 SMs (block:programs_per_sm:sms), fitted by the reader's rule on the same records:

    python -m acquisition.load_spread BUNDLE docs/evidence/h200-load-spread/load_spread.json \
        docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json \
        --deployments tp1 --blocks 128,64 --waves 32:2:132

With ``--held-out``, ``--waves`` blocks are held out with the wave fit (and ``--waves
32:1:132,32:2:132,...`` compares residencies; nothing is recorded then).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetables.bundle import open_bundle
from moetables.bundle.loads import LoadSpreadRow, fit_wave_model, wave_grid
from moetables.bundle.writer import attach_tile_models
from moetables.geometry import MoeTarget
from moetables.tiles import MODEL_BLOCK_M, TileError, fit_tile_cost

# Raw files written before `scripts/h200_load_spread.py` took ``--model`` name no model: they all
# timed Qwen3-30B-A3B's kernel (bf16 and its FP8 checkpoint share the geometry).
LEGACY_MODEL = {
    "name": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "global_experts": 128,
    "top_k": 8,
    "hidden_size": 2048,
    "expert_intermediate_size": 768,
}
# The evidence's geometry key -> the contract geometry's.
_GEOMETRY_KEYS = {
    "global_experts": "global_experts",
    "top_k": "global_top_k",
    "hidden_size": "expert_hidden_size",
    "expert_intermediate_size": "expert_intermediate_size",
}


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


def table_dp(deployment: str) -> int:
    """The DP (= EP) size of the tables whose kernel a measured deployment timed: ``tp1`` is
    the TP1/DP1 table, ``epX`` (EP rank 0 of X) every TP1/DPX/EPX rank's."""
    if deployment == "tp1":
        return 1
    size = deployment[2:]
    if deployment.startswith("ep") and size.isdigit() and int(size) > 1:
        return int(size)
    raise LoadSpreadError(f"unknown deployment {deployment!r}: tp1 or epX (X ranks, X > 1)")


def measured_deployments(raw: Mapping[str, Any]) -> list[str]:
    """The deployments the evidence times, tp1 first, then by EP size."""
    timed = {str(r.get("deployment")) for r in raw.get("results", [])}
    return sorted(timed, key=table_dp)


def targets_for(bundle: Path, deployment: str) -> list[MoeTarget]:
    dp = table_dp(deployment)
    return [
        e.target
        for e in open_bundle(bundle).entries
        if (e.target.tp, e.target.dp) == (1, dp) and not e.target.sequence_parallel
    ]


def geometry_record(model: Any) -> dict[str, Any]:
    """What a raw file's ``meta.model`` records of the catalog model (`MoeModel`) it timed."""
    return {
        "name": model.name,
        "config_sha256": model.config_sha256,
        "global_experts": model.global_experts,
        "top_k": model.top_k,
        "hidden_size": model.hidden_size,
        "expert_intermediate_size": model.expert_intermediate_size,
    }


def evidence_model(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The model whose kernel the evidence timed (``meta.model``; older files: Qwen3-30B-A3B)."""
    meta = raw.get("meta")
    model = meta.get("model") if isinstance(meta, Mapping) else None
    return model if isinstance(model, Mapping) else LEGACY_MODEL


def merged(raws: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several raw files as one (their results concatenated): a deployment's records from
    different device calls, at different N. They must have timed one geometry."""
    models = [evidence_model(raw) for raw in raws]
    shapes = {tuple(int(m[k]) for k in _GEOMETRY_KEYS) for m in models}
    if len(shapes) > 1:
        names = sorted({str(m.get("name")) for m in models})
        raise LoadSpreadError(f"the evidence files time different MoE geometries ({names})")
    return {
        "meta": {"model": dict(models[0]) if models else LEGACY_MODEL},
        "results": [r for raw in raws for r in raw.get("results", [])],
    }


def check_geometry(bundle: Path, raw: Mapping[str, Any], deployment: str) -> None:
    """Refuse evidence timed on another kernel shape than the deployment's tables run: a cost
    fitted on Qwen3-30B-A3B's 768-wide experts says nothing of OLMoE's."""
    model = evidence_model(raw)
    experts = int(model["global_experts"])
    local = experts // table_dp(deployment)
    timed = {
        int(r["local_experts"])
        for r in raw.get("results", [])
        if r.get("deployment") == deployment and "local_experts" in r
    }
    if timed - {local}:
        raise LoadSpreadError(
            f"{deployment} records time {sorted(timed)} local experts; "
            f"{experts} experts over {table_dp(deployment)} ranks are {local}"
        )
    targets = set(targets_for(bundle, deployment))
    for entry in open_bundle(bundle).entries:
        if entry.target not in targets:
            continue
        geometry = entry.contract.get("geometry")
        geometry = geometry if isinstance(geometry, Mapping) else {}
        wrong = [
            f"{key} {model[key]} (table: {geometry.get(theirs)})"
            for key, theirs in _GEOMETRY_KEYS.items()
            if geometry.get(theirs) is not None and int(geometry[theirs]) != int(model[key])
        ]
        if entry.geometry.local_experts != local:
            wrong.append(f"local experts {local} (table: {entry.geometry.local_experts})")
        if wrong:
            raise LoadSpreadError(
                f"{bundle} {entry.target}: the evidence timed {model.get('name')}'s kernel, "
                f"another shape: {', '.join(wrong)}"
            )


def attach(
    bundle: Path,
    raw: Mapping[str, Any],
    deployments: Sequence[str] | None = None,
    *,
    block_m: int = MODEL_BLOCK_M,
    blocks: Sequence[int] | None = None,
    waves: Mapping[int, tuple[int, int]] | None = None,
) -> dict[str, float | dict[int, float]]:
    """Record each deployment's fitted cost on the bundle's matching tables; returns the costs.

    ``block_m``: one cost on blocks of at least ``block_m`` rows, where the lookups then charge
    it (format 3). ``blocks``: one cost per block size, each fitted on exactly that block's
    records and charged only there (format 4). ``deployments``: those to record (each must
    have timed records); None: every deployment the evidence times."""
    # The kernel's dtype must be the bundle's (an FP8 cost on a bf16 table would be wrong).
    dtypes = {str(r.get("dtype", "bf16")) for r in raw.get("results", [])}
    variant = str(open_bundle(bundle).meta.get("variant", ""))
    if dtypes != {variant}:
        raise LoadSpreadError(
            f"the evidence times {sorted(dtypes)} kernels, the bundle is {variant!r}"
        )
    models: dict[MoeTarget, list[LoadSpreadRow]] = {}
    costs: dict[str, float | dict[int, float]] = {}
    if deployments is None:
        deployments = measured_deployments(raw)
    for deployment in deployments:
        rows = rows_of(raw, deployment)
        targets = targets_for(bundle, deployment)
        if not targets:
            continue
        check_geometry(bundle, raw, deployment)
        if blocks is None:
            costs[deployment] = fit_tile_cost(rows, block_m=block_m).tile_cost_us
        else:
            per_block = {
                b: fit_tile_cost(rows, block_m=b, exact=True).tile_cost_us
                for b in blocks
                if b not in (waves or {})
            }
            for b, (r, sms) in (waves or {}).items():
                entry = _entry(bundle, targets[0])
                per_block[b] = fit_wave_model(
                    entry.contract,
                    entry.geometry.local_experts,
                    rows,
                    block_m=b,
                    programs_per_sm=r,
                    sms=sms,
                    where=str(bundle),
                )
            costs[deployment] = per_block
        for t in targets:
            models[t] = rows
    if not models:
        raise LoadSpreadError(f"{bundle} has no table of the measured deployments")
    if blocks is None:
        attach_tile_models(bundle, models, block_m=block_m)
    else:
        attach_tile_models(bundle, models, blocks=blocks, waves=waves)
    return costs


def _entry(bundle: Path, target: MoeTarget) -> Any:
    return next(e for e in open_bundle(bundle).entries if e.target == target)


def wave_units(
    bundle: Path, deployment: str, programs_per_sm: int, sms: int
) -> Callable[[LoadSpreadRow], float]:
    """A record's weighted waves (`moetables.waves`) on the deployment's first table."""
    entry = _entry(bundle, targets_for(bundle, deployment)[0])
    from moetables.tiles import contract_kernel_shape

    grid = wave_grid(entry.contract, programs_per_sm, sms, str(bundle))
    shape = contract_kernel_shape(entry.contract, entry.geometry.local_experts)

    def units(r: LoadSpreadRow) -> float:
        return float(grid.waves(r.tiles, shape.config(r.tokens).block_n))

    return units


def _slope(rows: Sequence[LoadSpreadRow], x: Callable[[LoadSpreadRow], float]) -> float:
    """The reader's rule on any count: the pooled within-N least-squares slope of b2_us."""
    groups: dict[int, list[LoadSpreadRow]] = {}
    for r in rows:
        groups.setdefault(r.tokens, []).append(r)
    sxy = sxx = 0.0
    for rs in groups.values():
        if len(rs) < 2:
            continue
        xs = [x(r) for r in rs]
        mx = statistics.fmean(xs)
        my = statistics.fmean(r.b2_us for r in rs)
        sxy += sum((a - mx) * (r.b2_us - my) for a, r in zip(xs, rs, strict=True))
        sxx += sum((a - mx) ** 2 for a in xs)
    if sxx <= 0:
        raise TileError("no N with loads of different counts")
    return sxy / sxx


@dataclass(frozen=True)
class HeldOut:
    """One held-out group's absolute relative errors (%), its N's balanced time alone and with
    the cost fitted on the rest times the extra tiles."""

    block_m: int
    by: str  # "distribution" or "N"
    group: str
    cost_us: float
    records: int
    median_before: float
    max_before: float
    median_after: float
    max_after: float


def held_out(
    rows: Sequence[LoadSpreadRow],
    block_m: int,
    units: Callable[[LoadSpreadRow], float] | None = None,
) -> list[HeldOut]:
    """Leave one distribution out, then one N: fit the reader's cost (`fit_tile_cost`, exactly
    ``block_m``-row records) on the rest and predict each held-out record as its N's balanced
    time plus the cost times its tiles beyond the balanced ones. A group that leaves no fit
    (one N left) is omitted. ``units``: count something else than tiles (a record's weighted
    waves, `wave_units`), fitted by the same rule."""
    x: Callable[[LoadSpreadRow], float] = units or (lambda r: float(r.tiles))
    own = [r for r in rows if r.block_m == block_m and r.stable]
    balanced = {r.tokens: r for r in own if r.distribution == "balanced"}
    out = []
    for by in ("distribution", "N"):

        def key(r: LoadSpreadRow, by: str = by) -> str:
            return r.distribution if by == "distribution" else str(r.tokens)

        spread = [r for r in own if r.distribution != "balanced" and r.tokens in balanced]
        for group in sorted({key(r) for r in spread}):
            held = [r for r in spread if key(r) == group]
            rest = [r for r in own if not (r.distribution != "balanced" and key(r) == group)]
            if by == "N":
                rest = [r for r in rest if str(r.tokens) != group]
            try:
                cost = (
                    fit_tile_cost(rest, block_m=block_m, exact=True).tile_cost_us
                    if units is None
                    else _slope(rest, units)
                )
            except TileError:
                continue
            before, after = [], []
            for r in held:
                b = balanced[r.tokens]
                before.append(100 * abs(b.b2_us / r.b2_us - 1))
                after.append(100 * abs((b.b2_us + cost * (x(r) - x(b))) / r.b2_us - 1))
            out.append(
                HeldOut(
                    block_m,
                    by,
                    group,
                    cost,
                    len(held),
                    statistics.median(before),
                    max(before),
                    statistics.median(after),
                    max(after),
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument(
        "evidence",
        type=Path,
        nargs="+",
        help="load_spread.json file(s) from scripts/h200_load_spread.py (merged)",
    )
    p.add_argument(
        "--block-m",
        type=int,
        default=MODEL_BLOCK_M,
        help="fit and charge tiles on vLLM blocks of at least this many rows (FP8: 64)",
    )
    p.add_argument(
        "--blocks",
        help="comma-separated block sizes: one cost per block size (format 4), e.g. 128,64,32",
    )
    p.add_argument(
        "--waves",
        help="block:programs_per_sm:sms[,...]: blocks charged per weighted wave of the kernel's "
        "grid (format 5), e.g. 32:2:132; with --held-out several residencies may be compared",
    )
    p.add_argument(
        "--deployments",
        default="",
        help="comma-separated measured deployments to record "
        "(tp1, ep2, ep4, ...; default: every one the evidence times)",
    )
    p.add_argument(
        "--held-out",
        action="store_true",
        help="print the held-out errors per block size and record nothing",
    )
    args = p.parse_args(argv)
    wanted: list[str] | None = [d for d in args.deployments.split(",") if d] or None
    for deployment in wanted or ():
        try:
            table_dp(deployment)
        except LoadSpreadError as exc:
            p.error(str(exc))
    blocks = None
    if args.blocks:
        try:
            blocks = [int(b) for b in args.blocks.split(",") if b]
        except ValueError:
            p.error(f"--blocks takes integers, got {args.blocks!r}")
    wave_specs: list[tuple[int, int, int]] = []
    for spec in (args.waves or "").split(","):
        if not spec:
            continue
        try:
            b, r, sms = (int(v) for v in spec.split(":"))
        except ValueError:
            p.error(f"--waves takes block:programs_per_sm:sms, got {spec!r}")
        wave_specs.append((b, r, sms))
    try:
        raw = merged([json.loads(e.read_text()) for e in args.evidence])
    except LoadSpreadError as exc:
        p.error(str(exc))
    if args.held_out:
        for deployment in wanted or measured_deployments(raw):
            try:
                rows = rows_of(raw, deployment)
            except LoadSpreadError as exc:
                p.error(str(exc))
            runs: list[tuple[int, str, Callable[[LoadSpreadRow], float] | None]] = [
                (b, "tiles", None)
                for b in blocks or sorted({r.block_m for r in rows}, reverse=True)
            ]
            runs += [
                (b, f"waves r={r} sms={sms}", wave_units(args.bundle, deployment, r, sms))
                for b, r, sms in wave_specs
            ]
            for b, label, units in runs:
                for h in held_out(rows, b, units):
                    print(
                        f"{deployment} {b}-row {label} held out {h.by} {h.group}: cost "
                        f"{h.cost_us:.3f} ({h.records} records) median {h.median_before:.1f} -> "
                        f"{h.median_after:.1f} %, max {h.max_before:.1f} -> {h.max_after:.1f} %"
                    )
        return 0
    waves = {b: (r, sms) for b, r, sms in wave_specs}
    if len(waves) != len(wave_specs):
        p.error("--waves names a block twice: record one residency per block")
    if waves and blocks is None:
        p.error("--waves records format 5's per-block models: give --blocks too")
    try:
        costs = attach(
            args.bundle,
            raw,
            wanted,
            block_m=args.block_m,
            blocks=sorted(set(blocks or ()) | set(waves), reverse=True) if waves else blocks,
            waves=waves or None,
        )
    except (LoadSpreadError, TileError) as exc:
        p.error(str(exc))
    for deployment, c in costs.items():
        if isinstance(c, dict):
            for b, v in c.items():
                what = "wave_cost_us" if b in waves else "tile_cost_us"
                print(f"{args.bundle}: {deployment} {b}-row {what} {v:.3f}")
        else:
            print(f"{args.bundle}: {deployment} tile_cost_us {c:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
