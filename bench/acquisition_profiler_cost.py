"""Where the time of one expert point goes on a GPU: forwards, profiler, event parsing.

    PYTHONPATH=. python3 bench/acquisition_profiler_cost.py

Uses the Qwen3-30B-A3B geometry at DP1 (128 local experts), the heaviest torch-reference
forward of the H200 plan, and prints milliseconds for each part.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from acquisition.adapters.torch_reference import TorchReferenceBackend
from acquisition.catalog import resolve_model
from acquisition.plan import PlanPoint
from acquisition.protocol.attribution import attribute_launches
from acquisition.protocol.measure import PointMeter, ProtocolSettings, context_order
from acquisition.protocol.profiling import ProfilerCapture
from acquisition.runtime import probe_runtime
from moetables.geometry import ExpertGeometry, MoeTarget


def timed(label: str, fn: Callable[[], object], repeat: int = 1) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / repeat * 1e3
    print(f"{label}: {ms:.1f} ms")
    return ms


def main() -> None:
    model = resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    target = MoeTarget.for_rank(1, 1, 0)
    runtime = probe_runtime("cuda")
    session = TorchReferenceBackend().build(model, target, runtime, "bfloat16")
    session.allocate_banks(4)
    geometry = ExpertGeometry.for_target(128, 8, target)
    meter = PointMeter(
        session,
        ProtocolSettings(rounds=3, iterations=3),
        geometry,
        session.expert_map_list,
        2,
        "cuda",
    )
    for point in (PlanPoint("experts", 256, 128, 2048), PlanPoint("experts", 16, 16, 128)):
        print(point.key)
        slots = meter._expert_slots(point)
        timed("  one forward, no profiler", lambda s=slots: session.run_experts(s[0], 0), 10)
        timed("  verify (8 forwards)", lambda p=point, s=slots: meter.verify(p, s))
        contexts = context_order(point, 3)
        capture = ProfilerCapture("cuda")
        start = time.perf_counter()
        with capture:
            for i in range(48):
                with capture.region(f"x.f{i}"):
                    session.run_experts(slots[i % 4], i % 4)
        print(
            f"  48 profiled forwards incl. start/stop: {(time.perf_counter() - start) * 1e3:.1f} ms"
        )
        start = time.perf_counter()
        events = capture._profile.profiler.kineto_results.events()
        print(f"  kineto events(): {len(events)} in {(time.perf_counter() - start) * 1e3:.1f} ms")
        start = time.perf_counter()
        window = capture.window()
        print(
            f"  window(): {(time.perf_counter() - start) * 1e3:.1f} ms; ranges {len(window.ranges)} "
            f"launches {len(window.launches)} activities {len(window.activities)} "
            f"operators {len(window.operators)}"
        )
        start = time.perf_counter()
        attribute_launches(window)
        print(f"  attribute: {(time.perf_counter() - start) * 1e3:.1f} ms")
        timed(
            "  measure() of the point (paused warmup)" if capture.can_pause else "  measure()",
            lambda p=point, c=contexts: meter.measure(p, c, verify=False),
        )
    # Which events does a CUDA-only profile keep?
    x = torch.randn(256, 256, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("acq:probe"):
            torch.mm(x, x)
        torch.cuda.synchronize()
    kinds = sorted(
        {
            (str(e.device_type()), e.is_user_annotation(), e.name()[:30])
            for e in prof.profiler.kineto_results.events()
        }
    )
    print("CUDA-only profile events:", kinds[:12])


if __name__ == "__main__":
    main()
