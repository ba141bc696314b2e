"""NCCL sweep of one host and the cluster description calibrated from it (issue 11 part 3, R45).

Two subcommands:

``run`` (on the GPU machine, torch only, no vLLM): one process per GPU, torch.distributed over
NCCL; for each collective (all_gather, reduce_scatter, all_reduce, broadcast, reduce) and each
per-rank message size (default 4 KiB to 256 MiB, powers of two) it launches ``--iters`` operations
back to back after ``--warmup`` untimed ones, under the PyTorch profiler, and keeps every NCCL
kernel's duration per rank. Back-to-back launches keep the ranks in step (no arrival skew); the
fit then takes, per iteration, the shortest rank's kernel (the last to arrive waits for nobody)
and the median over iterations. bf16 buffers, as the MoE block's hidden states.

    python3 scripts/h200x2_nccl_sweep.py run --nproc 2 --out $OUT/nccl_sweep.json

``fit`` (anywhere): the two-ended alpha-beta fit of ``moetables.calibration`` and the cluster
description YAML:

    python scripts/h200x2_nccl_sweep.py fit docs/evidence/h200x2-estimate/nccl_sweep.json \
        --name h200x2-nvlink --out clusters/h200x2-nvlink.yaml

Generic over the number of GPUs (``--nproc 4`` for a four-GPU host, issue 16).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce")
# The lent multi-GPU machines keep NVLink multicast off (vllm-kit README): every process keeps it.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "GLOO_SOCKET_IFNAME": "lo"}


def _sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, result_path: str) -> None:
    for k, v in NCCL_ENV.items():
        os.environ.setdefault(k, v)
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    cuda = not args.cpu_dry_run
    if cuda:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            device_id=dev,
        )
    else:  # the script's own CPU check: gloo collectives, CPU operator events instead of kernels
        dev = torch.device("cpu")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    # Barriers over gloo: an NCCL barrier is itself an all-reduce kernel inside the profiled window.
    cpu = dist.new_group(backend="gloo")

    def barrier() -> None:
        torch.cuda.synchronize()
        dist.barrier(group=cpu)

    dtype = torch.bfloat16
    esize = torch.tensor([], dtype=dtype).element_size()
    sizes = _sizes(args.min_bytes, args.max_bytes)
    biggest = sizes[-1] // esize
    # One pool of buffers at the largest size; each size uses views of it (no allocation per size).
    send = torch.ones(biggest * world, dtype=dtype, device=dev)
    recv = torch.empty(biggest * world, dtype=dtype, device=dev)

    def launch(op: str, n: int) -> None:
        if op == "all_gather":
            dist.all_gather_into_tensor(recv[: n * world], send[:n])
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(recv[:n], send[: n * world])
        elif op == "all_reduce":
            dist.all_reduce(send[:n])
        elif op == "broadcast":
            dist.broadcast(send[:n], src=0)
        elif op == "reduce":
            dist.reduce(send[:n], dst=0)
        else:  # pragma: no cover - guarded by argparse
            raise ValueError(op)

    points: list[dict[str, Any]] = []
    for op in args.ops:
        for nbytes in sizes:  # warm every size first: NCCL sets up its channels lazily
            for _ in range(args.warmup):
                launch(op, nbytes // esize)
        barrier()
        loop_us: list[float] = []
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for nbytes in sizes:
                n = nbytes // esize
                barrier()
                t_wall = time.perf_counter()
                if cuda:
                    start, end = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    start.record()
                for _ in range(args.iters):
                    launch(op, n)
                if cuda:
                    end.record()
                    torch.cuda.synchronize()
                    loop_us.append(start.elapsed_time(end) * 1e3 / args.iters)
                else:
                    loop_us.append((time.perf_counter() - t_wall) * 1e6 / args.iters)
        events = [e for e in prof.events() if _is_op_event(e, op, cuda)]
        timed = sorted(events, key=lambda e: e.time_range.start)
        # Each size: --iters kernels of the op, nothing else (barriers run over gloo).
        if len(timed) != len(sizes) * args.iters:
            names = sorted({e.name[:60] for e in prof.events()})[:40]
            raise RuntimeError(
                f"rank {rank} {op}: {len(timed)} timed events for {len(sizes)} sizes x "
                f"{args.iters} iterations; names seen: {names}"
            )
        for i, nbytes in enumerate(sizes):
            chunk = timed[i * args.iters : (i + 1) * args.iters]
            points.append(
                {
                    "op": op,
                    "bytes_per_rank": nbytes,
                    "size_bytes": nbytes * world
                    if op in ("all_gather", "reduce_scatter")
                    else nbytes,
                    "rank": rank,
                    "kernel_us": [round(e.time_range.elapsed_us(), 3) for e in chunk],
                    "kernel_name": chunk[0].name[:120],
                    "loop_event_us": round(loop_us[i], 3),
                }
            )
        if rank == 0:
            print(f"{op}: done ({len(sizes)} sizes)", flush=True)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, points, group=cpu)
    if rank == 0:
        merged = []
        for rec in gathered[0]:
            same = [
                next(
                    p
                    for p in gathered[r]
                    if p["op"] == rec["op"] and p["bytes_per_rank"] == rec["bytes_per_rank"]
                )
                for r in range(world)
            ]
            merged.append(
                {
                    "op": rec["op"],
                    "bytes_per_rank": rec["bytes_per_rank"],
                    "size_bytes": rec["size_bytes"],
                    "kernel_name": rec["kernel_name"],
                    "rank_times_us": [p["kernel_us"] for p in same],
                    "rank_loop_event_us": [p["loop_event_us"] for p in same],
                }
            )
        meta = {
            "gpu": torch.cuda.get_device_properties(0).name if cuda else "cpu (dry run)",
            "gpus": world,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()) if cuda else None,
            "python": platform.python_version(),
            "dtype": "bfloat16",
            "iters": args.iters,
            "warmup": args.warmup,
            "env": {k: os.environ.get(k) for k in sorted(os.environ) if k.startswith("NCCL_")},
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": "python3 " + " ".join(sys.argv),
            "timing": "torch.profiler CUDA kernel durations, per rank",
            "uuids": [str(torch.cuda.get_device_properties(i).uuid) for i in range(world)]
            if cuda
            else [],
        }
        with open(result_path, "w") as f:
            json.dump(
                {
                    "schema": "moe-nccl-sweep",
                    "version": 1,
                    "ranks": world,
                    "meta": meta,
                    "points": merged,
                },
                f,
                indent=1,
            )
    barrier()
    dist.destroy_process_group()


_C10D = {
    "all_gather": "c10d::_allgather_base_",
    "reduce_scatter": "c10d::_reduce_scatter_base_",
    "all_reduce": "c10d::allreduce_",
    "broadcast": "c10d::broadcast_",
    "reduce": "c10d::reduce_",
}


def _is_op_event(event: Any, op: str, cuda: bool) -> bool:
    """The profiler events that time one operation: its NCCL kernel, or (CPU dry run) its c10d op."""
    if not cuda:
        return event.name == _C10D[op]
    import torch

    # One op per profiled session and barriers over gloo: every NCCL kernel of the session is one
    # operation of that op (names vary: NCCL runs some op/type pairs through a generic kernel).
    return event.device_type == torch.autograd.DeviceType.CUDA and event.name.lower().startswith(
        "nccl"
    )


def cmd_run(args: argparse.Namespace) -> int:
    import torch.multiprocessing as mp

    for k, v in NCCL_ENV.items():
        os.environ.setdefault(k, v)
    t0 = time.time()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(args.nproc, args.port, args, args.out), nprocs=args.nproc, join=True)
    print(f"sweep written to {args.out} in {time.time() - t0:.1f} s", flush=True)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from moetables.calibration import (
        GroupedLaunch,
        cluster_document,
        dump_cluster,
        fit_group_op_us,
        fit_sweep,
        load_sweep,
    )

    sweep = load_sweep(args.sweep)
    fits = fit_sweep(
        sweep,
        large_min_bytes_per_rank=args.large_min,
        small_max_bytes_per_rank=args.small_max,
        table_min_share=args.table_min_share,
    )
    meta = sweep.meta
    group_op = None
    launches: list[GroupedLaunch] = []
    if args.group_evidence:
        from acquisition.estimate_validation import dispatch_launches

        launches = dispatch_launches(
            Path(args.group_evidence),
            args.group_routing,
            [int(w) for w in args.group_row_bytes.split(",")],
        )
        group_op = fit_group_op_us(fits, launches)
    provenance = {
        "hardware": f"{sweep.ranks} x {meta.get('gpu', '?')} of one host, NVLink"
        + (
            f" (GPU UUIDs {', '.join(u[:13] for u in meta.get('uuids', []))})"
            if meta.get("uuids")
            else ""
        ),
        "software": f"torch {meta.get('torch')}, CUDA {meta.get('cuda')}, NCCL {meta.get('nccl')}, "
        f"Python {meta.get('python')}; env {json.dumps(meta.get('env', {}), sort_keys=True)}",
        "command": f"{meta.get('command')} ; then: python scripts/h200x2_nccl_sweep.py fit {args.sweep} "
        f"--name {args.name} --large-min {args.large_min} --small-max {args.small_max} "
        f"--table-min-share {args.table_min_share}"
        + (
            f" --group-evidence {args.group_evidence} --group-routing {args.group_routing} "
            f"--group-row-bytes {args.group_row_bytes}"
            if args.group_evidence
            else ""
        ),
        "measured_at": str(meta.get("measured_at", ""))[:10],
    }
    doc = cluster_document(
        name=args.name,
        provenance=provenance,
        link=args.link,
        fits=fits,
        ranks=list(range(sweep.ranks)),
        description=(
            f"{sweep.ranks} GPUs of one host over {args.link}, calibrated from a measured NCCL sweep "
            f"({meta.get('dtype')} buffers, {min(p.bytes_per_rank for p in sweep.points)} B to "
            f"{max(p.bytes_per_rank for p in sweep.points)} B per rank, {meta.get('iters')} back-to-back "
            f"operations per size, profiler kernel times, per iteration the last-arriving rank's kernel, "
            f"median). Bandwidth: least squares on sizes >= {args.large_min} B per rank; alpha: the "
            f"mean of t - x/bandwidth on sizes <= {args.small_max} B per rank. bandwidth_by_size: the "
            f"effective bus bandwidth x/(t - alpha) at every measured size S from the first whose "
            f"bandwidth term is >= {args.table_min_share:.0%} of t (where the line misses NCCL's "
            f"protocol changes), read linearly in log2(S)."
            + (
                f" group_op_us: the median, per operation beyond the first, of what the engine's "
                f"grouped dispatch kernel (all_gather of hidden states, top-k weights and ids; "
                f"{len(launches)} equal-count steps of the {args.group_routing} run in "
                f"{args.group_evidence}) took beyond this model of its operations."
                if args.group_evidence
                else ""
            )
        ),
        group_op_us=group_op,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(dump_cluster(doc), encoding="utf-8")
    for op, fit in fits.items():
        loo = max((abs(m - t) / t for _, t, m in fit.loo_residuals), default=float("nan"))
        print(
            f"{op:15s} alpha {fit.alpha_us:8.2f} us  bus {fit.bus_bandwidth_GBps:8.1f} GB/s  "
            f"line max |err| {fit.max_relative_error * 100:5.1f} %  table leave-one-out max |err| {loo * 100:5.1f} %"
        )
    if group_op is not None:
        print(
            f"group_op_us {group_op:.3f} from {len(launches)} grouped dispatch kernels: "
            + ", ".join(
                f"{g.sizes_bytes[0] // (g.ranks * int(args.group_row_bytes.split(',')[0]))} rows {g.measured_us:.1f} us"
                for g in launches
            )
        )
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure (GPU machine)")
    r.add_argument("--nproc", type=int, default=2)
    r.add_argument("--out", required=True)
    r.add_argument("--min-bytes", type=int, default=4 << 10)
    r.add_argument("--max-bytes", type=int, default=256 << 20)
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--port", type=int, default=29561)
    r.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    r.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="gloo on CPU, operator events instead of kernels: checks the script, measures nothing useful",
    )
    f = sub.add_parser("fit", help="fit and write the cluster description")
    f.add_argument("sweep")
    f.add_argument("--name", required=True)
    f.add_argument("--link", default="nvlink")
    f.add_argument("--out", required=True)
    f.add_argument("--large-min", type=int, default=32 << 20)
    f.add_argument("--small-max", type=int, default=64 << 10)
    f.add_argument(
        "--table-min-share",
        type=float,
        default=0.2,
        help="bandwidth_by_size from the first size whose bandwidth term is at least this share of t",
    )
    f.add_argument(
        "--group-evidence",
        help="an engine evidence directory (with validation/<routing>/rank*.json): "
        "group_op_us from its equal-count grouped dispatch kernels",
    )
    f.add_argument(
        "--group-routing",
        default="native",
        help="which routing run (native: top-k ids int32, as the contract records)",
    )
    f.add_argument(
        "--group-row-bytes",
        default="4096,32,32",
        help="bytes per row of the dispatched tensors (the contract's hidden states, top-k weights, ids)",
    )
    args = p.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_fit(args)


if __name__ == "__main__":
    raise SystemExit(main())
