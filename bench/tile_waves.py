"""Do the expert kernel's waves explain its time better than its row tiles? (issue 18, N = 384)

vLLM 0.26.0's ``invoke_fused_moe_triton_kernel`` launches a 1-D grid of
``cdiv(EM, BLOCK_SIZE_M) * cdiv(N_out, BLOCK_SIZE_N)`` programs per GEMM, where ``EM`` is
``sorted_token_ids.size(0)`` = ``moe_align_block_size``'s ``max_num_tokens_padded`` =
``top_k * rows + E_global * (BLOCK_SIZE_M - 1)`` (capped at ``numel * BLOCK_SIZE_M`` when
``numel < E_global``, and at ``rows * top_k * BLOCK_SIZE_M`` when ``rows < BLOCK_SIZE_M``): a
size fixed by the shape, not by the counts. A program whose row tile is past
``num_tokens_post_padded`` (the padded tiles really used: ``sum_e ceil(count_e / BLOCK_SIZE_M)``
over local experts, ``ignore_invalid_experts=True`` under an expert map) returns at once. So the
*live* programs are ``tiles * cdiv(N_out, BLOCK_SIZE_N)``, and if ``r`` of them are resident per
SM on the H200's 132 SMs, each GEMM runs ``ceil(live / (132 r))`` waves of equally long programs.

This reads the committed measurements only (no new runs):

- the kernel-only load-spread arms (bf16 TP1 and EP2, bf16 TP1 small blocks N = 64..640, block
  FP8 TP1): each record's excess over its N's balanced record moved to its (A, M) by the shipped
  table (as ``bench/small_block_tiles.py``), against the extra tiles and the extra waves over
  the table's balanced histogram at (A, M);
- the TP1 engine's forwards with their captured counts (``docs/evidence/h200-tp1-validation``,
  ``comparison-f2.json``, policy ``histogram``, N >= 64): measured expert time minus the
  estimate (the balanced table at the forward's (N, A, M), no tile charge).

Per (arm, block size): one cost per extra tile (today's model) and one cost per extra wave,
where a wave of w2 counts ``K_w2 / K_w13 = 768 / 2048`` of a w13 wave (a program's MMA work is
its K; the w2 and w13 programs share BLOCK_SIZE_M/N), fitted through the origin on all, left one
distribution out, left one N out; residency r = 1..4 and the one derived from shared memory.

    PYTHONPATH=. .venv/bin/python bench/tile_waves.py \
        --out docs/evidence/h200-load-spread/waves.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from acquisition.estimate_validation import load_forwards
from moetables.errors import CoverageError
from moetables.lookup.tables import ComponentTables, DeploymentTables
from moetables.tiles import balanced_counts, row_tiles
from moetables.triton_config import KernelShape, TritonConfig

BF16 = "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FP8 = "bundles/H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
KERNELS = (
    Path("docs/evidence/h200-load-spread/load_spread.json"),
    Path("docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json"),
    Path("docs/evidence/h200-fp8-load-spread/load_spread_fp8.json"),
)
ENGINE = Path("docs/evidence/h200-tp1-validation")
SPREAD = ("uniform", "power_law(0.6)", "power_law(1.2)")

# Qwen3-30B-A3B: hidden 2048, expert intermediate 768, 128 experts, top 8.
HIDDEN, INTER, E_GLOBAL, TOP_K = 2048, 768, 128, 8
W13_OUT, W2_OUT = 2 * INTER, HIDDEN  # B.size(1) of each GEMM: its N_out
W2_WEIGHT = INTER / HIDDEN  # a w2 program's K (768) over a w13 program's K (2048)
# H200 (sm_90): 132 SMs, 228 KB shared memory per SM of which 227 KB for one block, 1 KB
# reserved per resident block, 64 warps and 32 blocks per SM.
SMS, SMEM_SM, SMEM_RESERVED, WARPS_SM, BLOCKS_SM = 132, 233472, 1024, 64, 32
RESIDENCIES = (1, 2, 3, 4)


def em(rows: int, block_m: int, expert_map: bool) -> int:
    """``EM`` of ``invoke_fused_moe_triton_kernel`` for ``rows`` token rows (sorted path)."""
    numel = rows * TOP_K
    if not expert_map and numel * 4 <= E_GLOBAL:
        return numel * block_m  # naive_block_assignment: one program row per pair
    padded = numel + E_GLOBAL * (block_m - 1)
    if numel < E_GLOBAL:
        padded = min(numel * block_m, padded)
    if rows < block_m:
        padded = min(padded, rows * TOP_K * block_m)
    return padded


def smem_bytes(c: TritonConfig, element_bytes: int) -> int:
    """The pipelined A and B tiles: num_stages * (BM * BK + BK * BN) elements."""
    return c.num_stages * (c.block_m * c.block_k + c.block_k * c.block_n) * element_bytes


def residency(c: TritonConfig, element_bytes: int) -> dict[str, Any]:
    """Programs per SM bounded by shared memory and warps (registers unknown without the
    compiled kernel: the fp32 accumulator alone is BM * BN / threads registers per thread)."""
    smem = smem_bytes(c, element_bytes)
    by_smem = SMEM_SM // (smem + SMEM_RESERVED)
    by_warps = WARPS_SM // c.num_warps
    return {
        "smem_bytes": smem,
        "by_smem": by_smem,
        "by_warps": by_warps,
        "acc_regs_per_thread": c.block_m * c.block_n // (32 * c.num_warps),
        "derived": max(1, min(by_smem, by_warps, BLOCKS_SM)),
    }


def grid(rows: int, c: TritonConfig, expert_map: bool) -> dict[str, int]:
    m_blocks = math.ceil(em(rows, c.block_m, expert_map) / c.block_m)
    return {
        "EM": em(rows, c.block_m, expert_map),
        "m_blocks": m_blocks,
        "n_tiles_w13": math.ceil(W13_OUT / c.block_n),
        "n_tiles_w2": math.ceil(W2_OUT / c.block_n),
        "programs_w13": m_blocks * math.ceil(W13_OUT / c.block_n),
        "programs_w2": m_blocks * math.ceil(W2_OUT / c.block_n),
    }


def waves(tiles: int, c: TritonConfig, r: int) -> tuple[int, int]:
    slots = SMS * r
    return (
        math.ceil(tiles * math.ceil(W13_OUT / c.block_n) / slots),
        math.ceil(tiles * math.ceil(W2_OUT / c.block_n) / slots),
    )


def weighted_waves(tiles: int, c: TritonConfig, r: int) -> float:
    w13, w2 = waves(tiles, c, r)
    return w13 + W2_WEIGHT * w2


ARMS: dict[str, tuple[str, int, int, str | None, tuple[int, int] | None, bool]] = {
    # arm: (bundle, tp, dp, config dtype, block shape, expert map)
    "tp1 bf16": (BF16, 1, 1, None, None, False),
    "ep2 bf16": (BF16, 1, 2, None, None, True),
    "tp1 fp8": (FP8, 1, 1, "fp8_w8a8", (128, 128), False),
}


def _arm(r: dict[str, Any]) -> str:
    return f"{r['deployment']} {r.get('dtype', 'bf16')}"


def _shape(arm: str) -> KernelShape:
    _, _, dp, dtype, block, _ = ARMS[arm]
    return KernelShape("NVIDIA_H200", E_GLOBAL // dp, INTER, dtype, block)


def kernel_records(
    tables: dict[str, DeploymentTables], kernels: Sequence[Path]
) -> list[dict[str, Any]]:
    raw = [r for k in kernels for r in json.loads(k.read_text())["results"] if "b2_us" in r]
    out = []
    for arm in ARMS:
        recs = [r for r in raw if _arm(r) == arm]
        t = tables[arm]
        for n in sorted({r["N"] for r in recs}):
            group = [r for r in recs if r["N"] == n]
            bal = next(r for r in group if r["distribution"] == "balanced")
            try:
                at_bal = t.time_us("experts", n, bal["A"], bal["M"])
            except CoverageError:
                at_bal = None  # past the table (N > 2,048): only records at the balanced (A, M)
            c = _shape(arm).config(n)
            if c.block_m != bal["block_m"]:
                raise ValueError(f"{arm} N={n}: config block {c.block_m} != {bal['block_m']}")
            for r in group:
                if at_bal is None:
                    if (r["A"], r["M"]) != (bal["A"], bal["M"]):
                        continue
                    moved = 0.0
                else:
                    moved = t.time_us("experts", n, r["A"], r["M"]) - at_bal
                counts = np.asarray(r["counts"], dtype=np.int64)
                out.append(
                    {
                        "arm": arm,
                        **{k: r[k] for k in ("N", "A", "M", "distribution", "seed", "block_m")},
                        "counts": counts,
                        "tiles": row_tiles(counts, c.block_m),
                        "balanced_tiles": row_tiles(balanced_counts(r["M"], r["A"]), c.block_m),
                        "measured_us": float(r["b2_us"]),
                        "excess_us": float(r["b2_us"]) - float(bal["b2_us"]) - moved,
                    }
                )
    return out


def engine_records(tables: DeploymentTables) -> list[dict[str, Any]]:
    cmp = json.loads((ENGINE / "comparison-f2.json").read_text())
    counts = {}
    for routing in sorted({row["routing"] for row in cmp["forwards"]}):
        forwards, _ = load_forwards(ENGINE, routing)
        for f in forwards:
            counts[(routing, f.rep, f.step)] = f.global_counts
    shape = _shape("tp1 bf16")
    out = []
    for row in cmp["forwards"]:
        if row["policy"] != "histogram" or row["N"] < 64:
            continue
        c = counts[(row["routing"], row["rep"], row["step"])]
        block = shape.config(row["N"]).block_m
        a, m = int((c > 0).sum()), int(c.sum())
        out.append(
            {
                "arm": "engine tp1 bf16",
                "N": row["N"],
                "A": a,
                "M": m,
                "distribution": row["routing"],
                "seed": row["rep"],
                "block_m": block,
                "counts": c,
                "tiles": row_tiles(c, block),
                "balanced_tiles": row_tiles(balanced_counts(m, a), block),
                "measured_us": float(row["experts_measured_us"]),
                "excess_us": float(row["experts_measured_us"] - row["experts_estimate_us"]),
            }
        )
    return out


def _x(rec: dict[str, Any], model: str) -> float:
    if model == "tiles":
        return float(rec["tiles"] - rec["balanced_tiles"])
    c = _shape("tp1 bf16" if rec["arm"].startswith("engine") else rec["arm"]).config(rec["N"])
    r = int(model.split("=")[1]) if "=" in model else _residency(rec)
    return weighted_waves(rec["tiles"], c, r) - weighted_waves(rec["balanced_tiles"], c, r)


def _residency(rec: dict[str, Any]) -> int:
    arm = "tp1 bf16" if rec["arm"].startswith("engine") else rec["arm"]
    c = _shape(arm).config(rec["N"])
    derived: int = residency(c, 1 if "fp8" in arm else 2)["derived"]
    return derived


MODELS = ("tiles", "waves derived", *(f"waves r={r}" for r in RESIDENCIES))


def fit(recs: Sequence[dict[str, Any]], model: str) -> float | None:
    x = np.array([_x(r, model) for r in recs])
    y = np.array([r["excess_us"] for r in recs])
    if not (x @ x):
        return None
    return float(x @ y / (x @ x))


def errors(recs: Sequence[dict[str, Any]], cost: float, model: str) -> dict[str, float]:
    """Errors of measured time predicted as (measured - excess) + cost * x, relative."""
    e = [
        abs((r["measured_us"] - r["excess_us"] + cost * _x(r, model)) / r["measured_us"] - 1)
        for r in recs
    ]
    return {"median": statistics.median(e), "max": max(e), "rms_us": _rms(recs, cost, model)}


def _rms(recs: Sequence[dict[str, Any]], cost: float, model: str) -> float:
    d = [r["excess_us"] - cost * _x(r, model) for r in recs]
    return float(np.sqrt(np.mean(np.square(d))))


def held_out(recs: Sequence[dict[str, Any]], key: str, model: str) -> dict[str, Any]:
    """Fit on all but one value of ``key``, predict that value's spread records."""
    out: dict[str, Any] = {}
    pooled: list[float] = []
    for v in sorted({r[key] for r in recs}, key=str):
        rest = [r for r in recs if r[key] != v]
        mine = [r for r in recs if r[key] == v and r["distribution"] != "balanced"]
        cost = fit(rest, model)
        if not mine or cost is None:
            continue
        out[str(v)] = {"cost_us": cost, "records": len(mine), **errors(mine, cost, model)}
        pooled += [r["excess_us"] - cost * _x(r, model) for r in mine]
    if pooled:
        out["rms_us_pooled"] = float(np.sqrt(np.mean(np.square(pooled))))
    return out


def group_report(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ns = sorted({r["N"] for r in recs})
    models: dict[str, Any] = {}
    for model in MODELS:
        cost = fit(recs, model)
        models[model] = {
            "cost_us_all": cost,
            "all": errors(recs, cost, model) if cost is not None else None,
            "per_N_cost_us": {str(n): fit([r for r in recs if r["N"] == n], model) for n in ns},
            "left_out_distribution": held_out(recs, "distribution", model),
            "left_out_N": held_out(recs, "N", model) if len(ns) > 1 else {},
        }
    return {"N": ns, "records": len(recs), "models": models}


def per_record(r: dict[str, Any]) -> dict[str, Any]:
    arm = "tp1 bf16" if r["arm"].startswith("engine") else r["arm"]
    c = _shape(arm).config(r["N"])
    rd = _residency(r)
    return {
        **{k: r[k] for k in ("N", "A", "M", "distribution", "seed", "block_m", "tiles")},
        "balanced_tiles": r["balanced_tiles"],
        "waves": list(waves(r["tiles"], c, rd)),
        "balanced_waves": list(waves(r["balanced_tiles"], c, rd)),
        "waves_r2": list(waves(r["tiles"], c, 2)),
        "balanced_waves_r2": list(waves(r["balanced_tiles"], c, 2)),
        "measured_us": r["measured_us"],
        "excess_us": r["excess_us"],
    }


def shapes_report(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and N: the configuration, the launched grid, residency bounds."""
    out: dict[str, Any] = {}
    for arm, n in sorted({(r["arm"], r["N"]) for r in recs}):
        base = "tp1 bf16" if arm.startswith("engine") else arm
        c = _shape(base).config(n)
        expert_map = ARMS[base][5]
        out[f"{arm} {n}"] = {
            "config": [c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages],
            **grid(n, c, expert_map),
            "residency": residency(c, 1 if "fp8" in base else 2),
        }
    return out


def report(kernels: Sequence[Path] = KERNELS) -> dict[str, Any]:
    bf16 = ComponentTables(BF16)
    fp8 = ComponentTables(FP8)
    tables = {
        "tp1 bf16": bf16.deployment(1, 1, 0),
        "ep2 bf16": bf16.deployment(1, 2, 0),
        "tp1 fp8": fp8.deployment(1, 1, 0),
    }
    recs = kernel_records(tables, kernels) + engine_records(tables["tp1 bf16"])
    groups: dict[str, Any] = {}
    for arm, block in sorted({(r["arm"], r["block_m"]) for r in recs}):
        mine = [r for r in recs if r["arm"] == arm and r["block_m"] == block]
        groups[f"{arm} {block}"] = {
            "arm": arm,
            "block_m": block,
            **group_report(mine),
            "per_record": [per_record(r) for r in mine],
        }
    # The engine's steps charged with the kernel's own costs (out of sample for the engine).
    engine = [r for r in recs if r["arm"].startswith("engine")]
    transfer: dict[str, Any] = {}
    for block in sorted({r["block_m"] for r in engine}):
        mine = [r for r in engine if r["block_m"] == block]
        k = groups.get(f"tp1 bf16 {block}")
        if k is None:
            continue
        per_model = {}
        for model in MODELS:
            cost = k["models"][model]["cost_us_all"]
            if cost is None:
                continue
            per_n = {}
            for n in sorted({r["N"] for r in mine}):
                rn = [r for r in mine if r["N"] == n]
                per_n[str(n)] = {
                    "before": errors(rn, 0.0, model),
                    "after": errors(rn, cost, model),
                    "by_routing": {
                        d: {
                            "before": errors(rd, 0.0, model),
                            "after": errors(rd, cost, model),
                        }
                        for d in sorted({r["distribution"] for r in rn})
                        if (rd := [r for r in rn if r["distribution"] == d])
                    },
                }
            per_model[model] = {"kernel_cost_us": cost, "per_N": per_n}
        transfer[str(block)] = per_model
    return {
        "sources": {
            "kernels": [str(k) for k in kernels],
            "engine": str(ENGINE / "comparison-f2.json"),
            "bundles": {"bf16": BF16, "fp8": FP8},
        },
        "h200": {"sms": SMS, "smem_per_sm": SMEM_SM, "warps_per_sm": WARPS_SM},
        "w2_wave_weight": W2_WEIGHT,
        "shapes": shapes_report(recs),
        "groups": groups,
        "engine_with_kernel_costs": transfer,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def print_report(rep: dict[str, Any]) -> None:
    print(
        "arm N: config [BM BN BK G warps stages] | EM m_blocks grid13 grid2 | smem r_smem r_warps"
    )
    for name, s in rep["shapes"].items():
        res = s["residency"]
        print(
            f"  {name}: {s['config']} | {s['EM']} {s['m_blocks']} {s['programs_w13']} "
            f"{s['programs_w2']} | {res['smem_bytes']} {res['by_smem']} {res['by_warps']}"
        )
    for name, g in rep["groups"].items():
        print(f"\n{name}-row blocks, N {g['N']}, {g['records']} records")
        for model, m in g["models"].items():
            if m["cost_us_all"] is None:
                print(f"  {model}: no variation")
                continue
            lod, lon = m["left_out_distribution"], m["left_out_N"]
            print(
                f"  {model:14s} cost {m['cost_us_all']:7.3f} us; all rms {m['all']['rms_us']:.2f}"
                f" us; LOdist rms {lod.get('rms_us_pooled', float('nan')):.2f}"
                f"; LON rms {lon.get('rms_us_pooled', float('nan')):.2f}; per N "
                + ", ".join(
                    f"{n}: {'-' if c is None else f'{c:.2f}'}"
                    for n, c in m["per_N_cost_us"].items()
                )
            )
    print("\nengine steps charged with the kernel's costs: median/max |error| % before -> after")
    for block, per_model in rep["engine_with_kernel_costs"].items():
        for model in ("tiles", "waves derived", "waves r=2"):
            if model not in per_model:
                continue
            pm = per_model[model]
            for n, e in pm["per_N"].items():
                b, a = e["before"], e["after"]
                print(
                    f"  {block}-row N={n} {model} ({pm['kernel_cost_us']:.2f} us): "
                    f"{_pct(b['median'])}/{_pct(b['max'])} -> {_pct(a['median'])}/{_pct(a['max'])}"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    rep = report()
    print_report(rep)
    if args.out is not None:
        args.out.write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
