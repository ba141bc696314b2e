"""Where the host time of one vllm-modular experts forward goes, on the GPU host (issue 19).

    PYTHONPATH=. python3 bench/modular_host_cost.py [--model Qwen/Qwen3-30B-A3B-Instruct-2507]
        [--dp 1] [--rank 0] [--rows 1,16,256,2048] [--forwards 1000] [--json FILE]

The factor-2 acquisitions spend about 0.42 ms of host time per experts forward while its
kernels take 13-30 us at small N (docs/benchmarks.md, issue 19), so a run is bound by the
host. This measures, for the target's session built as the acquisition builds it and one plan
point per requested row count (the point's own routing stimulus):

- ``forward``: ``run_experts`` as a warmup forward calls it (wall per forward over
  ``--forwards`` calls, one device synchronisation at the end; the kernels are queued, so
  while the device keeps up this is host time);
- the steps of ``VllmModularSession._experts`` timed one by one over as many calls: the DP1
  no-op ``prepare``, ``moe_problem_size``, the kernel's ``_allocate_buffers`` (workspace
  manager), ``experts.apply`` (vLLM's TritonExperts) and ``finalize`` / the no-op reduction;
  and the forward with the workspace views of one call kept for the next
  (``forward_reusing_workspace``, a candidate saving), with ``reused_output_equal`` 1.0 when
  its output equals the native forward's bit for bit;
- ``profiled``: the forward inside the acquisition's own profiler session (CUDA activities,
  ``record_function`` ranges only, as ``ProfilerCapture`` records a timed forward), each in its
  range: the timed forward's host cost;
- ``held``: the forward inside ``hold_workspace``, as a measured context runs it since issue
  19's fifth pass (vLLM's workspace views requested once, not per forward), whether the
  build allowed it, and its output against the plain forward's (1.0: equal bit for bit);
- ``torch_empty``: one ``torch.empty`` on the device, a floor for one dispatcher call;
- cProfile of 200 forwards at the smallest and largest row counts: the functions with the most
  own time inside ``apply`` (cProfile slows Python calls, so shares, not absolute times).

Nothing here is part of an acquisition; it prints a Markdown table and writes the numbers as
JSON. CUDA only (a CPU run would time the fakes' arithmetic, not vLLM's launch path).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def _per_call_us(fn: Any, count: int, sync: Any) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    sync()
    return (time.perf_counter() - start) / count * 1e6


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from acquisition.adapters.base import EngineLimits
    from acquisition.adapters.vllm_modular_backend import VllmModularBackend
    from acquisition.cli import build_parser
    from acquisition.options import from_namespace
    from acquisition.options import prepare as prepare_options
    from acquisition.protocol.measure import PointMeter
    from acquisition.runtime import probe_runtime

    argv = [
        "slice", args.model, "--hardware", "H200", "--tp", "1", "--tp-refresh", "1",
        "--dp", str(args.dp), "--ranks", str(args.rank), "--max-num-batched-tokens", "2048",
        "--max-num-seqs", "128", "--moe-grid-factor", "2", "--moe-kernel-steps", "off",
        "--cudagraph-capture-sizes", "1,2,4,8,16,32,64,128,256",
        "--backend", "vllm-modular", "--out-root", "/tmp/modular-host-cost",
    ]  # fmt: skip
    request, plans = prepare_options(from_namespace(build_parser().parse_args(argv)), "")
    plan = next(p for p in plans if p.target.dp == args.dp and p.target.rank == args.rank)
    limits = EngineLimits(request.max_num_batched_tokens, request.max_num_seqs)
    runtime = replace(probe_runtime("cuda"), limits=limits)
    session = VllmModularBackend().build(request.model, plan.target, runtime, request.dtype)
    session.allocate_banks(2)
    meter = PointMeter(
        session, request.settings, plan.geometry, plan.expert_map, banks=2, device="cuda"
    )
    return session, meter, plan


def _steps(session: Any, prepared: Any, count: int, sync: Any) -> dict[str, float]:
    """``_experts``'s steps one by one, each over ``count`` calls (host us per call)."""
    from acquisition.adapters.vllm_modular_native import NO_DP_EP

    experts = session.experts
    w13, w2 = session.banks[0][0], session.banks[0][1]
    out = prepared.output
    native = session.choice.prepare_kind == NO_DP_EP
    found: dict[str, float] = {}
    if native:
        found["prepare"] = _per_call_us(lambda: session._prepare(prepared), count, sync)
        a1q = session._prepare(prepared)[0]
    else:
        a1q = prepared.hidden
    found["moe_problem_size"] = _per_call_us(
        lambda: experts.moe_problem_size(a1q, w13, w2, prepared.topk_ids), count, sync
    )
    _, tokens, n, k, top_k = experts.moe_problem_size(a1q, w13, w2, prepared.topk_ids)

    def buffers() -> Any:
        return session.kernel.impl._allocate_buffers(
            session.dtype, a1q.device, tokens, tokens, n, k, top_k, session.global_experts,
            session.local_experts, None, session.choice.activation,
        )  # fmt: skip

    found["allocate_buffers"] = _per_call_us(buffers, count, sync)
    ws13, ws2, _ = buffers()

    def apply() -> None:
        experts.apply(
            output=out, hidden_states=a1q, w1=w13, w2=w2, topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids, activation=session.choice.activation,
            global_num_experts=session.global_experts, expert_map=session.expert_map,
            a1q_scale=None, a2_scale=experts.a2_scale, workspace13=ws13, workspace2=ws2,
            expert_tokens_meta=None, apply_router_weight_on_input=False,
        )  # fmt: skip

    found["experts_apply"] = _per_call_us(apply, count, sync)

    def reused() -> None:
        # The forward with this row count's workspace views kept from one call to the next
        # (what a session could do while consecutive forwards ask for the same shapes).
        if native:
            session._prepare(prepared)
        apply()
        if native:
            session.prepare_finalize.finalize(
                out, out, prepared.topk_weights, prepared.topk_ids, False, session.reduction
            )
        else:
            session.reduction.apply(
                output=None, fused_expert_output=out, topk_weights=prepared.topk_weights,
                topk_ids=prepared.topk_ids, apply_router_weight_on_input=False,
            )  # fmt: skip

    found["forward_reusing_workspace"] = _per_call_us(reused, count, sync)
    # The same answer, bit for bit: the native forward's output against the reusing one's.
    native_out = session.run_experts(prepared, 0).clone()
    reused()
    found["reused_output_equal"] = float(bool((native_out == out).all()))
    if native:
        found["finalize"] = _per_call_us(
            lambda: session.prepare_finalize.finalize(
                out, out, prepared.topk_weights, prepared.topk_ids, False, session.reduction
            ),
            count,
            sync,
        )
    else:
        found["reduction"] = _per_call_us(
            lambda: session.reduction.apply(
                output=None, fused_expert_output=out, topk_weights=prepared.topk_weights,
                topk_ids=prepared.topk_ids, apply_router_weight_on_input=False,
            ),
            count,
            sync,
        )  # fmt: skip
    return found


def _held(session: Any, prepared: Any, count: int, sync: Any) -> dict[str, float]:
    """The forward as a measured context runs it now (issue 19): inside the session's
    ``hold_workspace``, which asks vLLM for the workspace views once per context. Host us per
    forward, whether the build allowed the hold, and its output against the plain forward's."""
    plain = session.run_experts(prepared, 0).clone()
    with session.hold_workspace():
        us = _per_call_us(lambda: session.run_experts(prepared, 0), count, sync)
        held = session.run_experts(prepared, 0).clone()
    return {
        "held_forward_us": us,
        "held_allowed": float(bool(session.workspace_views.get("held_per_context"))),
        "held_output_equal": float(bool((plain == held).all())),
    }


def _profiled(session: Any, prepared: Any, count: int) -> float:
    """Host us per forward inside the acquisition's profiler session, each in its range."""
    from acquisition.protocol.profiling import ProfilerCapture

    with ProfilerCapture("cuda") as capture:
        session.synchronize()
        start = time.perf_counter()
        for i in range(count):
            with capture.region(f"host-cost:{i}"):
                session.run_experts(prepared, 0)
        session.synchronize()
        elapsed = time.perf_counter() - start
    return elapsed / count * 1e6


def _top_functions(session: Any, prepared: Any, count: int = 200, top: int = 15) -> list[str]:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(count):
        session.run_experts(prepared, 0)
    session.synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue().splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B-Instruct-2507")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--rows", default="1,16,256,2048")
    parser.add_argument("--forwards", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("modular_host_cost: CUDA only", file=sys.stderr)
        return 2
    session, meter, plan = _build(args)
    sync = torch.cuda.synchronize
    wanted = [int(r) * args.dp for r in args.rows.split(",")]
    results: dict[str, Any] = {
        "model": args.model,
        "target": plan.target.deployment,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "forwards": args.forwards,
        "rows": {},
    }
    try:
        probe = torch.empty(1, device="cuda")
        results["torch_empty_us"] = _per_call_us(
            lambda: torch.empty(1, device=probe.device), args.forwards, sync
        )
        experts_points = [p for p in plan.points if p.is_expert]
        for rows in wanted:
            point = min(experts_points, key=lambda p: (abs(p.tokens - rows), p.key))
            prepared = session.prepare_experts(meter.stimulus(point))
            for _ in range(20):  # compile and warm this configuration
                session.run_experts(prepared, 0)
            entry: dict[str, Any] = {"point": point.key}
            entry["forward_us"] = _per_call_us(
                lambda p=prepared: session.run_experts(p, 0), args.forwards, sync
            )
            entry["steps_us"] = _steps(session, prepared, args.forwards, sync)
            entry["held"] = _held(session, prepared, args.forwards, sync)
            entry["profiled_forward_us"] = _profiled(session, prepared, args.forwards)
            if rows in (wanted[0], wanted[-1]):
                entry["cprofile_top"] = _top_functions(session, prepared)
            results["rows"][str(point.tokens)] = entry
    finally:
        session.close()
    lines = [
        f"{results['target']} of {args.model} on {results['device']}, torch {results['torch']}, "
        f"{args.forwards} calls each; torch.empty: {results['torch_empty_us']:.1f} us",
        "",
        "| point | forward us | held forward us (allowed, equal) | profiled us | "
        + " | ".join(next(iter(results["rows"].values()))["steps_us"])
        + " |",
        "| --- | ---: | ---: | ---: |"
        + " ---: |" * len(next(iter(results["rows"].values()))["steps_us"]),
    ]
    for entry in results["rows"].values():
        steps = " | ".join(f"{v:.1f}" for v in entry["steps_us"].values())
        held = entry["held"]
        lines.append(
            f"| {entry['point']} | {entry['forward_us']:.1f} | {held['held_forward_us']:.1f} "
            f"({held['held_allowed']:.0f}, {held['held_output_equal']:.0f}) | "
            f"{entry['profiled_forward_us']:.1f} | {steps} |"
        )
    for entry in results["rows"].values():
        if "cprofile_top" in entry:
            lines += ["", f"cProfile, {entry['point']} (200 forwards, by own time):", "```"]
            lines += entry["cprofile_top"]
            lines += ["```"]
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
