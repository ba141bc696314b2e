"""Wave probe of vLLM's Triton expert kernel on the H200 (issue 18; docs/benchmarks.md, "Waves,
not tiles, at 32-row blocks"; not yet run).

Two things the CPU analysis (``bench/tile_waves.py``) cannot settle:

1. residency: how many ``fused_moe_kernel`` programs fit on one SM for each configuration (shared
   memory alone says 1 at the 32-row config, the fit says 2): the compiled kernels' ``n_regs``,
   ``n_spills`` and ``metadata.shared``, read from Triton's cache after running them;
2. the step: expert time at fixed (N, A = 128, M = 8 N) with the row tiles moved one at a time
   (128 + j tiles: j experts get ``block_m + 1`` pairs, the rest share the remainder, each at most
   ``block_m``), so time against tiles shows whether it climbs per tile or per wave.

Run (from the repository root after staging the kit; about 30 s):

    source .kit/bin/env.sh && timeout 240 python3 scripts/h200_wave_probe.py $OUT/wave_probe.json

The count construction is pure Python (CPU-tested in ``tests/acquisition/test_tile_waves_evidence.py``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HIDDEN, INTER, E, TOP_K = 2048, 768, 128, 8
TOKENS = (200, 256, 384)
EXTRA = tuple(range(0, 33))  # 128 .. 160 tiles
ITERS = 20


def tile_counts(tokens: int, block_m: int, extra: int) -> list[int]:
    """Per-expert counts of ``tokens * TOP_K`` pairs over all E experts running ``E + extra``
    row tiles: ``extra`` experts with ``block_m + 1`` pairs (two tiles), the rest as even as
    integers allow, each within one tile (so exactly one tile each)."""
    pairs = tokens * TOP_K
    rest, left = pairs - extra * (block_m + 1), E - extra
    if extra < 0 or left < 1 or rest < left:
        raise ValueError(f"cannot spread {pairs} pairs to {E + extra} tiles")
    base, more = divmod(rest, left)
    if base + (1 if more else 0) > block_m:
        raise ValueError(f"{rest} pairs over {left} experts exceed one {block_m}-row tile each")
    out = [block_m + 1] * extra + [base + 1] * more + [base] * (left - more)
    if max(out) > tokens:
        raise ValueError("an expert would need more pairs than tokens")
    return out


def topk_ids(counts: list[int], tokens: int) -> list[list[int]]:
    """Token rows of TOP_K distinct experts with these counts: the experts' pairs laid out in
    order, token t taking positions t, t + tokens, ...; an expert's pairs are contiguous and at
    most ``tokens`` long, so no token gets one expert twice."""
    flat = [e for e, c in enumerate(counts) for _ in range(c)]
    if len(flat) != tokens * TOP_K:
        raise ValueError("counts must sum to tokens * TOP_K")
    return [[flat[t + k * tokens] for k in range(TOP_K)] for t in range(tokens)]


def _compiled(kernel: Any) -> list[dict[str, Any]]:
    """n_regs / n_spills / shared of every compiled variant in Triton's cache (version-tolerant)."""
    out: list[dict[str, Any]] = []
    caches = getattr(kernel, "device_caches", {})
    for entry in caches.values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for key, k in dict(cache).items():
            # Older/newer Triton: the attributes may already be there, or this may not exist.
            with contextlib.suppress(Exception):
                k._init_handles()
            meta = getattr(k, "metadata", None)
            out.append(
                {
                    "key": str(key)[:400],
                    "n_regs": getattr(k, "n_regs", None),
                    "n_spills": getattr(k, "n_spills", None),
                    "shared": getattr(meta, "shared", None),
                    "num_warps": getattr(meta, "num_warps", None),
                    "num_stages": getattr(meta, "num_stages", None),
                }
            )
    return out


def main(argv: list[str]) -> int:  # pragma: no cover - needs the GPU
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm.model_executor.layers.fused_moe import fused_experts
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    out_path = Path(argv[0])
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn((E, 2 * INTER, HIDDEN), generator=gen, device=dev) * HIDDEN**-0.5).to(
        torch.bfloat16
    )
    w2 = (torch.randn((E, HIDDEN, INTER), generator=gen, device=dev) * INTER**-0.5).to(
        torch.bfloat16
    )
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__}
    results: list[dict[str, Any]] = []

    def kernel_us(call: Any) -> float:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(ITERS):
                call()
            torch.cuda.synchronize()
        times = [
            e.time_range.elapsed_us()
            for e in prof.events()
            if str(e.device_type).endswith("CUDA") and "fused_moe_kernel" in e.name
        ]
        per = [sum(times[i * 2 : i * 2 + 2]) for i in range(len(times) // 2)]
        return float(statistics.median(per))

    for n in TOKENS:
        x = torch.randn((n, HIDDEN), generator=gen, device=dev).to(torch.bfloat16)
        tw = torch.full((n, TOP_K), 1.0 / TOP_K, device=dev)
        block_m = int(
            fm.try_get_optimal_moe_config(w13.shape, w2.shape, TOP_K, None, n)["BLOCK_SIZE_M"]
        )
        for j in EXTRA:
            try:
                counts = tile_counts(n, block_m, j)
            except ValueError:
                continue
            ids = torch.tensor(topk_ids(counts, n), device=dev, dtype=torch.int64)
            call = functools.partial(fused_experts, x, w13, w2, tw, ids, global_num_experts=E)
            rec = {"N": n, "block_m": block_m, "tiles": E + j, "us": kernel_us(call)}
            results.append(rec)
            print(json.dumps(rec), flush=True)
        out_path.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    meta["compiled"] = _compiled(fm.fused_moe_kernel)
    out_path.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
