"""The H200 wave probe against the shipped charges (issue 18, 32-row blocks).

``docs/evidence/h200-wave-probe/wave_probe.json`` (``scripts/h200_wave_probe.py``): the two
``fused_moe_kernel`` launches of vLLM's ``fused_experts`` for Qwen3-30B-A3B bf16 at N = 200, 256
and 384 (vLLM's tuned 32-row config, BLOCK_SIZE_N 256), A = 128, M = 8 N, with constructed counts
running 128, 129, ..., 160 row tiles. Neither the wave cost nor the tile cost was fitted on it,
so each N's extra time over its 128-tile record is an out-of-sample check of both charges:

- waves (bundle format 5, shipped): 17.57 us per weighted wave at 2 programs per SM on 132 SMs;
- tiles (format 4, before): 0.714 us per 32-row tile.

It also derives the residency the compiled kernels allow (registers and shared memory per SM of
sm_90: 65,536 registers, allocated per warp in units of 256; 228 KiB shared memory, 1 KiB
reserved per block).

    PYTHONPATH=. .venv/bin/python bench/wave_probe.py --figure docs/figures/wave_probe.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from moetables.waves import WaveGrid

PROBE = Path("docs/evidence/h200-wave-probe/wave_probe.json")
WAVE_COST, TILE_COST = 17.57, 0.714
GRID = WaveGrid(sms=132, programs_per_sm=2, hidden=2048, intermediate=768)
BLOCK_N = 256
REGS_SM, REG_UNIT, SMEM_SM, SMEM_RESERVED, THREADS_WARP = 65536, 256, 233472, 1024, 32


def residency(compiled: dict[str, Any]) -> dict[str, int]:
    """Programs per SM the compiled variant allows, by registers and by shared memory."""
    warps = int(compiled["num_warps"])
    per_warp = math.ceil(int(compiled["n_regs"]) * THREADS_WARP / REG_UNIT) * REG_UNIT
    return {
        "by_registers": REGS_SM // (per_warp * warps),
        "by_shared_memory": SMEM_SM // (int(compiled["shared"]) + SMEM_RESERVED),
    }


def report(path: Path = PROBE) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    out: dict[str, Any] = {
        "meta": {k: v for k, v in raw["meta"].items() if k != "compiled"},
        "compiled": [
            {k: c[k] for k in ("n_regs", "n_spills", "shared", "num_warps", "num_stages")}
            | residency(c)
            for c in raw["meta"]["compiled"]
        ],
        "per_N": {},
    }
    for n in sorted({r["N"] for r in raw["results"]}):
        rows = sorted((r for r in raw["results"] if r["N"] == n), key=lambda r: r["tiles"])
        tiles = np.array([r["tiles"] for r in rows])
        us = np.array([r["us"] for r in rows])
        excess = us - us[tiles == 128][0]
        waves = WAVE_COST * (GRID.waves(tiles, BLOCK_N) - GRID.waves(128, BLOCK_N))
        flat = tiles >= 133
        out["per_N"][str(n)] = {
            "us_at_128": float(us[tiles == 128][0]),
            "step_132_to_133_us": float(us[tiles == 133][0] - us[tiles == 132][0]),
            "excess_at_132_us": float(excess[tiles == 132][0]),
            "excess_133_to_160_us": [float(excess[flat].min()), float(excess[flat].max())],
            "predicted_step_us": float(
                WAVE_COST * (GRID.waves(133, BLOCK_N) - GRID.waves(132, BLOCK_N))
            ),
            "rms_us": {
                "waves": float(np.sqrt(np.mean((excess - waves) ** 2))),
                "tiles": float(np.sqrt(np.mean((excess - TILE_COST * (tiles - 128)) ** 2))),
            },
            "max_abs_error_pct": {
                "waves": float(100 * np.max(np.abs((excess - waves) / us))),
                "tiles": float(100 * np.max(np.abs((excess - TILE_COST * (tiles - 128)) / us))),
            },
        }
    return out


def figure(path: Path, out: Path) -> None:
    """Excess over 128 tiles against the tiles, per N, with both charges' predictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(7, 4.2))
    t = np.arange(128, 161)
    for n, style in zip((200, 256, 384), ("C0o-", "C1s-", "C2^-"), strict=True):
        rows = sorted((r for r in raw["results"] if r["N"] == n), key=lambda r: r["tiles"])
        us = np.array([r["us"] for r in rows])
        ax.plot(
            [r["tiles"] for r in rows], us - us[0], style, ms=3, lw=0.8, label=f"measured, N = {n}"
        )
    ax.plot(t, WAVE_COST * (GRID.waves(t, BLOCK_N) - GRID.waves(128, BLOCK_N)), "k-", lw=2,
            label=f"waves: {WAVE_COST} us per weighted wave, 2 programs/SM, 132 SMs")  # fmt: skip
    ax.plot(t, TILE_COST * (t - 128), "k--", label=f"tiles: {TILE_COST} us per tile (format 4)")
    ax.set_xlabel("row tiles run (32-row blocks; 128 = one per expert)")
    ax.set_ylabel("fused_moe_kernel time over 128 tiles (us)")
    ax.set_title("H200, Qwen3-30B-A3B bf16 TP1: vLLM's expert kernel, tiles 128..160")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", type=Path, nargs="?", default=PROBE)
    p.add_argument("--figure", type=Path, help="write the step figure here")
    args = p.parse_args(argv)
    if args.figure is not None:
        figure(args.probe, args.figure)
        return 0
    print(json.dumps(report(args.probe), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
