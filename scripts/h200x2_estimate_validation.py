"""Validation of the MoE layer estimate on a real vLLM engine: DP/EP (issue 11 part 5; issue 16 at
DP4) and TP1 without EP (``--dp 1``, issue 18 part 3).

On the GPU machine (vLLM from the kit staged and ``source .kit/bin/env.sh`` done):

    python3 scripts/h200x2_estimate_validation.py run --dp 2 --routing simulator --out $OUT/validation
    python3 scripts/h200x2_estimate_validation.py run --dp 2 --routing native    --out $OUT/validation
    python3 scripts/h200x2_estimate_validation.py run --dp 1 --routing simulator \
        --strategy normal_routing --out $OUT/validation                      # one GPU, TP1

``--dp 1`` starts one plain TP1 engine (no data-parallel group, no expert parallelism: all 128
experts local, vLLM's tuned H200 config) and steps N through ``TP1_TOKENS`` (1 to 2,048).

``--dp`` >= 2 starts one process per DP rank (the kit's ``dp2ep2.py`` recipe: ``VLLM_DP_RANK`` & co., an
``LLM(..., enable_expert_parallel=True)`` of the one-layer Qwen3-30B-A3B prefix, dummy weights,
eager, Triton attention). In each engine's worker it hooks the MoE block (forward pre/post hooks
opening a ``record_function`` range ``gpuest.moe_block#k``) and the router
(``set_capture_fn``: the step's logical top-k ids counted per expert inside a range
``gpuest.capture#k`` of its own, excluded from the block's time), then runs the step plan:
every step is one prefill of ``tokens[rank]`` tokens on each rank (one prompt, ``max_tokens=1``,
prefix caching off), the ranks released together by a barrier, the whole plan ``--reps`` times
under the PyTorch profiler. The worker parses its own Chrome trace
(``acquisition.engine_trace``: launch correlation) and the rank writes ``<routing>/rank<r>.json``:
per block forward the token count the block saw, the per-expert counts of its top-k ids, the
compute (kernels minus NCCL) and each NCCL kernel's duration.

``--routing simulator`` sets ``VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random`` before the
engine starts; ``native`` keeps the engine's own router (``FusedTopKRouter`` on the gate's
logits of dummy weights). The comparison with the estimate runs on CPU:
``python -m acquisition.estimate_validation`` (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "gpuest.moe_block"
CAPTURE = "gpuest.capture"
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


# ---- the step plan (generic over the DP size) ---------------------------------------------------


# DP1 (issue 18 part 3: a TP1 engine without EP): N from 1 to 2,000, dense where the kernel's
# block size changes (vLLM's tuned H200 E=128 file: 16 rows up to M=128, 32, 64, 128 from ~768),
# around the tables' points (2^k, 257) and between them, up to N = 2,048 (a table point).
TP1_TOKENS = (
    1, 2, 3, 4, 8, 16, 31, 64, 100, 128, 200, 256, 384, 512, 640, 777,
    1000, 1024, 1200, 1280, 1536, 1700, 1800, 2000, 2048,
)  # fmt: skip


def step_plan(dp: int) -> list[list[int]]:
    """Per-rank token counts of each step: equal steps, then unequal ones (alternating and ramps).

    Between 4 and 2048 tokens per rank (the engine's ``max_num_batched_tokens``); for DP > 2 the
    alternating patterns repeat over the ranks and the ramps spread between their ends. DP1 (one
    engine, no EP) steps through ``TP1_TOKENS``.
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    if dp == 1:
        return [[n] for n in TP1_TOKENS]

    def alt(a: int, b: int) -> list[int]:
        return [a if r % 2 == 0 else b for r in range(dp)]

    def ramp(a: int, b: int) -> list[int]:
        return [round(a + (b - a) * r / (dp - 1)) for r in range(dp)]

    plan = [[n] * dp for n in (4, 64, 256, 1024, 2048)]
    plan += [
        alt(4, 2048),
        alt(2048, 4),
        alt(16, 512),
        alt(512, 16),
        ramp(100, 1500),
        alt(777, 333),
        alt(2000, 37),
        alt(1536, 1024),
        ramp(1800, 50),
        alt(128, 1024),
    ]
    return plan


# ---- worker side (runs inside the engine's worker process through apply_model) -----------------


def _state(model: Any) -> dict[str, Any]:
    st = getattr(model, "_gpuest", None)
    if st is None:
        st = {"k": -1, "tokens": {}, "counts": {}, "topk_shape": {}, "prof": None}
        model._gpuest = st
    return st


def install(model: Any) -> dict[str, Any]:
    """Hook the MoE block and its router; return what the layer is (classes, EP rank, expert map)."""
    import torch

    block = runner = None
    block_name = ""
    for name, m in model.named_modules():
        if type(m).__name__ == "MoERunner":
            runner = m
            block_name = name.rsplit(".", 1)[0]
    if runner is None:
        raise RuntimeError("no MoERunner in the model")
    block = model.get_submodule(block_name)
    st = _state(model)
    mc = runner.moe_config
    experts = int(mc.num_experts)
    dev = next(model.parameters()).device

    def pre(_mod: Any, args: tuple[Any, ...]) -> None:
        st["k"] += 1
        k = st["k"]
        st["tokens"][k] = int(args[0].shape[0])
        rf = torch.profiler.record_function(f"{BLOCK}#{k}")
        rf.__enter__()
        st["rf"] = rf

    def post(_mod: Any, _args: tuple[Any, ...], _out: Any) -> None:
        rf = st.pop("rf", None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def capture(topk_ids: Any) -> None:
        k = st["k"]
        with torch.profiler.record_function(f"{CAPTURE}#{k}"):
            # scatter_add, not bincount: bincount reads the maximum back to the host (a sync
            # inside the block would move the ranks' arrival times).
            ids = topk_ids.reshape(-1).to(torch.int64)
            counts = torch.zeros(experts, dtype=torch.int64, device=ids.device)
            counts.scatter_add_(0, ids, torch.ones_like(ids))
            prev = st["counts"].get(k)
            st["counts"][k] = counts if prev is None else prev + counts
            st["topk_shape"][k] = list(topk_ids.shape)

    block.register_forward_pre_hook(pre)
    block.register_forward_hook(post)
    runner.router.set_capture_fn(capture)
    qm = getattr(runner, "_quant_method", None) or getattr(runner, "quant_method", None)
    mk = getattr(qm, "moe_kernel", None)
    emap = runner.expert_map
    return {
        "block": block_name,
        "block_class": type(block).__name__,
        "runner_class": type(runner).__name__,
        "router_class": type(runner.router).__name__,
        "quant_method": type(qm).__name__ if qm is not None else None,
        "prepare_finalize": type(getattr(mk, "prepare_finalize", None)).__name__,
        "experts_class": type(getattr(mk, "fused_experts", None)).__name__,
        "ep_size": mc.ep_size,
        "ep_rank": mc.ep_rank,
        "dp_size": mc.dp_size,
        "dp_rank": mc.dp_rank,
        "global_experts": experts,
        "local_experts": mc.num_local_experts,
        "top_k": int(runner.router.top_k),
        "expert_map": emap.tolist() if emap is not None else None,
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "uuid": str(torch.cuda.get_device_properties(dev).uuid) if dev.type == "cuda" else None,
    }


def start_profile(model: Any) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    st = _state(model)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    st["first"] = st["k"] + 1
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    prof.start()
    st["prof"] = prof
    return st["first"]


def stop_profile(model: Any, trace_path: str) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(ROOT))
    from acquisition.engine_trace import attribute_blocks

    st = _state(model)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    st["prof"].stop()
    st["prof"].export_chrome_trace(trace_path)
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    blocks = attribute_blocks(events, prefix=BLOCK, exclude_prefix=CAPTURE)
    out = []
    for b in blocks:
        rec = b.to_json()
        rec["tokens"] = st["tokens"].get(b.index)
        c = st["counts"].get(b.index)
        rec["expert_counts"] = c.tolist() if c is not None else None
        rec["topk_shape"] = st["topk_shape"].get(b.index)
        out.append(rec)
    return {"first_index": st["first"], "last_index": st["k"], "blocks": out}


# ---- the rank process ---------------------------------------------------------------------------


def rank_main(
    rank: int, dp: int, port: int, args: argparse.Namespace, model_dir: str, barrier: Any
) -> None:
    if dp > 1:  # DP1 is a plain TP1 engine: no data-parallel group, no expert parallelism
        os.environ.update(
            VLLM_DP_RANK=str(rank),
            VLLM_DP_RANK_LOCAL=str(rank),
            VLLM_DP_SIZE=str(dp),
            VLLM_DP_MASTER_IP="127.0.0.1",
            VLLM_DP_MASTER_PORT=str(port),
        )
    out_dir = Path(args.out) / _subdir(args)
    log: dict[str, Any] = {"rank": rank, "dp": dp, "routing": args.routing, "ok": False}
    try:
        import torch
        import vllm
        from vllm import LLM, SamplingParams

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import h200x2_estimate_validation as probe  # by reference: the worker imports it by name

        log["versions"] = {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
        log["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "VLLM_"))}
        t0 = time.time()
        llm = LLM(
            model=model_dir,
            load_format="dummy",
            hf_overrides={"num_hidden_layers": 1},
            enforce_eager=True,
            max_model_len=4096,
            max_num_batched_tokens=2048,
            max_num_seqs=128,
            skip_tokenizer_init=True,
            gpu_memory_utilization=0.3,
            generation_config="vllm",
            dtype="bfloat16",
            attention_backend="TRITON_ATTN",
            enable_expert_parallel=dp > 1,
            kv_cache_memory_bytes=1 << 30,
            enable_prefix_caching=False,
            seed=1234 + rank,
        )
        log["engine_start_s"] = round(time.time() - t0, 1)
        log["moe"] = llm.apply_model(probe.install)
        plan = step_plan(dp)
        log["plan"] = plan
        log["reps"] = args.reps
        sp = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
        rng = random.Random(991 + 17 * rank)

        def run_step(n: int) -> float:
            prompt = {"prompt_token_ids": [rng.randrange(1000, 150000) for _ in range(n)]}
            t = time.perf_counter()
            llm.generate([prompt], sp, use_tqdm=False)
            return time.perf_counter() - t

        for tokens in plan:  # warm-up: every shape once (Triton JIT, allocator), not profiled
            barrier.wait()
            run_step(tokens[rank])
        barrier.wait()
        log["first_profiled_index"] = llm.apply_model(probe.start_profile)
        walls = []
        for _rep in range(args.reps):
            for tokens in plan:
                barrier.wait()
                walls.append(round(run_step(tokens[rank]), 4))
        trace = f"/tmp/gpuest_trace_{args.routing}_rank{rank}.json"
        log["generate_s"] = walls
        res = llm.apply_model(_stop(trace))
        log.update(res[0] if isinstance(res, list) else res)
        log["ok"] = True
        if args.keep_trace:
            import gzip

            with (
                open(trace, "rb") as src,
                gzip.open(out_dir / f"trace_rank{rank}.json.gz", "wb") as dst,
            ):
                shutil.copyfileobj(src, dst)
    except BaseException:
        log["tb"] = traceback.format_exc()[-4000:]
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"rank{rank}.json", "w") as f:
        json.dump(log, f, indent=None, separators=(",", ":"), default=str)
    print(
        f"rank {rank} ok={log['ok']} blocks={len(log.get('blocks', []))} "
        f"{log.get('tb', '')[-1500:]}",
        flush=True,
    )


def _subdir(args: argparse.Namespace) -> str:
    """``simulator`` for the uniform strategy (as before); the strategy's name for another."""
    strategy = getattr(args, "strategy", "uniform_random")
    return args.routing if args.routing == "native" or strategy == "uniform_random" else strategy


def _stop(trace: str) -> Any:
    import functools

    import h200x2_estimate_validation as probe

    return functools.partial(probe.stop_profile, trace_path=trace)


def cmd_run(args: argparse.Namespace) -> int:
    import multiprocessing as mp

    for k, v in NCCL_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    if args.routing == "simulator":
        os.environ["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] = args.strategy
    else:
        os.environ.pop("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", None)
    # The engine's worker processes import this module (and acquisition.engine_trace) by name.
    extra = [str(Path(__file__).resolve().parent), str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        extra + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    sys.path[:0] = extra
    model_dir = tempfile.mkdtemp(prefix="gpuest-qwen3-")
    shutil.copy(
        ROOT / "acquisition/catalog/Qwen/Qwen3-30B-A3B-Instruct-2507/config.json", model_dir
    )
    (Path(args.out) / _subdir(args)).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.dp)
    t0 = time.time()
    procs = [
        ctx.Process(target=rank_main, args=(r, args.dp, args.port, args, model_dir, barrier))
        for r in range(args.dp)
    ]
    for p in procs:
        p.start()
    deadline = time.time() + args.timeout
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    print(f"{args.routing}: exit codes {codes} in {time.time() - t0:.1f} s", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure on the GPU machine")
    r.add_argument("--dp", type=int, default=2)
    r.add_argument("--routing", choices=("simulator", "native"), required=True)
    r.add_argument("--out", required=True)
    r.add_argument(
        "--strategy",
        default="uniform_random",
        help="simulator: VLLM_MOE_ROUTING_SIMULATION_STRATEGY (e.g. normal_routing; "
        "written under <out>/<strategy> unless uniform_random)",
    )
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--port", type=int, default=29571)
    r.add_argument("--timeout", type=float, default=420.0)
    r.add_argument(
        "--keep-trace", action="store_true", help="also write each rank's Chrome trace (gzip)"
    )
    sub.add_parser("plan", help="print the step plan for --dp").add_argument(
        "--dp", type=int, default=2
    )
    args = p.parse_args(argv)
    if args.cmd == "plan":
        print(json.dumps(step_plan(args.dp)))
        return 0
    return cmd_run(args)


if __name__ == "__main__":
    raise SystemExit(main())
