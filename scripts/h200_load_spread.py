"""Issue 18, part 1: expert kernel time under spread per-expert loads at the tables' own (N, A, M).

On one H200 with the vLLM kit staged (docs/h200-runs.md), it times vLLM 0.26.0's
``fused_experts`` (the Triton kernels of ``TritonExperts``) for Qwen3-30B-A3B at these
deployments (``--deployments``; the first two by default, as session 4 ran them):

- ``tp1``: all 128 experts local (the TP1/DP1 table; tuned H200 config file E=128,N=768);
- ``ep2``: EP rank 0 of 2, 64 local experts through an expert map (the DP2/EP2 tables; no tuned
  bf16 file, vLLM's default config);
- ``ep4``, ``ep8``: EP rank 0 of 4 (32 local experts) and of 8 (16), the wide-EP rank tables
  (`bundles/H200-vllm-modular-dp4-f4`, `-dp8-f4`; vLLM's default config);

and, at each N, under these per-expert load distributions, all with the same N rows and top-k:

- ``balanced``: the acquisition's stimulus (`acquisition.protocol.stimulus.routing_stimulus`),
  M/A pairs per active expert as evenly as integers allow (what the tables hold);
- ``uniform``: every token picks k distinct experts uniformly (a multinomial over the experts);
- ``power_law(alpha)`` for alpha in ALPHAS: k distinct experts per token, drawn with probability
  proportional to (expert rank)^-alpha over a random expert order (torch.multinomial without
  replacement);

DRAWS seeded draws per spread distribution. Per record: the local per-expert counts' summary
(A, M, max, coefficient of variation), vLLM's BLOCK_SIZE_M for the shape and the row tiles the
kernel runs (`moetables.tiles`), and the median over ITERS calls of the profiler's kernel sum
(per kernel name as well). The B/2B control of the method: each record is timed at ITERS and
2 x ITERS calls and both medians are kept (``b_us``, ``b2_us``); a record whose two differ by more
than 3 % is flagged ``unstable``.

    python3 scripts/h200_load_spread.py $OUT/load_spread.json        # GPU machine, kit staged
    python3 scripts/h200_load_spread.py $OUT/load_spread.json --quick  # 2 N values, 2 draws

``--dtype fp8`` times Qwen3-30B-A3B-Instruct-2507-FP8's kernel instead: block-wise FP8 (e4m3
weights, one float32 scale per 128 x 128 block, quantized as `acquisition.adapters.vllm_fp8`
does; activations quantized per token and 128-wide group inside the call), vLLM's
``fp8_w8a8_moe_quant_config`` with ``block_shape=[128, 128]``: the Triton path (``TritonExperts``)
vLLM's FP8 oracle picks at DP1 on the H200, whose block size comes from the tuned
``E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json`` (64-row
blocks from 200 rows on: never the bf16 path's 128). Run it with ``VLLM_USE_DEEP_GEMM=0``, as
the shipped FP8 tables were (docs/h200-runs.md, "FP8 on one H200"). ``--deployments`` and
``--tokens`` pick a subset (scripts/h200_spread_rest.sh).

Any catalog model (``--model``, default Qwen3-30B-A3B-Instruct-2507): its global experts, top-k,
hidden size and expert width come from `acquisition.catalog`, and ``epX`` is EP rank 0 of X
for any X dividing the experts (so ``--model allenai/OLMoE-1B-7B-0924 --deployments tp1,ep2``
times OLMoE's 64-expert kernel and its DP2/EP2 rank's 32). The raw file's ``meta.model``
records the model and its geometry, which `acquisition.load_spread` checks against the bundle.

Then, here (CPU): the time against tiles and against spread (bench/load_spread.py reads the
engine evidence; extend it with this file's records: fit c = d(time)/d(tiles) at fixed (N, A, M)
per deployment, leave one distribution out).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
DEFAULT_DEPLOYMENTS = ("tp1", "ep2")
TOKENS = (256, 1024, 1536, 2048, 3072, 4096)
QUICK_TOKENS = (2048, 4096)
ALPHAS = (0.6, 1.2)
DRAWS, QUICK_DRAWS = 4, 2
ITERS = 10
STABLE = 0.03
# Qwen3-30B-A3B-Instruct-2507-FP8's weight_block_size.
FP8_BLOCK = (128, 128)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument(
        "--deployments", default=",".join(DEFAULT_DEPLOYMENTS), help="e.g. tp1, tp1,ep2 or ep4,ep8"
    )
    ap.add_argument("--tokens", default=None, help="comma-separated N (default: TOKENS)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a catalog model (its MoE geometry)")
    args = ap.parse_args(argv)
    from acquisition.catalog import resolve_model
    from acquisition.load_spread import geometry_record

    model = resolve_model(args.model)
    experts, top_k = model.global_experts, model.top_k
    hidden, width = model.hidden_size, model.expert_intermediate_size
    if model.activation != "silu":
        # fused_experts below runs vLLM's default gated SiLU; another activation is another kernel.
        ap.error(f"{model.name}: activation {model.activation!r}, this script times silu only")
    try:
        deployments = {d: local_experts(d, experts) for d in args.deployments.split(",")}
    except ValueError as exc:
        ap.error(str(exc))

    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm.model_executor.layers.fused_moe import fused_experts

    from acquisition.protocol.stimulus import routing_stimulus
    from moetables.geometry import ExpertGeometry
    from moetables.tiles import block_size_m, row_tiles

    try:
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device("cuda", 0))
    except Exception:  # the functional path may not need it
        pass
    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(7)
    tokens: tuple[int, ...] = QUICK_TOKENS if args.quick else TOKENS
    if args.tokens:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    fp8 = args.dtype == "fp8"
    kernel_dtype, fp8_block = ("fp8_w8a8", FP8_BLOCK) if fp8 else (None, None)
    draws = QUICK_DRAWS if args.quick else DRAWS

    def kernel_sum(call: Any, iters: int) -> tuple[float, dict[str, float]]:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                call()
            torch.cuda.synchronize()
        kernels = sorted(
            (e for e in prof.events() if str(e.device_type).endswith("CUDA")),
            key=lambda e: e.time_range.start,
        )
        per = len(kernels) // iters
        sums = [
            sum(e.time_range.elapsed_us() for e in kernels[i * per : (i + 1) * per])
            for i in range(iters)
        ]
        names: dict[str, list[float]] = {}
        for e in kernels:
            names.setdefault(e.name[:50], []).append(e.time_range.elapsed_us())
        return float(statistics.median(sums)), {
            k: round(sum(v) / iters, 3) for k, v in names.items()
        }

    def spread_ids(n: int, dist: str, seed: int) -> torch.Tensor:
        g = torch.Generator(device=dev).manual_seed(seed)
        if dist == "uniform":
            weights = torch.ones(experts, device=dev)
        else:
            alpha = float(dist.split("(")[1].rstrip(")"))
            ranks = torch.randperm(experts, generator=g, device=dev).to(torch.float64) + 1.0
            weights = ranks ** (-alpha)
        probs = weights.float().expand(n, experts).contiguous()
        return torch.multinomial(probs, top_k, replacement=False, generator=g)

    results: list[dict[str, Any]] = []
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "uuid": str(torch.cuda.get_device_properties(0).uuid),
        "torch": torch.__version__,
        "vllm_tiles_model": "moetables.tiles (vLLM 0.26.0)",
        "dtype": args.dtype,
        "vllm_use_deep_gemm": os.environ.get("VLLM_USE_DEEP_GEMM"),
        "model": geometry_record(model),
    }

    def save() -> None:
        # Rewritten after every N: a run stopped by its time limit keeps what it measured.
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))

    for name, local in deployments.items():
        emap_list = list(range(local)) + [-1] * (experts - local)
        emap = torch.tensor(emap_list, dtype=torch.int32, device=dev) if local < experts else None
        geometry = ExpertGeometry(global_experts=experts, top_k=top_k, local_experts=local)
        w13 = (
            torch.randn((local, 2 * width, hidden), generator=gen, device=dev) * hidden**-0.5
        ).to(torch.bfloat16)
        w2 = (torch.randn((local, hidden, width), generator=gen, device=dev) * width**-0.5).to(
            torch.bfloat16
        )
        quant: dict[str, Any] = {}
        if fp8:
            from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

            from acquisition.adapters.vllm_fp8 import _block_quantize

            w13, s13 = _block_quantize(w13, FP8_BLOCK, torch.float8_e4m3fn)
            w2, s2 = _block_quantize(w2, FP8_BLOCK, torch.float8_e4m3fn)
            quant["quant_config"] = fp8_w8a8_moe_quant_config(
                w1_scale=s13, w2_scale=s2, block_shape=list(FP8_BLOCK)
            )
        for n in tokens:
            x = torch.randn((n, hidden), generator=gen, device=dev).to(torch.bfloat16)
            bm = block_size_m(n, local, width, dtype=kernel_dtype, block_shape=fp8_block)
            arms = [("balanced", 0)] + [
                (d, s)
                for d in ("uniform", *(f"power_law({a})" for a in ALPHAS))
                for s in range(draws)
            ]
            for dist, seed in arms:
                rec: dict[str, Any] = {
                    "deployment": name,
                    "dtype": args.dtype,
                    "local_experts": local,
                    "N": n,
                    "distribution": dist,
                    "seed": seed,
                    "block_m": bm,
                }
                try:
                    if dist == "balanced":
                        pairs = -(-n * top_k * local // experts)
                        s = routing_stimulus(
                            geometry, emap_list, n, min(local, pairs), pairs, seed=3
                        )
                        ids = torch.tensor(s.topk_ids, device=dev).to(torch.int64)
                        tw = torch.tensor(s.topk_weights, device=dev).to(torch.float32)
                    else:
                        ids = spread_ids(n, dist, 1000 + seed)
                        tw = torch.full((n, top_k), 1.0 / top_k, device=dev)
                    flat = ids.flatten().cpu().numpy()
                    counts = np.bincount(flat[flat < local], minlength=local)
                    active = counts[counts > 0]
                    rec.update(
                        A=int(active.size),
                        M=int(counts.sum()),
                        max=int(counts.max()),
                        cv=float(active.std() / active.mean()) if active.size else 0.0,
                        tiles=row_tiles(counts, bm),
                        counts=counts.tolist(),
                    )
                    kw: dict[str, Any] = {"global_num_experts": experts, **quant}
                    if emap is not None:
                        kw["expert_map"] = emap
                    call = functools.partial(fused_experts, x, w13, w2, tw, ids, **kw)
                    b, by_kernel = kernel_sum(call, ITERS)
                    b2, _ = kernel_sum(call, 2 * ITERS)
                    rec.update(
                        b_us=b, b2_us=b2, unstable=abs(b2 / b - 1) > STABLE, by_kernel=by_kernel
                    )
                except Exception:
                    rec["error"] = traceback.format_exc()[-1500:]
                results.append(rec)
                print(
                    json.dumps({k: v for k, v in rec.items() if k not in ("counts", "by_kernel")}),
                    flush=True,
                )
            save()
    save()
    return 0


def local_experts(deployment: str, experts: int) -> int:
    """``tp1``: every expert local; ``epX``: EP rank 0 of X, experts / X of them (the names
    `acquisition.load_spread.table_dp` reads back)."""
    from acquisition.load_spread import table_dp

    ranks = table_dp(deployment)
    if experts % ranks:
        raise ValueError(f"{deployment}: {experts} experts do not divide over {ranks} ranks")
    return experts // ranks


if __name__ == "__main__":
    raise SystemExit(main())
