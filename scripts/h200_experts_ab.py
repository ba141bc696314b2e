"""Why the engine's expert kernels differ from the table's at the same (N, A, M): an A/B on one GPU.

The DP2/EP2 validation (docs/benchmarks.md, "Layer estimate on two H200s") found the engine's
expert kernels about 12 % slower than the shipped table at the table's own point N=4096, A=64,
M=16384, while the table reproduces on another H200 within 0.1 %. The two differ in the routing
(the acquisition's balanced stimulus vs. a router's random top-k) and in the values (the
acquisition's randn weights and activations vs. vLLM's dummy weights, uniform in +-1e-3, and the
engine's small activations). This times vLLM's own ``fused_experts`` (the same Triton kernels as
``TritonExperts``, EP rank 0 of 2: 64 local experts) for each combination, by profiler kernel sums.

    python3 scripts/h200_experts_ab.py $OUT/experts_ab.json     # GPU machine, kit staged
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, expert width 768; EP rank 0 of 2 owns 64.
E, L, K, H, INTER = 128, 64, 8, 2048, 768


def main(out: str) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm.model_executor.layers.fused_moe import fused_experts

    from acquisition.protocol.stimulus import routing_stimulus
    from moetables.geometry import ExpertGeometry

    try:
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device("cuda", 0))
    except Exception:  # the functional path may not need it
        pass
    dev = torch.device("cuda", 0)
    emap_list = list(range(L)) + [-1] * (E - L)
    emap = torch.tensor(emap_list, dtype=torch.int32, device=dev)
    geometry = ExpertGeometry(global_experts=E, top_k=K, local_experts=L)
    gen = torch.Generator(device=dev).manual_seed(7)

    def weights(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        if kind == "acquisition":  # acquisition.adapters.vllm_modular: randn scaled by fan-in
            w13 = torch.randn((L, 2 * INTER, H), generator=gen, device=dev) * H**-0.5
            w2 = torch.randn((L, H, INTER), generator=gen, device=dev) * INTER**-0.5
        else:  # vLLM's dummy loader: uniform in [-1e-3, 1e-3]
            w13 = torch.empty((L, 2 * INTER, H), device=dev).uniform_(-1e-3, 1e-3, generator=gen)
            w2 = torch.empty((L, H, INTER), device=dev).uniform_(-1e-3, 1e-3, generator=gen)
        return w13.to(torch.bfloat16), w2.to(torch.bfloat16)

    def hidden(kind: str, n: int) -> torch.Tensor:
        if kind == "acquisition":
            return torch.randn((n, H), generator=gen, device=dev).to(torch.bfloat16)
        return (
            torch.empty((n, H), device=dev).uniform_(-1e-3, 1e-3, generator=gen).to(torch.bfloat16)
        )

    def routing(kind: str, n: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        if kind == "stimulus":
            s = routing_stimulus(geometry, emap_list, n, L, n * K // 2, seed=3)
            ids = torch.tensor(s.topk_ids, device=dev)
            w = torch.tensor(s.topk_weights, device=dev)
        else:  # a router's top-k of random scores: k distinct experts per token, uniform
            scores = torch.rand((n, E), generator=gen, device=dev)
            w, ids = torch.topk(torch.softmax(scores, dim=-1), K, dim=-1)
            w = (w / w.sum(dim=-1, keepdim=True)).float()
        local = ids[ids < L]
        return (
            ids.to(torch.int64),
            w.to(torch.float32),
            int(torch.unique(local).numel()),
            int(local.numel()),
        )

    results = []
    for n in (4096, 2048):
        for data in ("acquisition", "dummy"):
            w13, w2 = weights(data)
            x = hidden(data, n)
            for route in ("stimulus", "random"):
                rec = {"N": n, "data": data, "routing": route}
                try:
                    ids, tw, a, m = routing(route, n)
                    rec.update(A=a, M=m)

                    call = functools.partial(
                        fused_experts, x, w13, w2, tw, ids, global_num_experts=E, expert_map=emap
                    )

                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    iters = 10
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(iters):
                            call()
                        torch.cuda.synchronize()
                    kernels = sorted(
                        (
                            e
                            for e in prof.events()
                            if e.device_type == torch.autograd.DeviceType.CUDA
                        ),
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
                    rec.update(
                        kernels_per_call=per,
                        kernel_sum_us=statistics.median(sums),
                        sums=sums,
                        by_kernel={k: round(sum(v) / iters, 3) for k, v in names.items()},
                    )
                except Exception:
                    rec["error"] = traceback.format_exc()[-1500:]
                results.append(rec)
                print(
                    json.dumps({k: v for k, v in rec.items() if k not in ("sums", "by_kernel")}),
                    flush=True,
                )
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "uuid": str(torch.cuda.get_device_properties(0).uuid),
        "torch": torch.__version__,
    }
    Path(out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
