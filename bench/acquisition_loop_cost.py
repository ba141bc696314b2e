"""The measuring loop's own host cost on the CPU, without a GPU or vLLM (issue 19, fifth pass).

    PYTHONPATH=. python3 bench/acquisition_loop_cost.py [--heap 2000000] [--forwards 200000]

Two questions the device records cannot answer by themselves:

- ``loop``: what the PointMeter's own Python adds per forward around a session call that does
  nothing (``_Forward`` and the arm schedule; for a timed forward also the range name and the
  ``record_function`` range, with and without a CPU profiler session), against the leanest
  loop that could replace it (prebuilt names and calls, ``record_function`` entered directly);
- ``gc``: what the cyclic collector costs a batch's attribution (``attribute_launches`` over a
  synthetic window of 450 ranges of 7 launches and activities, the size of a factor-2 DP2 batch
  on the H200) when a large heap (``--heap`` items of three objects, standing in for torch,
  vLLM and a session) is live, with the heap as it is, frozen (``acquisition.acquire.frozen_heap``) and with the
  collector disabled.

Prints microseconds per forward and seconds per 160 batches (one DP2 target's batches).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from typing import Any


def loop_costs(count: int) -> dict[str, float]:
    import torch

    from acquisition.protocol.banks import ArmSchedule
    from acquisition.protocol.measure import _Forward, _range_name
    from acquisition.protocol.profiling import RANGE_PREFIX

    class Session:
        def run_experts(self, prepared: Any, bank: int) -> None:
            return None

    class Point:
        key = "experts:1:1:8"

    session = Session()
    slots = [(i % 4, object()) for i in range(28)]
    forward = _Forward(session, slots=slots)  # type: ignore[arg-type]
    arm = ArmSchedule("2B", 28, 28, 28)
    names = [RANGE_PREFIX + _range_name(3, Point, "2B", 1, j) for j in range(28)]  # type: ignore[arg-type]
    calls = [(session.run_experts, slots[i][1], slots[i][0]) for i in range(28)]
    record = torch.profiler.record_function

    @contextlib.contextmanager
    def region(name: str) -> Any:  # ProfilerCapture.region
        with record(RANGE_PREFIX + name):
            yield

    def warmup() -> None:
        for i in range(count):
            forward(arm, i % 28)

    def timed() -> None:
        for j in range(count):
            with region(_range_name(3, Point, "2B", 1, j % 28)):  # type: ignore[arg-type]
                forward(arm, 28 + j % 28)

    def lean_timed() -> None:
        for j in range(count):
            run, prepared, bank = calls[j % 28]
            with record(names[j % 28]):
                run(prepared, bank)

    found: dict[str, float] = {}
    for profiled in (False, True):
        session_cm: Any = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if profiled
            else contextlib.nullcontext()
        )
        with session_cm:
            for name, fn in (("warmup", warmup), ("timed", timed), ("lean_timed", lean_timed)):
                start = time.perf_counter()
                fn()
                found[f"{name}{'_profiled' if profiled else ''}_us"] = (
                    (time.perf_counter() - start) / count * 1e6
                )
    return found


def gc_costs(heap_objects: int, batches: int = 160, repeats: int = 5) -> dict[str, float]:
    from acquisition.acquire import frozen_heap
    from acquisition.protocol.attribution import (
        DeviceActivity,
        HostCall,
        ProfiledWindow,
        TimedRange,
        attribute_launches,
    )

    heap = [{"a": [i], "b": (i, str(i))} for i in range(heap_objects)]  # 3 tracked each
    gc.collect()
    tracked = len(gc.get_objects())

    def batch(ranges: int = 450, per: int = 7) -> Any:
        window, t, correlation = ProfiledWindow(), 0, 0
        for r in range(ranges):
            start = t
            for _ in range(per):
                correlation += 1
                window.launches.append(HostCall("cudaLaunchKernel", 1, t + 1, t + 2, correlation))
                window.activities.append(DeviceActivity("kernel", t + 5, 3000, correlation))
                t += 10
            window.ranges.append(TimedRange(f"{r}|p|B.r0.f{r}", 1, start, t))
            t += 10
        return attribute_launches(window)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(batches):
            batch()
        return time.perf_counter() - start

    # Alternating, best of ``repeats`` each: this machine's load sways single runs by 30 %.
    as_is, frozen, disabled = [], [], []
    full_collections = 0
    for _ in range(repeats):
        as_is.append(run())
        with frozen_heap() as stats:
            frozen.append(run())
        full_collections += stats.collections[2]
        gc.disable()
        try:
            disabled.append(run())
        finally:
            gc.enable()
    del heap
    return {
        "tracked_objects": float(tracked),
        "as_is_s": min(as_is),
        "frozen_s": min(frozen),
        "disabled_s": min(disabled),
        "frozen_full_collections": full_collections / repeats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heap", type=int, default=700_000, help="items of 3 objects each")
    parser.add_argument("--forwards", type=int, default=200_000)
    args = parser.parse_args(argv)
    loop = loop_costs(args.forwards)
    print("| loop (us a forward) | no profiler | CPU profiler session |")
    print("| --- | ---: | ---: |")
    for name in ("warmup", "timed", "lean_timed"):
        print(f"| {name} | {loop[f'{name}_us']:.2f} | {loop[f'{name}_profiled_us']:.2f} |")
    heap = gc_costs(args.heap)
    print()
    print(f"attribution of 160 batches, {heap['tracked_objects']:,.0f} tracked objects live "
          "(best of 5):")  # fmt: skip
    print(f"as is {heap['as_is_s']:.2f} s, frozen heap {heap['frozen_s']:.2f} s, "
          f"collector disabled {heap['disabled_s']:.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
