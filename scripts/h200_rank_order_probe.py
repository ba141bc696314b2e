"""Why DP2/EP2 rank 1's expert time is higher and bimodal (issue 19's rank-1 B/2B failures).

    python3 scripts/h200_rank_order_probe.py OUT.json [--forwards 120]

Run on the GPU machine with the kit staged and ``source .kit/bin/env.sh`` (from the device
copy's root). For the Qwen3-30B-A3B TP1/DP2/EP2 geometry (128 global experts, top-8, 64 local)
it builds the acquisition's own vllm-modular sessions for ranks 0 and 1 and, at a fixed list of
(N, A, M) points, times the same routing stimulus (``routing_stimulus``, the acquisition's
balanced histogram for that rank's expert map) two ways:

- ``modular``: the session's experts forward as a table is measured (vLLM 0.26.0's
  ``TritonExperts.apply``). It aligns blocks over all 128 global experts and marks the remote
  ones ``-1`` (``moe_align_block_size`` with ``ignore_invalid_experts=False``), so the expert
  kernel's grid holds zero-writing programs for every remote expert, in global expert order:
  after rank 0's local blocks, before rank 1's.
- ``functional``: vLLM's functional ``fused_experts`` on the same weights, inputs and expert
  map; it aligns with ``ignore_invalid_experts=True`` (remote pairs take no block at all), so
  the order of local and remote experts cannot matter.

If rank 1's excess over rank 0 is the block order, it shows in ``modular`` (in the
``fused_moe_kernel`` launches, not in the alignment or reduction kernels) and vanishes in
``functional``. Each variant runs ``--forwards`` forwards (weight bank 0, after 20 warm-up
forwards) inside one profiler session, each in its own range; the kernels are attributed to
their forward by launch correlation (``attribute_launches``, as the acquisition does), and the
output records per variant and point the forward totals (sorted: a bimodal point shows two
clusters), their median, and the median duration of each kernel launch position. Measures
nothing that is published; it is evidence for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
# (N, A, M): the rank-1 failures of session 6 (N = 33, 64/65, 97, 513), pairs across a block
# edge at A = 1, and heavier points where the excess was smaller.
POINTS = [
    (33, 1, 32), (33, 1, 33), (64, 1, 32), (64, 1, 33), (65, 4, 64), (97, 2, 32),
    (128, 4, 64), (513, 4, 32), (513, 32, 4096), (2048, 64, 8192), (4096, 64, 32768),
]  # fmt: skip


def _forwards(run: Any, count: int, sync: Any) -> list[list[tuple[str, float]]]:
    """``count`` forwards of ``run`` in one profiler session: per forward, its kernels in
    launch order as (name, microseconds)."""
    from acquisition.protocol.attribution import attribute_launches
    from acquisition.protocol.profiling import ProfilerCapture

    for _ in range(20):
        run()
    sync()
    capture = ProfilerCapture("cuda")
    with capture:
        for i in range(count):
            with capture.region(f"f{i}"):
                run()
        sync()
    window = capture.window()
    attribution = attribute_launches(window)  # raises if any kernel cannot be attributed
    assert attribution.unattributed_count == 0, attribution
    by_range: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    ranges = sorted(window.ranges, key=lambda r: r.start_ns)
    owner: dict[int, str] = {}
    for launch in window.launches:
        for r in ranges:
            if r.start_ns <= launch.start_ns <= r.end_ns:
                owner[launch.correlation] = r.name
                break
    for activity in window.activities:
        name = owner.get(activity.correlation)
        if name is not None:
            by_range[name].append((activity.start_ns, activity.name, activity.duration_ns / 1000.0))
    return [[(n, us) for _, n, us in sorted(by_range[f"f{i}"])] for i in range(count)]


def _summary(forwards: list[list[tuple[str, float]]]) -> dict[str, Any]:
    totals = sorted(sum(us for _, us in f) for f in forwards)
    positions: dict[str, list[float]] = defaultdict(list)
    for f in forwards:
        seen: dict[str, int] = defaultdict(int)
        for name, us in f:
            short = name.split("(")[0].split("<")[0][:60]
            seen[short] += 1
            positions[f"{short}#{seen[short]}"].append(us)
    return {
        "forwards": len(forwards),
        "median_us": statistics.median(totals),
        "p10_us": totals[len(totals) // 10],
        "p90_us": totals[(9 * len(totals)) // 10],
        "totals_us": [round(t, 3) for t in totals],
        "kernels_median_us": {k: statistics.median(v) for k, v in sorted(positions.items())},
    }


def _rank(rank: int, forwards: int, sync: Any) -> dict[str, Any]:
    """Both paths at every point for one rank's session (built as the acquisition builds it)."""
    import torch
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    from acquisition.protocol.stimulus import routing_stimulus
    from bench.modular_host_cost import _build

    session, _meter, plan = _build(argparse.Namespace(model=MODEL, dp=2, rank=rank))
    expert_map = torch.tensor(plan.expert_map, dtype=torch.int32, device="cuda")
    local = [g for g, e in enumerate(plan.expert_map) if e >= 0]
    w13, w2 = session.banks[0][0], session.banks[0][1]
    experts = session.global_experts
    rows: dict[str, Any] = {"local_experts": [local[0], local[-1]], "points": {}}

    def modular(p: Any) -> Any:
        return session.run_experts(p, 0)

    def functional(p: Any) -> Any:
        return fused_experts(
            p.hidden, w13, w2, p.topk_weights, p.topk_ids,
            global_num_experts=experts, expert_map=expert_map,
        )  # fmt: skip

    for n, a, m in POINTS:
        stimulus = routing_stimulus(
            plan.geometry, plan.expert_map, n, a, m, seed=n * 1_000_003 + a * 1009 + m
        )
        prepared = session.prepare_experts(stimulus)
        # The two paths compute the same thing: remote pairs contribute nothing either way.
        same = torch.allclose(
            modular(prepared).float(), functional(prepared).float(), rtol=2e-2, atol=2e-2
        )
        row = {
            "modular": _summary(_forwards(lambda p=prepared: modular(p), forwards, sync)),
            "functional": _summary(_forwards(lambda p=prepared: functional(p), forwards, sync)),
            "outputs_close": bool(same),
        }
        rows["points"][f"{n}:{a}:{m}"] = row
        print(
            f"rank {rank} N={n} A={a} M={m}: modular {row['modular']['median_us']:.1f} us, "
            f"functional {row['functional']['median_us']:.1f} us",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--forwards", type=int, default=120)
    args = parser.parse_args()

    import torch

    started = time.time()
    sync = torch.cuda.synchronize
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "command": f"python3 scripts/h200_rank_order_probe.py OUT.json --forwards {args.forwards}",
        "ranks": {},
    }
    for rank in (0, 1):
        result["ranks"][str(rank)] = _rank(rank, args.forwards, sync)
        torch.cuda.empty_cache()
    result["wall_s"] = round(time.time() - started, 1)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
